"""Algorithm records, resolution against a user config, registry errors and the shared signatures."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from trinity.algorithm import (
    ADVANTAGE_FN,
    ALGORITHM,
    ENTROPY_LOSS_FN,
    KL_LOSS_FN,
    KL_PENALTY_FN,
    PAPERS,
    POLICY_LOSS_FN,
    SAMPLE_STRATEGY,
    Aggregator,
    AlgorithmSpec,
    resolve_algorithm,
)
from trinity.algorithm.inputs import AdvantageInput, PolicyLossInput, TokenFilter
from trinity.algorithm.sample_strategy import SampleContext
from trinity.common.experience import EID
from trinity.common.registry import RegistryError

FIELDS = [
    f"{p}{s}"
    for p in (
        "advantage_fn",
        "policy_loss_fn",
        "kl_loss_fn",
        "kl_penalty_fn",
        "entropy_loss_fn",
        "sample_strategy",
    )
    for s in ("", "_args")
]


def cfg(**kw: Any) -> SimpleNamespace:
    """Like config.algorithm: every attribute present, None = the algorithm's default."""
    return SimpleNamespace(**{"loss_agg_mode": None, **dict.fromkeys(FIELDS), **kw})


def test_grpo_defaults() -> None:
    r = resolve_algorithm(cfg(algorithm_type="grpo"))
    assert r.spec.name == "grpo"
    assert r.advantage_fn is ADVANTAGE_FN.get("grpo")
    assert r.policy_loss_fn is POLICY_LOSS_FN.get("ppo")
    assert r.kl_loss_fn is KL_LOSS_FN.get("k3") and r.kl_loss_fn_args == {"kl_coef": 0.001}
    assert r.kl_penalty_fn is KL_PENALTY_FN.get("none") and r.kl_penalty_fn_args == {}
    assert r.entropy_loss_fn is ENTROPY_LOSS_FN.get("default")
    assert r.sample_strategy is SAMPLE_STRATEGY.get("default")
    assert r.use_reference and r.spec.use_reference
    assert r.loss_agg_mode == "token-mean"


def test_user_args_merge_over_defaults() -> None:
    r = resolve_algorithm(
        cfg(
            algorithm_type="grpo",
            policy_loss_fn_args={"clip_range_high": 0.28},
            kl_loss_fn_args={"kl_coef": 0.05},
            advantage_fn_args={"std_normalize": False},
            loss_agg_mode="seq-mean-token-sum-norm",
        )
    )
    assert r.policy_loss_fn_args == {"clip_range": 0.2, "clip_range_high": 0.28}
    assert r.kl_loss_fn_args == {"kl_coef": 0.05}
    assert r.advantage_fn_args == {"epsilon": 1e-6, "std_normalize": False}
    assert r.loss_agg_mode == "seq-mean-token-sum-norm"
    assert ALGORITHM.get("grpo").default_args["kl_loss_fn_args"] == {
        "kl_coef": 0.001
    }  # not mutated


def test_use_reference_follows_final_kl_pieces() -> None:
    r = resolve_algorithm(cfg(algorithm_type="grpo", kl_loss_fn="none"))
    assert not r.use_reference and r.spec.kl_loss_fn == "none"
    assert r.kl_loss_fn_args == {}  # the spec's kl_coef belongs to the k3 piece it replaced
    r = resolve_algorithm(cfg(algorithm_type="reinforce", kl_penalty_fn="k2"))
    assert r.use_reference and r.spec.kl_penalty_fn == "k2"
    r = resolve_algorithm(
        cfg(algorithm_type="rloo", kl_loss_fn="low_var_kl", kl_loss_fn_args={"kl_coef": 0.1})
    )
    assert r.use_reference and r.kl_loss_fn_args == {"kl_coef": 0.1}


def test_sft_spec() -> None:
    r = resolve_algorithm(SimpleNamespace(algorithm_type="sft"))  # missing attributes = defaults
    assert r.advantage_fn is None and r.advantage_fn_args == {}
    assert r.policy_loss_fn is POLICY_LOSS_FN.get("sft")
    assert not r.use_reference and not r.spec.use_rollout


def test_algorithms_registered() -> None:
    assert {"grpo", "sft", "reinforce", "rloo"} <= set(ALGORITHM.names())
    assert ALGORITHM.get("reinforce").advantage_fn == "reinforce"
    assert ALGORITHM.get("rloo").policy_loss_fn == "ppo"


