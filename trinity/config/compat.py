"""Trinity-RFT's configs as they are written, read once at load into one effective config.

1. Deprecated spellings (`apply_renames`, on the raw data): a section declares its renamed keys
   (`ConfigSection.renamed_keys`, e.g. `task_selector -> data_selector`) and values
   (`renamed_values`, e.g. `sync_style: dynamic_by_explorer -> explorer_driven`). Each is read as
   its current name with a note; a key set under both names is a problem (which one should win is
   not ours to guess). Nothing else a user wrote is changed.
2. verl keys (`lift_verl_keys`): `trainer.trainer_config` is an inline verl tree that Trinity-RFT
   hands to verl. This build trains with its own PyTorch trainer, so the tree is read, not run:
   each key of `VERL_KEYS` sets our key when ours is unset, and a value given both ways that
   disagrees is a problem; every other key is noted as not applicable (`unmapped_keys`).
3. Unread arguments (`drop_unread_args`): the `<piece>_args` of a piece set to 'none' and a policy
   loss's `derived_args` (Trinity-RFT fills them itself; the trainer derives them here) are left
   out of the effective config, each with a note.

    trainer:
      trainer_config:
        actor_rollout_ref:
          actor: {ppo_micro_batch_size_per_gpu: 4, clip_ratio_high: 0.28, entropy_coeff: 0.001}

Units: verl counts `ppo_mini_batch_size` in prompts and multiplies it by `rollout.n`;
Trinity-RFT hands verl experiences with `n = 1`, so here it is experiences, as in our key.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from trinity.config.base import annotation_at, child_annotation, strip
from trinity.config.problems import Problem, format_path
from trinity.config.schema import TrinityConfig

Loc = tuple[str | int, ...]


def apply_renames(data: Any, root: Any, _loc: Loc = ()) -> tuple[Any, list[Problem], list[str]]:
    """A copy of `data` (raw, as read from YAML; not modified) following the schema `root`, with
    deprecated keys and values renamed; a problem per key set under both its old and new name;
    a note per rename ("path: deprecated name, read as 'new'")."""
    problems: list[Problem] = []
    notes: list[str] = []
    if not isinstance(data, dict | list):
        return data, problems, notes
    renamed: dict[str, str] = getattr(strip(root), "renamed_keys", {})
    values: dict[str, dict[str, str]] = getattr(strip(root), "renamed_values", {})
    out: dict[Any, Any] = {}
    for key, value in data.items() if isinstance(data, dict) else enumerate(data):
        new = renamed.get(key) if isinstance(key, str) else None
        if new is not None:
            where = format_path((*_loc, key))
            if new in data:
                why = f"deprecated name of '{new}', which is also set; keep only '{new}'"
                problems.append(Problem(where, why))
                continue
            notes.append(f"{where}: deprecated name, read as '{new}'")
            key = new
        if isinstance(value, str) and value in values.get(key, {}):
            new_value = values[key][value]
            notes.append(
                f"{format_path((*_loc, key))}: {value!r} is deprecated, read as {new_value!r}"
            )
            value = new_value
        try:  # stage items hold top-level keys
            child = (
                list[strip(root)] if key == "stages" and not _loc else child_annotation(root, key)
            )
        except LookupError:  # an unknown key: validation reports it
            child = Any
        out[key], found, said = apply_renames(value, child, (*_loc, key))
        problems += found
        notes += said
    return (out if isinstance(data, dict) else list(out.values())), problems, notes


_ACTOR = "actor_rollout_ref.actor"

VERL_KEYS: dict[str, str] = {
    f"{_ACTOR}.ppo_micro_batch_size_per_gpu": "trainer.micro_batch_size_per_gpu",
    f"{_ACTOR}.ppo_max_token_len_per_gpu": "trainer.max_token_len_per_gpu",
    f"{_ACTOR}.use_dynamic_bsz": "trainer.use_dynamic_bsz",
    f"{_ACTOR}.ppo_epochs": "trainer.ppo_epochs",
    f"{_ACTOR}.ppo_mini_batch_size": "trainer.ppo_mini_batch_size",
    f"{_ACTOR}.grad_clip": "trainer.grad_clip",
    f"{_ACTOR}.ulysses_sequence_parallel_size": "trainer.ulysses_sequence_parallel_size",
    f"{_ACTOR}.loss_agg_mode": "algorithm.loss_agg_mode",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "trainer.enable_gradient_checkpointing",
    f"{_ACTOR}.clip_ratio": "algorithm.policy_loss_fn_args.clip_range",
    f"{_ACTOR}.clip_ratio_low": "algorithm.policy_loss_fn_args.clip_range_low",
    f"{_ACTOR}.clip_ratio_high": "algorithm.policy_loss_fn_args.clip_range_high",
    f"{_ACTOR}.entropy_coeff": "algorithm.entropy_loss_fn_args.entropy_coef",
    f"{_ACTOR}.optim.lr": "algorithm.optimizer.lr",
    f"{_ACTOR}.optim.lr_warmup_steps": "algorithm.optimizer.lr_warmup_steps",
    f"{_ACTOR}.optim.lr_warmup_steps_ratio": "algorithm.optimizer.lr_warmup_steps_ratio",
    f"{_ACTOR}.optim.min_lr_ratio": "algorithm.optimizer.min_lr_ratio",
    f"{_ACTOR}.optim.lr_scheduler_type": "algorithm.optimizer.lr_scheduler_type",
    f"{_ACTOR}.optim.warmup_style": "algorithm.optimizer.lr_scheduler_type",
    f"{_ACTOR}.optim.weight_decay": "algorithm.optimizer.weight_decay",
    f"{_ACTOR}.optim.betas": "algorithm.optimizer.betas",
    f"{_ACTOR}.optim.clip_grad": "algorithm.optimizer.clip_grad",
    "critic.optim.lr": "trainer.critic.optimizer.lr",
    "critic.optim.lr_warmup_steps": "trainer.critic.optimizer.lr_warmup_steps",
    "critic.optim.weight_decay": "trainer.critic.optimizer.weight_decay",
    "critic.cliprange_value": "trainer.critic.cliprange_value",
    "trainer.critic_warmup": "trainer.critic.warmup_steps",
    "algorithm.kl_ctrl.type": "algorithm.kl_ctrl.type",
    "algorithm.kl_ctrl.target_kl": "algorithm.kl_ctrl.target_kl",
    "algorithm.kl_ctrl.horizon": "algorithm.kl_ctrl.horizon",
    "algorithm.kl_ctrl.kl_coef": "algorithm.kl_penalty_fn_args.kl_coef",
    "trainer.save_freq": "trainer.save_interval",
    "trainer.max_actor_ckpt_to_keep": "trainer.max_checkpoints_to_keep",
}
"""verl key (dotted, inside trainer_config) -> our key it sets."""


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for every non-mapping value of a nested mapping."""
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, path)
        else:
            yield path, value


