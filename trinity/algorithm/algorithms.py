"""Algorithms as frozen records of named pieces, and their resolution against a user's config.

An algorithm (`algorithm.algorithm_type`) names its advantage fn, policy loss, KL loss, KL penalty,
entropy loss and sample strategy, plus needs-flags (reference model, critic, rollouts). A new
algorithm is a new `AlgorithmSpec` registered in `ALGORITHM`, not a new code path.

`resolve_algorithm(config.algorithm)` overlays the user's choices on the spec: a piece name of None
keeps the spec's; `*_args` are merged over the spec's `default_args` for that piece (only while the
user keeps the spec's piece — a different piece starts from its own function defaults); every
argument name is checked against the function's signature so a typo fails before training starts.

Config: ``algorithm: {algorithm_type: grpo, kl_loss_fn_args: {kl_coef: 0.01}}``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from trinity.algorithm.advantage import ADVANTAGE_FN
from trinity.algorithm.aggregation import check_loss_agg_mode
from trinity.algorithm.entropy import ENTROPY_LOSS_FN
from trinity.algorithm.kl import KL_LOSS_FN, KL_PENALTY_FN
from trinity.algorithm.papers import PAPERS, Paper
from trinity.algorithm.policy_loss import POLICY_LOSS_FN
from trinity.algorithm.sample_strategy import SAMPLE_STRATEGY
from trinity.common.registry import Registry, keyword_names

__all__ = [
    "ALGORITHM",
    "PAPERS",
    "PIECES",
    "AlgorithmSpec",
    "Paper",
    "ResolvedAlgorithm",
    "resolve_algorithm",
]

# piece name → (registry, number of leading positional arguments fixed by the kind's signature)
PIECES: dict[str, tuple[Registry, int]] = {
    "advantage_fn": (ADVANTAGE_FN, 1),
    "policy_loss_fn": (POLICY_LOSS_FN, 1),
    "kl_loss_fn": (KL_LOSS_FN, 3),
    "kl_penalty_fn": (KL_PENALTY_FN, 4),
    "entropy_loss_fn": (ENTROPY_LOSS_FN, 2),
    "sample_strategy": (SAMPLE_STRATEGY, 1),
}


@dataclass(frozen=True)
class AlgorithmSpec:
    """A named algorithm: its pieces (registry names) and what it needs from the trainer.

    `default_args` maps ``"<piece>_args"`` (e.g. ``"kl_loss_fn_args"``) to that piece's default
    arguments. `loss_agg_mode` is the default `algorithm.loss_agg_mode`.
    """

    name: str
    advantage_fn: str | None  # None: no advantage (SFT)
    policy_loss_fn: str
    kl_loss_fn: str = "none"
    kl_penalty_fn: str = "none"
    entropy_loss_fn: str = "none"
    sample_strategy: str = "default"
    use_reference: bool = False  # a frozen reference model; required when a KL fn is not "none"
    use_critic: bool = False
    use_rollout: bool = True  # False: consumes an offline dataset (SFT)
    pairwise: bool = False  # rows come in (chosen, rejected) pairs, kept adjacent (DPO)
    filter_groups: bool = False  # the explorer drops all-equal groups and refills (DAPO)
    overlong_penalty: bool = False  # soft overlong punishment on the reward (DAPO)
    greedy_baseline: bool = False  # the explorer scores a greedy answer per task (ReMax)
    # the reference model is explorer.auxiliary_models[0] (a teacher), not the start model
    teacher_from_auxiliary: bool = False
    compute_advantage_in_trainer: bool = True
    default_args: dict = field(default_factory=dict)
    loss_agg_mode: str = "token-mean"

    def __post_init__(self) -> None:
        valid = {f"{p}_args" for p in PIECES}
        unknown = sorted(set(self.default_args) - valid)
        if unknown:
            raise ValueError(
                f"{self.name}: unknown default_args keys {unknown}; valid: {sorted(valid)}"
            )
        if (self.kl_loss_fn != "none" or self.kl_penalty_fn != "none") and not self.use_reference:
            raise ValueError(f"{self.name}: a KL loss or penalty needs use_reference=True")
        check_loss_agg_mode(self.loss_agg_mode)


ALGORITHM: Registry[AlgorithmSpec] = Registry("algorithm_type")


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Registers `spec` under `spec.name` and returns it."""
    return ALGORITHM.register(spec.name)(spec)


