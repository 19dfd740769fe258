"""`trainer.trainer_config`: an inline verl config tree, read for the keys that mean something here.

Trinity-RFT passes `trainer.trainer_config` to verl. This build trains with its own PyTorch
trainer, so the tree is read, not run: each verl key in `VERL_KEYS` sets one of our fields when our
own key is unset and a value given both ways that disagrees is a problem (`lift_verl_keys`, at
load), and every other key is listed as not applicable
(`unmapped_keys`, printed by `validate` through `support.not_applicable_notes`).

    trainer:
      trainer_config:
        actor_rollout_ref:
          actor: {ppo_micro_batch_size_per_gpu: 4, clip_ratio_high: 0.28, entropy_coeff: 0.001}

Units: verl counts `ppo_mini_batch_size` in prompts and multiplies it by `rollout.n`;
Trinity-RFT hands verl experiences with `n = 1`, so here it is experiences, as in our key.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from trinity.config.problems import Problem

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

_PREFIX = "trainer.trainer_config"


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for every non-mapping value of a nested mapping."""
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, path)
        else:
            yield path, value


def unmapped_keys(cfg: BaseModel) -> list[str]:
    """Dotted keys of `trainer.trainer_config` that map to nothing here (sorted)."""
    tree = cfg.trainer.trainer_config  # type: ignore[attr-defined]
    return sorted(k for k, _ in _leaves(tree) if k not in VERL_KEYS)


def _ours(cfg: BaseModel, target: str) -> tuple[bool, Any, Any]:
    """(explicitly set?, value, annotation or None for a free *_args key) of our `target`."""
    node: Any = cfg
    *parents, last = target.split(".")
    for part in parents:
        node = getattr(node, part)
    if isinstance(node, dict):  # a free-form *_args mapping
        return last in node, node.get(last), None
    info = type(node).model_fields[last]
    annotation = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    return last in node.model_fields_set, getattr(node, last), annotation


def lift_verl_keys(cfg: BaseModel) -> tuple[Any, list[Problem]]:
    """`cfg` with each mapped verl value in place of our key where ours is unset (pure), and a
    problem per mapped verl value that is invalid for our key or disagrees with it (then it
    is not lifted). Returns `cfg` itself when trainer_config maps nothing."""
    leaves = dict(_leaves(cfg.trainer.trainer_config))  # type: ignore[attr-defined]
    problems: list[Problem] = []
    data = cfg.model_dump(exclude_unset=True)
    lifted = False
    for verl_key, target in VERL_KEYS.items():
        if verl_key not in leaves:
            continue
        path, value = f"{_PREFIX}.{verl_key}", leaves[verl_key]
        is_set, ours, annotation = _ours(cfg, target)
        try:
            value = value if annotation is None else TypeAdapter(annotation).validate_python(value)
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
            problems.append(Problem(path, f"invalid for {target}: {reason}, got {value!r}"))
            continue
        if is_set and ours != value:
            why = f"disagrees with {target} ({value!r} vs {ours!r}); set only one of them"
            problems.append(Problem(path, why))
        elif not is_set:
            node = data
            *parents, last = target.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last], lifted = value, True
    if not lifted:
        return cfg, problems
    out = type(cfg).model_validate(data)
    out.__pydantic_private__ = dict(cfg.__pydantic_private__ or {})
    return out, problems
