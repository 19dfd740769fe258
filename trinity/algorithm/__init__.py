"""Algorithm pieces (pure tensor functions, one signature per kind) and algorithm records.

Importing this package registers every built-in piece and algorithm.
"""

from trinity.algorithm.advantage import ADVANTAGE_FN
from trinity.algorithm.aggregation import LOSS_AGG_MODES, Aggregator
from trinity.algorithm.algorithms import (
    ALGORITHM,
    PAPERS,
    AlgorithmSpec,
    Paper,
    ResolvedAlgorithm,
    register_algorithm,
    resolve_algorithm,
)
from trinity.algorithm.entropy import ENTROPY_LOSS_FN, entropy_from_logits
from trinity.algorithm.kl import KL_LOSS_FN, KL_PENALTY_FN, kl_estimate
from trinity.algorithm.policy_loss import POLICY_LOSS_FN
from trinity.algorithm.sample_strategy import SAMPLE_STRATEGY

__all__ = [
    "ADVANTAGE_FN",
    "ALGORITHM",
    "ENTROPY_LOSS_FN",
    "KL_LOSS_FN",
    "KL_PENALTY_FN",
    "LOSS_AGG_MODES",
    "PAPERS",
    "POLICY_LOSS_FN",
    "SAMPLE_STRATEGY",
    "Aggregator",
    "AlgorithmSpec",
    "Paper",
    "ResolvedAlgorithm",
    "entropy_from_logits",
    "kl_estimate",
    "register_algorithm",
    "resolve_algorithm",
]