def _group_relative(
    name: str,
    policy_loss_fn: str,
    kl_loss_fn: str,
    loss_agg_mode: str = "token-mean",
    policy_loss_fn_args: dict | None = None,
    advantage_fn: str = "grpo",
    advantage_fn_args: dict | None = None,
) -> AlgorithmSpec:
    """A record on a group advantage (GRPO's by default) with a reference model's KL loss at
    β = 0.001."""
    return register_algorithm(
        AlgorithmSpec(
            name=name,
            advantage_fn=advantage_fn,
            policy_loss_fn=policy_loss_fn,
            kl_loss_fn=kl_loss_fn,
            entropy_loss_fn="default",
            use_reference=True,
            default_args={
                "advantage_fn_args": advantage_fn_args or {"epsilon": 1e-6, "std_normalize": True},
                **({"policy_loss_fn_args": policy_loss_fn_args} if policy_loss_fn_args else {}),
                "kl_loss_fn_args": {"kl_coef": 0.001},
                "entropy_loss_fn_args": {"entropy_coef": 0.0},
            },
            loss_agg_mode=loss_agg_mode,
        )
    )


# GRPO (arXiv:2402.03300) regularises with the k3 estimator as a loss term, not a reward penalty.
# β defaults to 0.001 (verl's and Trinity-RFT's default); the paper's 0.04 is in PAPERS["grpo"].
GRPO = _group_relative("grpo", "ppo", "k3", policy_loss_fn_args={"clip_range": 0.2})
# GSPO, CISPO and SAPO: GRPO's advantage with another policy loss and, as Trinity-RFT's records,
# a k2 KL loss. The GSPO and SAPO objectives average per sequence, CISPO's per token.
GSPO = _group_relative("gspo", "gspo", "k2", "seq-mean-token-mean")
CISPO = _group_relative("cispo", "cispo", "k2", "token-mean")
SAPO = _group_relative("sapo", "sapo", "k2", "seq-mean-token-mean")
# REC (arXiv:2509.24203): the group-mean baseline without std normalisation, REC's masked
# REINFORCE loss and, as Trinity-RFT's record, a k2 KL loss.
REC = _group_relative(
    "rec", "rec", "k2", advantage_fn="rec",
    advantage_fn_args={"epsilon": 1e-6, "std_normalize": False},
)  # fmt: skip
SFT = register_algorithm(
    AlgorithmSpec(
        name="sft",
        advantage_fn=None,
        policy_loss_fn="sft",
        use_rollout=False,
        compute_advantage_in_trainer=False,
    )
)
REINFORCE = register_algorithm(
    AlgorithmSpec(
        name="reinforce",
        advantage_fn="reinforce",
        policy_loss_fn="ppo",
        entropy_loss_fn="default",
        default_args={
            "advantage_fn_args": {"baseline": "none"},
            "policy_loss_fn_args": {"clip_range": 0.2},
            "entropy_loss_fn_args": {"entropy_coef": 0.0},
        },
    )
)
RLOO = register_algorithm(
    AlgorithmSpec(
        name="rloo",
        advantage_fn="rloo",
        policy_loss_fn="ppo",
        entropy_loss_fn="default",
        default_args={
            "policy_loss_fn_args": {"clip_range": 0.2},
            "entropy_loss_fn_args": {"entropy_coef": 0.0},
        },
    )
)


