"""What training does with replies whose tool call did not parse (`explorer.malformed_tool_calls`).

    explorer:
      malformed_tool_calls: {policy: mask}     # keep (default) | mask | penalize (+ penalty)

The endpoint's parser notes each reply's status in its session's ledger
(`SessionLedger.note_tool_calls`), and the experience built from the trajectory carries one status
per turn (`info["tool_calls"]`, aligned with `info["turns"]`). A malformed reply is counted and kept
on the experience under every policy; the policy decides what the trainer sees:

- keep: the reply is trained as sampled (the agent saw it as plain text and the episode's reward
  already reflects what followed);
- mask: the reply's tokens get action mask 0, so no gradient pushes toward or away from them, and the
  rest of the trajectory is trained;
- penalize: `penalty` is added to the episode's reward once per malformed reply, on every row of
  the episode (its drift segments share its reward: `common.experience.episode_rows`), so group
  baselines (GRPO) rank a malformed episode below its siblings.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trinity.common.experience import Experience, episode_rows


def malformed_spans(e: Experience) -> list[tuple[int, int]]:
    """(start, end) in response coordinates of each turn whose reply did not parse."""
    statuses = e.info.get("tool_calls")
    if not statuses:  # no parser read its replies
        return []
    turns = e.info["turns"]
    return [
        (int(t[0]), int(t[1])) for t, s in zip(turns, statuses, strict=True) if s == "malformed"
    ]


def apply_malformed_policy(experiences: Iterable[Experience], policy: str, penalty: float) -> int:
    """Apply `policy` ('keep', 'mask' or 'penalize') to `experiences` in place; returns the
    number of malformed replies it acted on (0 under 'keep'). 'penalize' charges an episode's
    malformed replies (over all its rows) to every row of it. A penalised experience must have
    a reward: ValueError otherwise (its workflow left it unrewarded)."""
    if policy not in ("keep", "mask", "penalize"):
        raise ValueError(f"malformed_tool_calls.policy {policy!r}: keep, mask or penalize")
    exps = list(experiences)
    spans = [malformed_spans(e) for e in exps]
    if policy == "keep":
        return 0
    if policy == "mask":
        for e, own in zip(exps, spans, strict=True):
            assert e.action_mask is not None  # filled by Experience.__post_init__
            for start, end in own:
                e.action_mask[start:end] = False
            if own:
                e.info["malformed_masked"] = len(own)
        return sum(map(len, spans))
    for rows in episode_rows(exps):
        count = sum(len(spans[i]) for i in rows)
        if not count:
            continue
        for i in rows:
            e = exps[i]
            if e.reward is None:
                raise ValueError(
                    f"experience {e.eid}: {count} malformed tool call(s) in its episode to "
                    "penalize, but its workflow gave it no reward"
                )
            e.reward = float(e.reward) + penalty * count
            e.info["malformed_penalty"] = penalty * count
    return sum(map(len, spans))


def apply_configured_policy(cfg: Any, experiences: Iterable[Experience]) -> int:
    """`apply_malformed_policy` as `explorer.malformed_tool_calls` says (penalty -1 unset)."""
    malformed = cfg.explorer.malformed_tool_calls
    penalty = malformed.penalty if malformed.penalty is not None else -1.0
    return apply_malformed_policy(experiences, malformed.policy, penalty)