@pytest.mark.parametrize(
    ("registry", "some"),
    [
        (ADVANTAGE_FN, ["gae", "grpo", "opmd", "reinforceplusplus", "rloo", "step_wise_grpo"]),
        (POLICY_LOSS_FN, ["cispo", "gspo", "importance_sampling", "ppo", "sapo", "sft"]),
        (KL_LOSS_FN, ["abs", "abs+", "k1", "k2", "k3", "low_var_kl+", "mse", "none"]),
        (KL_PENALTY_FN, ["abs", "k1", "k3+", "none"]),
        (ENTROPY_LOSS_FN, ["default", "none"]),
        (SAMPLE_STRATEGY, ["default"]),
        (ALGORITHM, ["cispo", "grpo", "gspo", "rloo", "sapo", "sft"]),
    ],
)
def test_registry_miss_lists_valid_names(registry: Any, some: list[str]) -> None:
    """Every name, registered or lazily imported, sorted; the ones named here among them."""
    names = registry.names()
    assert set(some) <= set(names) and names == sorted(names)
    with pytest.raises(RegistryError, match=f"Valid names: {re.escape(', '.join(names))} "):
        registry.get("nope")


def test_resolve_errors() -> None:
    with pytest.raises(RegistryError, match=r"Did you mean 'g[rs]po'\?.*Valid names: .*grpo"):
        resolve_algorithm(cfg(algorithm_type="gpro"))
    with pytest.raises(RegistryError, match=r"Valid names: abs, abs\+, k1"):
        resolve_algorithm(cfg(algorithm_type="grpo", kl_loss_fn="k9"))
    with pytest.raises(TypeError, match="clip_rnage"):
        resolve_algorithm(cfg(algorithm_type="grpo", policy_loss_fn_args={"clip_rnage": 0.3}))
    with pytest.raises(ValueError, match="token-mean"):
        resolve_algorithm(cfg(algorithm_type="grpo", loss_agg_mode="mean"))
    with pytest.raises(ValueError, match="use_reference"):
        AlgorithmSpec(name="x", advantage_fn="grpo", policy_loss_fn="ppo", kl_loss_fn="k1")


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_paper_recipes_resolve(name: str) -> None:
    paper = PAPERS[name]
    assert paper.title and (paper.arxiv is None or paper.arxiv.count(".") == 1)
    r = resolve_algorithm(cfg(**{"algorithm_type": "grpo", **paper.config}))
    assert r.loss_agg_mode == paper.config.get("loss_agg_mode", "token-mean")


def test_every_piece_follows_its_kinds_signature() -> None:
    """The trainer calls every piece of a kind the same way; no name is special-cased."""
    b, t = 4, 4  # an even row count: DPO reads (chosen, rejected) pairs
    lp = -torch.rand(b, t, requires_grad=True)
    ref, mask, agg = -torch.rand(b, t), torch.rand(b, t) > 0.3, Aggregator("token-mean")
    for name in ADVANTAGE_FN:
        inp = AdvantageInput.from_outcomes(
            torch.rand(b), torch.tensor([0, 0, 1, 1]), mask,
            values=torch.rand(b, t), logprob=lp.detach(), ref_logprob=ref, baselines=torch.rand(b),
            entropy=torch.rand(b, t), nec=torch.rand(b, t),
        )  # fmt: skip
        adv, ret, *rest = ADVANTAGE_FN.get(name)(inp)
        assert adv.shape == ret.shape == (b, t)
        # a third element only from a fn that drops tokens: a TokenFilter of the same shape
        assert rest == [] or (isinstance(rest[0], TokenFilter) and rest[0].keep.shape == (b, t))
    for name in POLICY_LOSS_FN:
        inp = PolicyLossInput(
            lp, lp.detach(), torch.randn(b, t), mask, -torch.rand(b, t), ref,
            expert_mask=torch.tensor([False, True, False, True]),
        )  # fmt: skip
        loss, m = POLICY_LOSS_FN.get(name)(inp, agg=agg)
        assert loss.shape == () and all(isinstance(v, float) for v in m.values())
    for name in KL_LOSS_FN:
        loss, m = KL_LOSS_FN.get(name)(lp, ref, mask, agg=agg)
        assert loss.shape == () and all(isinstance(v, float) for v in m.values())
    for name in KL_PENALTY_FN:
        shaped, _ = KL_PENALTY_FN.get(name)(torch.zeros(b, t), lp.detach(), ref, mask)
        assert shaped.shape == (b, t)
    for name in ENTROPY_LOSS_FN:
        loss, _ = ENTROPY_LOSS_FN.get(name)(torch.rand(b, t), mask, agg=agg)
        assert loss.shape == ()
    # two experiences of different tasks (RAFT's best_of_group keeps each task's best)
    items = [
        SimpleNamespace(eid=EID(task=0), reward=1.0),
        SimpleNamespace(eid=EID(task=1), reward=None),
    ]
    ctx = SampleContext(step=1, auxiliary={"sft_dataset": lambda n: []})
    for name in SAMPLE_STRATEGY:
        out = SAMPLE_STRATEGY.get(name)(items, ctx)
        assert out == items and out is not items