# PPO with a critic (arXiv:1707.06347, as verl and Trinity-RFT): GAE (γ = λ = 1) on the critic's
# values, PPO's clip, a k2 KL loss against the start model (β 0.001, Trinity-RFT's record).
PPO = register_algorithm(
    AlgorithmSpec(
        name="ppo",
        advantage_fn="gae",
        policy_loss_fn="ppo",
        kl_loss_fn="k2",
        entropy_loss_fn="default",
        use_reference=True,
        use_critic=True,
        default_args={
            "advantage_fn_args": {"gamma": 1.0, "lam": 1.0},
            "policy_loss_fn_args": {"clip_range": 0.2},
            "kl_loss_fn_args": {"kl_coef": 0.001},
            "entropy_loss_fn_args": {"entropy_coef": 0.0},
        },
    )
)
# DAPO (arXiv:2503.14476): GRPO's advantage, the decoupled clip ε_low 0.2 / ε_high 0.28, no KL,
# token-mean over the batch, dynamic sampling (algorithm.filter_groups) and the soft overlong
# punishment (algorithm.overlong_penalty).
DAPO = register_algorithm(
    AlgorithmSpec(
        name="dapo",
        advantage_fn="grpo",
        policy_loss_fn="ppo",
        entropy_loss_fn="default",
        default_args={
            "advantage_fn_args": {"epsilon": 1e-6, "std_normalize": True},
            "policy_loss_fn_args": {"clip_range_low": 0.2, "clip_range_high": 0.28},
            "entropy_loss_fn_args": {"entropy_coef": 0.0},
        },
        loss_agg_mode="token-mean",
        filter_groups=True,
        overlong_penalty=True,
    )
)
# REINFORCE++ (arXiv:2501.03262): discounted token returns with the per-token k1 KL penalty in the
# reward (β 0.01), whitened over the batch; PPO's clip 0.2.
REINFORCE_PLUS_PLUS = register_algorithm(
    AlgorithmSpec(
        name="reinforceplusplus",
        advantage_fn="reinforceplusplus",
        policy_loss_fn="ppo",
        kl_penalty_fn="k1",
        entropy_loss_fn="default",
        use_reference=True,
        default_args={
            "advantage_fn_args": {"gamma": 1.0},
            "policy_loss_fn_args": {"clip_range": 0.2},
            "kl_penalty_fn_args": {"kl_coef": 0.01},
            "entropy_loss_fn_args": {"entropy_coef": 0.0},
        },
    )
)
# Trinity-RFT's records: OPMD and TOPR keep its k2 KL loss (β 0.001); sPPO has none.
OPMD = register_algorithm(
    AlgorithmSpec(
        name="opmd",
        advantage_fn="opmd",
        policy_loss_fn="opmd",
        kl_loss_fn="k2",
        entropy_loss_fn="default",
        use_reference=True,
        default_args={
            "advantage_fn_args": {"opmd_baseline": "mean", "tau": 1.0},
            "policy_loss_fn_args": {"tau": 1.0},
            "kl_loss_fn_args": {"kl_coef": 0.001},
            "entropy_loss_fn_args": {"entropy_coef": 0.0},
        },
    )
)
# ReMax (arXiv:2310.10505): REINFORCE with each task's greedy answer's reward as the baseline
# (the explorer answers each task once more, greedily), one sample per task, no KL.
REMAX = register_algorithm(
    AlgorithmSpec(
        name="remax",
        advantage_fn="remax",
        policy_loss_fn="ppo",
        entropy_loss_fn="default",
        greedy_baseline=True,
        default_args={
            "policy_loss_fn_args": {"clip_range": 0.2},
            "entropy_loss_fn_args": {"entropy_coef": 0.0},
        },
    )
)
# On-policy distillation (Agarwal et al. arXiv:2306.13649; Thinking Machines 2025): the student
# samples, the teacher (explorer.auxiliary_models[0], scored by the trainer) gives per-token
# reverse-KL advantages, trained with the importance-sampling loss.
ON_POLICY_DISTILL = register_algorithm(
    AlgorithmSpec(
        name="on_policy_distill",
        advantage_fn="on_policy_distill",
        policy_loss_fn="importance_sampling",
        use_reference=True,
        teacher_from_auxiliary=True,
        default_args={"advantage_fn_args": {"kl_coef": 1.0}},
    )
)
# AsymRE (arXiv:2506.20520): REINFORCE (OPMD's loss at tau 0) on the group mean shifted by δ = -0.1,
# no KL; Trinity-RFT's record keeps opmd's tau 1, which halves the loss.
ASYMRE = register_algorithm(
    AlgorithmSpec(
        name="asymre",
        advantage_fn="asymre",
        policy_loss_fn="opmd",
        default_args={
            "advantage_fn_args": {"baseline_shift": -0.1},
            "policy_loss_fn_args": {"tau": 0.0},
        },
    )
)
SPPO = register_algorithm(
    AlgorithmSpec(
        name="sppo",
        advantage_fn="opmd",
        policy_loss_fn="sppo",
        default_args={"policy_loss_fn_args": {"epsilon": 0.3}},
    )
)
TOPR = register_algorithm(
    AlgorithmSpec(
        name="topr",
        advantage_fn="reinforce",
        policy_loss_fn="topr",
        kl_loss_fn="k2",
        entropy_loss_fn="default",
        use_reference=True,
        default_args={
            "policy_loss_fn_args": {"advantage_threshold": 0.0},
            "kl_loss_fn_args": {"kl_coef": 0.001},
            "entropy_loss_fn_args": {"entropy_coef": 0.0},
        },
    )
)
# GPG (arXiv:2504.02546): group-centred advantage rescaled by N/M, plain REINFORCE, no KL.
GPG = register_algorithm(AlgorithmSpec(name="gpg", advantage_fn="gpg", policy_loss_fn="reinforce"))
# Multi-turn GRPO: an episode's last-turn reward, GRPO-normalised, on every turn (Trinity-RFT's
# multi_step_grpo).
MULTI_STEP_GRPO = _group_relative(
    "multi_step_grpo", "ppo", "k2", policy_loss_fn_args={"clip_range": 0.2},
    advantage_fn="step_wise_grpo", advantage_fn_args={"epsilon": 1e-6},
)  # fmt: skip
# RAFT (arXiv:2304.06767): SFT on each task's best-rewarded rollout.
RAFT = register_algorithm(
    AlgorithmSpec(
        name="raft",
        advantage_fn=None,
        policy_loss_fn="sft",
        sample_strategy="best_of_group",
        compute_advantage_in_trainer=False,
    )
)
# DPO (arXiv:2305.18290) on offline (chosen, rejected) pairs against the frozen start model.
DPO = register_algorithm(
    AlgorithmSpec(
        name="dpo",
        advantage_fn=None,
        policy_loss_fn="dpo",
        use_reference=True,
        use_rollout=False,
        pairwise=True,
        compute_advantage_in_trainer=False,
        default_args={"policy_loss_fn_args": {"beta": 0.1, "label_smoothing": 0.0}},
    )
)