def unmapped_keys(cfg: TrinityConfig) -> list[str]:
    """Dotted keys of `trainer.trainer_config` that map to nothing here (sorted)."""
    return sorted(k for k, _ in _leaves(cfg.trainer.trainer_config) if k not in VERL_KEYS)


def lift_verl_keys(cfg: TrinityConfig) -> tuple[TrinityConfig, list[Problem]]:
    """`cfg` with each mapped verl value at our key where the user left ours unset (pure), and a
    problem per mapped verl value that is invalid for our key or disagrees with it (then it is
    not lifted). Returns `cfg` itself when trainer_config maps nothing."""
    leaves = dict(_leaves(cfg.trainer.trainer_config))
    written, data = cfg.model_dump(exclude_unset=True), cfg.model_dump(exclude_unset=True)
    problems, lifted = [], False
    for verl_key, target in VERL_KEYS.items():
        if verl_key not in leaves:
            continue
        where, value, loc = (
            f"trainer.trainer_config.{verl_key}",
            leaves[verl_key],
            target.split("."),
        )
        try:
            value = TypeAdapter(annotation_at(TrinityConfig, loc)).validate_python(value)
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
            problems.append(Problem(where, f"invalid for {target}: {reason}, got {value!r}"))
            continue
        ours, node = written, data
        for part in loc[:-1]:
            ours, node = ours.get(part, {}), node.setdefault(part, {})
        if loc[-1] not in ours:
            node[loc[-1]], lifted = value, True
        elif ours[loc[-1]] != value:
            why = f"disagrees with {target} ({value!r} vs {ours[loc[-1]]!r}); set only one of them"
            problems.append(Problem(where, why))
    if not lifted:
        return cfg, problems
    out = TrinityConfig.model_validate(data)
    out.__pydantic_private__ = dict(cfg.__pydantic_private__ or {})
    return out, problems


def drop_unread_args(cfg: TrinityConfig) -> TrinityConfig:
    """`cfg` without the Trinity-RFT piece arguments nothing here reads (item 3 of the module
    docstring), each with a note (`_compat_notes`); `cfg` itself when there are none."""
    from trinity.algorithm.algorithms import PIECES, known_algorithm

    algo = cfg.algorithm
    spec = known_algorithm(algo.algorithm_type)
    if spec is None:
        return cfg  # reported by the pre-flight pass
    updates: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for piece, (registry, _) in PIECES.items():
        args, chosen = getattr(algo, f"{piece}_args"), getattr(algo, piece) or getattr(spec, piece)
        at = f"algorithm.{piece}_args"
        if args and chosen == "none":
            updates[f"{piece}_args"] = {}
            notes += [f"{at}.{k}: not applicable here ({piece} is 'none': unread)" for k in args]
        elif args and chosen is not None and chosen in registry:
            derived = getattr(registry.get(chosen), "derived_args", ())
            if any(k in derived for k in args):
                updates[f"{piece}_args"] = {k: v for k, v in args.items() if k not in derived}
                notes += [
                    f"{at}.{k}: derived here from the batch settings (Trinity-RFT fills it "
                    "too); the value written is not read"
                    for k in args
                    if k in derived
                ]
    if not updates:
        return cfg
    out = cfg.model_copy(update={"algorithm": algo.model_copy(update=updates)})
    out._compat_notes = (*out._compat_notes, *notes)
    return out


def read_colocate_mode(data: dict[str, Any]) -> tuple[dict[str, Any], list[Problem], list[str]]:
    """Trinity-RFT's `mode: colocate` (one GPU shared by trainer and explorer) read as mode
    both with `cluster.colocate: true` (at the top level and in each stage); a copy of `data`,
    a problem where `cluster.colocate: false` says otherwise, and a note per rewrite."""
    problems: list[Problem] = []
    notes: list[str] = []

    def lift(node: Any, loc: Loc) -> Any:
        if not isinstance(node, dict) or node.get("mode") != "colocate":
            return node
        cluster = node.get("cluster")
        cluster = dict(cluster) if isinstance(cluster, dict) else {}
        where = format_path((*loc, "mode"))
        if cluster.get("colocate") is False:
            problems.append(Problem(where, "colocate, but cluster.colocate is false; keep one"))
            return node
        cluster["colocate"] = True
        notes.append(f"{where}: 'colocate' read as mode both with cluster.colocate: true")
        return {**node, "mode": "both", "cluster": cluster}

    out = lift(data, ())
    if isinstance(out.get("stages"), list):
        out = {**out, "stages": [lift(s, ("stages", i)) for i, s in enumerate(out["stages"])]}
    return out, problems, notes
