"""What this build does with each config key: acted upon, not built yet, or not applicable here.

The state of a key is metadata on its schema field (`base.NotBuilt`, `base.NotApplicable`,
`base.Refused`, `base.Inside`); a field without one, and not under a section that has one, is
acted upon. `KEY_STATES` lists the declared states, read from the schema by its one walker.

* acted upon: the runtime reads it and it changes what happens. Some values of an acted-upon key
  may name a feature that is not built (`Refused`, e.g. `mode: serve`): those are refused.
* not built yet: accepted because Trinity-RFT configs use it, but the feature is missing here; a
  config that sets it to anything but its inert value (the default unless stated) is refused
  with exit code 2 and a message naming the feature.
* not applicable here: it configures something this build does not run (a vLLM memory knob while
  the transformers engine serves rollouts); when a config sets it, `validate` and `run` print one
  line naming the key and the reason.

    problems = not_built_problems(cfg)   # list[Problem], each naming the key and the feature
    notes = not_applicable_notes(cfg)    # list[str], printed by validate and run; with the
                                         # deprecated spellings and unread Trinity-RFT values

`docs/architecture.md` lists the not-built states (`not_built_markdown`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from trinity.config import engine_schema
from trinity.config.base import DEFAULT, Marker, NotApplicable, NotBuilt, Refused, walk
from trinity.config.compat import unmapped_keys
from trinity.config.loader import merge_stages, per_stage
from trinity.config.problems import Problem
from trinity.config.resolved import engines_in_explorer
from trinity.config.schema import TrinityConfig


@dataclass(frozen=True)
class KeyState:
    """The declared state of one key (and of the fields under it without their own).

    `reason`: the missing feature (not built) or why it has no effect (not applicable);
    `refused` values name a feature not built (`refused_reason`); `first_only`: acted upon for
    the first item of its list only; `inert`/`unless`: see `base.NotBuilt`; `default`: the
    schema default; `applies_in(section)`: a not-applicable key acted upon in such a section
    (`base.NotApplicable.unless`)."""

    path: str
    state: Literal["acted", "not_built", "not_applicable"]
    reason: str = ""
    inert: Any = DEFAULT
    refused: tuple[Any, ...] = ()
    refused_reason: str = ""
    first_only: bool = False
    unless: Callable[[Any], bool] | None = None
    applies_in: Callable[[Any], bool] | None = None
    default: Any = None


def _state(path: str, info: FieldInfo, marks: tuple[Marker, ...]) -> KeyState:
    kw: dict[str, Any] = {"state": "acted", "default": info.get_default(call_default_factory=True)}
    for m in marks:
        if isinstance(m, NotBuilt):
            kw.update(state="not_built", reason=m.feature, inert=m.inert, unless=m.unless)
        elif isinstance(m, NotApplicable) and m.after_first:
            kw.update(reason=m.reason, first_only=True)
        elif isinstance(m, NotApplicable):
            kw.update(reason=m.reason, state="not_applicable", applies_in=m.unless)
        elif isinstance(m, Refused):
            kw.update(refused=m.values, refused_reason=m.feature)
    return KeyState(path, **kw)


KEY_STATES: tuple[KeyState, ...] = tuple(_state(*f) for f in walk(TrinityConfig) if f[2])
"""Every declared state, in schema order."""


def schema_paths() -> list[str]:
    """Every field path of the schema, items of lists and mappings written `[*]`."""
    return [path for path, _, _ in walk(TrinityConfig)]


def _values(
    node: Any, parts: list[str], where: str = "", is_set: bool = True, holder: Any = None
) -> Iterator[Any]:
    """(concrete path, value, explicitly set?, the section holding it) for each place a key
    pattern matches in a config."""
    if not parts:
        yield where, node, is_set, holder
    elif parts[0] == "[*]":
        items = node.items() if isinstance(node, dict) else enumerate(node or [])
        for key, item in items:
            yield from _values(item, parts[1:], f"{where}[{key}]", is_set, holder)
    elif isinstance(node, BaseModel) and (getattr(node, parts[0]) is not None or not parts[1:]):
        here = f"{where}.{parts[0]}" if where else parts[0]
        set_here = parts[0] in node.model_fields_set
        yield from _values(getattr(node, parts[0]), parts[1:], here, set_here, node)


def _placed(cfg: TrinityConfig) -> Iterator[tuple[KeyState, str, Any, bool]]:
    """(state, concrete path, value, explicitly set?) of every declared key in `cfg`; a
    not-applicable key is left out where its section acts upon it (`KeyState.applies_in`)."""
    for k in KEY_STATES:
        parts = [p for p in k.path.replace("[*]", ".[*]").split(".") if p]
        for path, value, is_set, holder in _values(cfg, parts):
            if k.applies_in is None or not k.applies_in(holder):
                yield k, path, value, is_set


def _refused(k: KeyState, value: Any) -> Any:
    """The first refused value in `value` (a value or a list of them), else None."""
    values = value if isinstance(value, list) else [value]
    return next((v for v in values if isinstance(v, str) and v in k.refused), None)


def _plain(value: Any) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else value


def own_problems(cfg: TrinityConfig) -> list[Problem]:
    """`not_built_problems` of one config, its stages left out."""
    problems: list[Problem] = []
    for k, path, value, _ in _placed(cfg):
        inert = _plain(value) == _plain(k.default) if k.inert is DEFAULT else value in k.inert
        if (bad := _refused(k, value)) is not None:
            problems.append(Problem(path, f"{bad!r} is not built yet ({k.refused_reason})"))
        elif k.state == "not_built" and not inert and not (k.unless and k.unless(cfg)):
            why = f"not built yet: {k.reason}; remove the key (or set its default) to run"
            problems.append(Problem(path, why))
    return problems + _vllm_missing(cfg)


def _vllm_missing(cfg: TrinityConfig) -> list[Problem]:
    """`engine_type: vllm` where this Python cannot import vLLM: the engines would fail to start
    (the first pool that asks for it, with the fix)."""
    pools = [("explorer.rollout_model", cfg.explorer.rollout_model)] + [
        (f"explorer.auxiliary_models[{i}]", m) for i, m in enumerate(cfg.explorer.auxiliary_models)
    ]
    asking = [path for path, pool in pools if engine_schema.serves_with_vllm(pool)]
    if not asking or engine_schema.vllm_installed():
        return []
    why = f"vllm: vLLM is not installed in this Python ({sys.prefix}); {engine_schema.VLLM_INSTALL}"
    return [Problem(f"{asking[0]}.engine_type", why)]


def own_notes(cfg: TrinityConfig) -> list[str]:
    """`not_applicable_notes` of one config, its stages left out."""
    notes = list(cfg._rename_notes)
    for k, path, value, is_set in _placed(cfg):
        later_item = k.first_only and "[0]" not in path
        refused = _refused(k, value) is not None  # said as a problem
        if is_set and not refused and (k.state == "not_applicable" or later_item):
            notes.append(f"{path}: not applicable here ({k.reason})")
    rm = cfg.explorer.rollout_model
    if engines_in_explorer(cfg) and "max_restarts" in rm.model_fields_set:
        why = "in_explorer_process" if rm.in_explorer_process else "cluster.one_process"
        notes.append(
            f"explorer.rollout_model.max_restarts: not applicable here ({why}: the "
            "engines are threads of the explorer's process, and Ray restarts processes)"
        )
    notes += replay_notes(cfg.buffer.trainer_input.experience_buffer)
    notes += [
        f"trainer.trainer_config.{key}: not applicable here (verl setting with no counterpart)"
        for key in unmapped_keys(cfg)
    ]
    return notes + list(cfg._compat_notes)


def replay_notes(eb: Any) -> list[str]:
    """What a replay buffer will do that its keys do not say."""
    if eb is None or not eb.replay_buffer.enable:
        return []
    at, notes = "buffer.trainer_input.experience_buffer.replay_buffer", []
    if eb.storage_type == "queue":
        notes.append(
            f"{at}: a queue with replay keeps its experiences, priorities and use counts in the "
            "sql storage's SQLite file in the run folder (buffer/<name>.sqlite)"
        )
    if eb.replay_buffer.reuse_cooldown_time is None:
        notes.append(
            f"{at}.reuse_cooldown_time: unset, so nothing is reused (Trinity-RFT's meaning): "
            "reads only go by priority; set it (0 = at once) to reuse experiences"
        )
    return notes


def not_built_problems(cfg: TrinityConfig) -> list[Problem]:
    """One problem per key set to a value whose feature is not built yet, stages included
    (pure: no I/O)."""
    return merge_stages(per_stage(cfg, own_problems))


def not_applicable_notes(cfg: TrinityConfig) -> list[str]:
    """One line per deprecated spelling the file used and per key that is set but has no effect
    here, with the reason, stages included (pure: no I/O)."""
    return merge_stages(per_stage(cfg, own_notes))


def not_built_markdown() -> str:
    """The not-built states as Markdown, one line per feature (for the docs). A key under a
    not-built section is covered by that section's line; a key deeper than one level under a
    not-applicable section (the storages of the experience pipeline) is left out."""
    by_feature: dict[str, list[str]] = {}
    state = {k.path: k.state for k in KEY_STATES}
    for k in KEY_STATES:
        parts = k.path.replace("[*]", ".[*]").split(".")
        above = [".".join(parts[:i]).replace(".[*]", "[*]") for i in range(1, len(parts))]
        covered = [p for p in above if state.get(p, "acted") != "acted"]
        if any(state[p] == "not_built" for p in covered) or any(p != above[-1] for p in covered):
            continue
        if k.refused:
            values = "|".join(str(v) for v in k.refused)
            by_feature.setdefault(k.refused_reason, []).append(f"`{k.path}`: {values}")
        elif k.state == "not_built":
            by_feature.setdefault(k.reason, []).append(f"`{k.path}`")
    return "\n".join(f"- {feature}: {', '.join(keys)}" for feature, keys in by_feature.items())