# Mixed SFT + RL (Trinity-RFT's mix, after LUFFY arXiv:2504.14945; CHORD arXiv:2508.11408):
# rollouts with GRPO's advantage plus expert rows from an auxiliary SFT buffer, one loss each.
MIX = register_algorithm(
    AlgorithmSpec(
        name="mix",
        advantage_fn="grpo",
        policy_loss_fn="mix",
        sample_strategy="mix",
        entropy_loss_fn="mix",
        default_args={
            "policy_loss_fn_args": {"mu": 0.1, "clip_range": 0.2},
            "sample_strategy_args": {"expert_data_ratio": 0.5, "sft_dataset_name": "sft_dataset"},
            "entropy_loss_fn_args": {"entropy_coef": 0.0},
        },
    )
)
MIX_CHORD = register_algorithm(
    dataclasses.replace(
        MIX,
        name="mix_chord",
        policy_loss_fn="mix_chord",
        default_args={
            **MIX.default_args,
            "policy_loss_fn_args": {"mu_warmup_steps": 0, "mu_decay_steps": 0, "mu_peak": 0.1,
                                    "mu_valley": 0.1, "enable_phi_function": True,
                                    "clip_range": 0.2},
        },
    )
)  # fmt: skip

# Trinity-RFT algorithm names refused until what they need is built (validate and run say why).
NOT_BUILT: dict[str, str] = {
    "jsd": "the jsd advantage is not built yet",
}
# Trinity-RFT's deprecated names of records we have
ALIASES: dict[str, str] = {"grpo_verl": "grpo", "opmd_verl": "opmd"}
# the records this package registers (a plugin's come later, and cannot take these names)
SHIPPED: frozenset[str] = frozenset(ALGORITHM.names())
SWITCHABLE_OFF = ("kl_loss_fn", "kl_penalty_fn")  # the pieces a config commonly sets to "none"


