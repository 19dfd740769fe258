"""`rm_gallery_reward` (Trinity-RFT's name): a reward model or rule from RM-Gallery's registry.

    default_reward_fn_type: rm_gallery_reward
    reward_fn_args: {reward_name: math_verify_reward}   # further keys go to the reward's class

It needs the `rm-gallery` package, which is not one of ours: it installs from the package
registry (with its own pins: a torch of its own, label-studio, data-juicer), so it belongs in a
separate environment; where it is not importable, pre-flight refuses this reward by name with
that reason. Its rule-based rewards (`math_verify_reward`, format and length rules) run offline;
its LLM-judge rewards call a model service and need that service's keys and network.

The response is scored as RM-Gallery's `DataSample` with one output whose answer is the response
and whose `label.reference` is the truth (as Trinity-RFT's `RMGalleryFn`); the reward fn sees no
conversation (our reward signature carries the response, the truth and the task row), so a
reward that reads the prompt sees an empty input. Each scored dimension becomes a component
(their sum is the reward); a reward with no dimensions gives {"reward": its score}.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from trinity.rewards.base import REWARD_FN

WHY_NOT = (
    "rm_gallery_reward needs the rm-gallery package, which is not installed in this Python; it "
    "installs from the package registry (`pip install rm-gallery`) with pins of its own (torch, "
    "label-studio, data-juicer), so install it in a separate environment and run trinity there"
)


def installed() -> bool:
    """Whether the `rm_gallery` package is importable here."""
    return importlib.util.find_spec("rm_gallery") is not None


def _arg_problems(args: dict[str, Any]) -> list[str]:
    if not installed():
        return [WHY_NOT]
    if not args.get("reward_name"):
        return ["rm_gallery_reward: reward_fn_args needs reward_name (a name in RM-Gallery's "
                "RewardRegistry, e.g. math_verify_reward)"]  # fmt: skip
    return []


_MODELS: dict[tuple[str, str], Any] = {}  # (name, repr(args)) → the reward object, built once


@REWARD_FN.register("rm_gallery_reward")
def rm_gallery_reward(
    response: str, truth: str | None, task_raw: dict[str, Any], **args: Any
) -> dict[str, float]:
    """A reward from RM-Gallery's registry (needs the rm-gallery package).

    The reward `args["reward_name"]`, built with the other `args`, scores the response (module
    docstring)."""
    if not installed():
        raise ImportError(WHY_NOT)
    if problems := _arg_problems(args):
        raise ValueError(problems[0])
    from rm_gallery.core.data.schema import DataOutput, DataSample, Step
    from rm_gallery.core.reward.registry import RewardRegistry
    from rm_gallery.core.reward.schema import RewardDimensionWithScore

    name = args.pop("reward_name")
    key = (name, repr(sorted(args.items())))
    if key not in _MODELS:
        _MODELS[key] = RewardRegistry.get(name)(**args)
    answer = Step(role="assistant", content=response, label={"reference": truth or ""})
    sample = DataSample(unique_id="trinity", input=[], output=[DataOutput(answer=answer)])
    scored = _MODELS[key].evaluate(sample)
    reward = scored.output[0].answer.reward
    components = {
        d.name: float(d.score) for d in reward.details if isinstance(d, RewardDimensionWithScore)
    }
    return components or {"reward": float(reward.score)}


rm_gallery_reward.arg_problems = _arg_problems  # type: ignore[attr-defined]