def shipped_defaults(algorithm_config: Any, auxiliary: Iterable[str] = ()) -> bool:
    """Whether `algorithm_config` runs a shipped record as shipped: each piece the record's own,
    or "none" for a KL piece (`SWITCHABLE_OFF`, β 0), no `<piece>_args` of its own, the record's
    `loss_agg_mode`, the default sample strategy (another reads auxiliary buffers, which the
    dry run checks: `mix` without its `sft_dataset`) and no auxiliary buffers.

    The value dry run (`value_problems`) of every such config passes (tests/
    test_algorithm_dry_run.py runs each one), so the pre-flight pass has nothing to find there
    and skips it, and with it torch's import (about a second of every `trinity run`'s start,
    before Ray may start)."""
    name = getattr(algorithm_config, "algorithm_type", None)
    name = ALIASES.get(name, name)
    if name not in SHIPPED or list(auxiliary):
        return False
    spec = ALGORITHM.get(name)
    if spec.sample_strategy != "default":
        return False
    if getattr(algorithm_config, "loss_agg_mode", None) not in (None, spec.loss_agg_mode):
        return False
    for piece in PIECES:
        if getattr(algorithm_config, f"{piece}_args", None):
            return False
        chosen = getattr(algorithm_config, piece, None)
        if chosen is None or chosen == getattr(spec, piece):
            continue
        if not (piece in SWITCHABLE_OFF and chosen == "none"):
            return False
    return True


def lookup_algorithm(name: str) -> AlgorithmSpec:
    """The record named `name` (an alias resolved); a NOT_BUILT name raises LookupError saying
    what is missing; an unknown one the registry's error listing the valid names."""
    if name in NOT_BUILT:
        raise LookupError(f"algorithm_type {name!r} is not built yet: {NOT_BUILT[name]}")
    return ALGORITHM.get(ALIASES.get(name, name))


def record_flag(algorithm_config: Any, flag: str) -> bool:
    """A record's switch (`filter_groups`, `overlong_penalty`) as the config sets it: the
    section's `enable` when given, else the record's default."""
    section = getattr(algorithm_config, flag)
    if section.enable is not None:
        return bool(section.enable)
    return bool(getattr(lookup_algorithm(algorithm_config.algorithm_type), flag))


def known_algorithm(name: str) -> AlgorithmSpec | None:
    """The registered record `name` names (an alias resolved); None for any other name (the
    pre-flight pass reports those)."""
    name = ALIASES.get(name, name)
    return ALGORITHM.get(name) if name in ALGORITHM.names() else None


def is_pairwise(name: str) -> bool:
    """The record `name` trains on (chosen, rejected) pairs; False for unknown names."""
    return getattr(known_algorithm(name), "pairwise", False)


@dataclass(frozen=True)
class ResolvedAlgorithm:
    """What the trainer uses: the effective spec, the callables and their merged arguments.

    `spec` carries the FINAL piece names (user overrides applied) and the recomputed
    `use_reference`; `advantage_fn` is None when the algorithm has no advantage (SFT).
    """

    spec: AlgorithmSpec
    advantage_fn: Callable[..., Any] | None
    advantage_fn_args: dict[str, Any]
    policy_loss_fn: Callable[..., Any]
    policy_loss_fn_args: dict[str, Any]
    kl_loss_fn: Callable[..., Any]
    kl_loss_fn_args: dict[str, Any]
    kl_penalty_fn: Callable[..., Any]
    kl_penalty_fn_args: dict[str, Any]
    entropy_loss_fn: Callable[..., Any]
    entropy_loss_fn_args: dict[str, Any]
    sample_strategy: Callable[..., Any]
    sample_strategy_args: dict[str, Any]
    use_reference: bool
    loss_agg_mode: str

    def summary(self) -> dict[str, Any]:
        """Piece names and arguments, for the start-up table and logs."""
        out: dict[str, Any] = {"algorithm_type": self.spec.name}
        for piece in PIECES:
            out[piece] = getattr(self.spec, piece)
            out[f"{piece}_args"] = dict(getattr(self, f"{piece}_args"))
        out["loss_agg_mode"] = self.loss_agg_mode
        out["use_reference"] = self.use_reference
        return out


def accepted_args(piece: str, fn: Callable[..., Any]) -> set[str] | None:
    """The `<piece>_args` names `fn` accepts as keywords; None when it takes `**kwargs`."""
    return keyword_names(fn, PIECES[piece][1], skip=("agg",))


def _check_args(piece: str, name: str, fn: Callable[..., Any], args: dict[str, Any]) -> None:
    """Raises TypeError if `fn` does not accept every key of `args` as a keyword."""
    accepted = accepted_args(piece, fn)
    unknown = [] if accepted is None else sorted(set(args) - accepted)
    if unknown:
        raise TypeError(
            f"{piece} {name!r} got unknown {piece}_args {unknown}; it accepts {sorted(accepted)}"
        )


def chosen_pieces(
    algorithm_config: Any, base: AlgorithmSpec
) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
    """(piece, name, args) of each piece of `PIECES` as `algorithm_config` chooses it over the
    spec `base`: the user's name, else the spec's (None: no such piece; `advantage_fn: none` is
    None); the spec's default args while its piece is kept, updated with the user's."""
    for piece in PIECES:
        default_name = getattr(base, piece)
        user_name = getattr(algorithm_config, piece, None)
        name = default_name if user_name is None else user_name
        if piece == "advantage_fn" and name == "none":
            name = None
        args = dict(base.default_args.get(f"{piece}_args", {})) if name == default_name else {}
        args.update(getattr(algorithm_config, f"{piece}_args", None) or {})
        yield piece, name, args


def resolve_algorithm(algorithm_config: Any) -> ResolvedAlgorithm:
    """Resolves `algorithm_config` (an object with `algorithm_type`, `<piece>`, `<piece>_args` for
    each of `PIECES`, and `loss_agg_mode`; None or a missing attribute = the spec's default).

    1. look up the spec by `algorithm_type` (unknown → the registry's error listing valid names)
    2. per piece: final name = user's or spec's; args = spec defaults (if the piece is kept) | user's
    3. look up each callable (unknown → registry error) and check its argument names
    4. `use_reference` from the final KL pieces (or the spec's flag); `loss_agg_mode` validated
    """
    # 1.
    algo_type = getattr(algorithm_config, "algorithm_type", None)
    if algo_type is None:
        raise ValueError(
            f"algorithm.algorithm_type is required; valid: {', '.join(ALGORITHM.names())}"
        )
    base = lookup_algorithm(algo_type)
    names: dict[str, str | None] = {}
    fns: dict[str, Any] = {}
    for piece, name, args in chosen_pieces(algorithm_config, base):  # 2.
        names[piece] = name
        # 3.
        if name is None:
            if args:
                raise TypeError(
                    f"{piece}_args {sorted(args)} given but {algo_type!r} has no {piece}"
                )
            fns[piece], fns[f"{piece}_args"] = None, {}
            continue
        fn = PIECES[piece][0].get(name)
        _check_args(piece, name, fn, args)
        fns[piece], fns[f"{piece}_args"] = fn, args
    # 4.
    needs_kl = names["kl_loss_fn"] != "none" or names["kl_penalty_fn"] != "none"
    kl_in_base = base.kl_loss_fn != "none" or base.kl_penalty_fn != "none"
    use_reference = needs_kl or (base.use_reference and not kl_in_base)
    mode = check_loss_agg_mode(
        getattr(algorithm_config, "loss_agg_mode", None) or base.loss_agg_mode
    )
    spec = dataclasses.replace(base, **names, use_reference=use_reference, loss_agg_mode=mode)
    return ResolvedAlgorithm(spec=spec, use_reference=use_reference, loss_agg_mode=mode, **fns)


def value_problems(r: ResolvedAlgorithm, auxiliary: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(piece, message) for every piece that refuses its arguments' values (`sapo` with
    tau_neg <= 0, `ppo` with clip_ratio_c <= 1, an unknown `reinforce` baseline, ...).

    Each piece is called once on a two-row, two-token batch with its merged arguments, so a
    value check a piece makes at its first train step is made before anything starts. The sample
    strategy is called on one experience, with readers (returning nothing) for the config's
    `auxiliary` buffer names, so a strategy that names a missing buffer is refused too.
    """
    import torch

    from trinity.algorithm.aggregation import Aggregator
    from trinity.algorithm.inputs import AdvantageInput, PolicyLossInput

    # two rows (a DPO pair), two tokens each; one group
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]])
    ref = torch.tensor([[-1.5, -1.0], [-1.0, -1.0]])
    mask, agg = torch.ones(2, 2, dtype=torch.bool), Aggregator(r.loss_agg_mode, norm_length=2.0)
    loss_inp = PolicyLossInput(
        lp, ref, torch.ones(2, 2), mask, rollout_logprob=ref,
        ref_logprob=ref if r.use_reference else None, expert_mask=torch.tensor([False, True]),
    )  # fmt: skip
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("policy_loss_fn", lambda: r.policy_loss_fn(loss_inp, agg=agg, **r.policy_loss_fn_args)),
        ("kl_loss_fn", lambda: r.kl_loss_fn(lp, ref, mask, agg=agg, **r.kl_loss_fn_args)),
        ("kl_penalty_fn", lambda: r.kl_penalty_fn(
            torch.zeros(2, 2), lp, ref, mask, **r.kl_penalty_fn_args)),
        ("entropy_loss_fn", lambda: r.entropy_loss_fn(
            torch.ones(2, 2), mask, agg=agg, **r.entropy_loss_fn_args)),
    ]  # fmt: skip
    if r.advantage_fn is not None:
        advantage_fn = r.advantage_fn
        stats = getattr(advantage_fn, "token_stats", False)  # the trainer computes them
        adv_inp = AdvantageInput.from_outcomes(  # what the trainer will have, no more
            torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), mask,
            values=ref if r.spec.use_critic else None, logprob=lp,
            ref_logprob=ref if r.use_reference else None,
            baselines=torch.tensor([0.5, 0.5]) if r.spec.greedy_baseline else None,
            entropy=torch.ones(2, 2) if stats else None,
            nec=torch.full((2, 2), 0.5) if stats else None,
        )  # fmt: skip
        calls.append(("advantage_fn", lambda: advantage_fn(adv_inp, **r.advantage_fn_args)))
    from trinity.algorithm.sample_strategy import SampleContext
    from trinity.common.experience import Experience

    one = [Experience(tokens=torch.tensor([1, 2]), prompt_length=1, reward=1.0)]
    ctx = SampleContext(auxiliary={name: lambda n: [] for name in auxiliary})
    calls.append(("sample_strategy", lambda: r.sample_strategy(one, ctx, **r.sample_strategy_args)))
    problems = []
    for piece, call in calls:
        try:
            call()
        except (TypeError, ValueError) as e:  # reported as the config's problem, not swallowed
            problems.append((piece, str(e)))
    return problems
