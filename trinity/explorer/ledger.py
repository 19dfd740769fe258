"""The exact-token ledger: every model call of a session, kept as the tokens that were sampled.

    samples = await model.chat(messages)          # recorded, one `CallRecord` per sample
    ...
    experiences = model.extract_experiences(reward=1.0)   # one MULTI_TURN row per trajectory

A `SessionLedger` holds one session's calls (a workflow's `TaskModelHandle`, one of its
`session()`s, and later an OpenAI-server session). Each call records, per sample, the prompt ids
the engine conditioned on, the completion ids it sampled, their engine logprobs, the weights
version, the finish reason and a fingerprint of tokenizer + chat template (`fingerprint`).

Merging is by tokens alone. A call joins a trajectory only when its prompt *extends exactly* the
tokens a record ends with (that record's prompt + completion); the tokens in between (the
environment's, tool's or user's turn, rendered by this project as a delta) are held with action
mask 0, the new completion with mask 1 and its logprobs. Anything else opens a new trajectory (a
*segment*), counted in `LedgerStats.segments`; when the caller meant the call to continue a
conversation (`Intent.continues`) it is also counted as *drift* with its reason. Nothing is ever
re-aligned or re-tokenised: a trajectory's mask-1 tokens are exactly sampled ids, its mask-0
tokens exactly the prompt ids that were sent.

Continuing a record that is no longer its trajectory's tip (a second sample of the same turn, or
a workflow going back to an earlier turn) *forks*: a new trajectory starts with a copy of the
shared history (its sampled tokens keep mask 1) and is counted in `forks`.

Episodes and credit. A trajectory opened by a fresh prompt is a new episode (`EID.run`); one
opened by drift or a fork stays in the episode of the trajectory it came from (its `parent`).
An episode's reward is for the path it took, so only that path is trained: the branch holding
the episode's latest record (the first sample of its latest call: a later call continuing
another sample moves the path there), and, through drift, the earlier parts it continues
(`trained_paths`; its parts are `EID.step` 0, 1, ...). A fork branch the episode did not go on
with is left out of the experiences, counted in `unchosen`: its shared history is in the chosen
branch already, and the chosen path's reward says nothing of it. Branches meant to be episodes
of their own (a search over continuations, each rewarded) are sessions of their own
(`TaskModelHandle.session()`), whose first prompt is the shared history: then it is a prompt
(mask 0), trained in no branch twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trinity.common.experience import EID, Experience, ExperienceKind
from trinity.common.lazy import lazy_module
from trinity.common.rollout import Sample

if TYPE_CHECKING:
    import torch
else:  # the driver imports this module's users without torch (`common.lazy`)
    torch = lazy_module("torch")

# finish reasons whose "completion" was not sampled (`TaskModelHandle` prompt truncation)
NOT_SAMPLED = frozenset({"prompt_truncated"})


@dataclass(frozen=True)
class CallRecord:
    """One sample of one model call, exactly as the engine produced it.

    `trajectory`: index of the trajectory holding it; in that trajectory, tokens[:len(prompt_ids)]
    are `prompt_ids` and tokens[len(prompt_ids):end] are `completion_ids` (an invariant the tests
    check for every record). `how`: how its prompt was built ("full": the whole message list
    rendered; "delta": held tokens + the rendered delta; "tokens": ids given by the caller).
    """

    call_id: str  # "<session>/<call>/<sample>"
    call: int  # the session's call number, from 0
    sample: int  # which of the call's n samples
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    model_version: int
    finish_reason: str
    fingerprint: str
    trajectory: int
    how: str = "tokens"

    @property
    def end(self) -> int:
        """Length of the token sequence this record ends with (prompt + completion)."""
        return len(self.prompt_ids) + len(self.completion_ids)

    def held_tokens(self) -> list[int]:
        """The tokens a continuation of this record must extend: prompt + completion."""
        return [*self.prompt_ids, *self.completion_ids]

    def is_prefix_of(self, ids: Sequence[int]) -> bool:
        """`ids` extends this record's held tokens exactly (and is longer than them)."""
        p, c = len(self.prompt_ids), len(self.completion_ids)
        return (
            len(ids) > p + c
            and tuple(ids[:p]) == self.prompt_ids
            and tuple(ids[p : p + c]) == self.completion_ids
        )


@dataclass
class Trajectory:
    """One segment: a token sequence whose mask-1 tokens were sampled and whose other tokens
    after the first prompt are deltas this project rendered (mask 0, logprob 0)."""

    index: int
    episode: int  # EID.run of its experience
    prompt_length: int  # the first call's prompt
    tokens: list[int]
    sampled: list[bool]  # per token of `tokens` (prompt positions False)
    logprobs: list[float]  # per token of `tokens` (0 where not sampled)
    records: list[CallRecord] = field(default_factory=list)
    opened_by: str = "new"  # "new", "fork" or "drift:<reason>"
    parent: int | None = None  # the trajectory a fork copied, or a drift part meant to continue

    def turn_spans(self) -> list[tuple[int, int, str]]:
        """(start, end, call_id) of each record's completion, in response coordinates
        (index 0 = the first token after the first prompt): where a turn's reward goes."""
        p = self.prompt_length
        return [(len(r.prompt_ids) - p, r.end - p, r.call_id) for r in self.records]


@dataclass(frozen=True)
class Intent:
    """What the caller meant a call to be, for counting: `continues` names the record it meant
    to continue (None: a fresh prompt); `reason` says why it could not when it was not bridged
    ("" when it was)."""

    continues: CallRecord | None = None
    reason: str = ""


@dataclass
class LedgerStats:
    """Counts over a ledger's life (summed over sessions by `merged`)."""

    calls: int = 0  # model calls recorded
    samples: int = 0  # records (a call with n samples makes n)
    segments: int = 0  # trajectories opened (fresh prompts, drift and forks)
    drift: int = 0  # segments opened by a call that meant to continue a conversation
    forks: int = 0  # trajectories opened from a record that was no longer a tip
    unchosen: int = 0  # fork branches their episode did not go on with: not trained
    bridged: int = 0  # records whose prompt extended held tokens (merged)
    tool_calls_ok: int = 0  # replies a tool-call parser read as calls (`note_tool_calls`)
    tool_calls_malformed: int = 0  # replies that tried to call a tool and did not parse
    drift_reasons: dict[str, int] = field(default_factory=dict)

    def merged(self, other: LedgerStats) -> LedgerStats:
        counts = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in dataclasses.fields(self)
            if f.name != "drift_reasons"
        }
        reasons = dict(self.drift_reasons)
        for k, v in other.drift_reasons.items():
            reasons[k] = reasons.get(k, 0) + v
        return LedgerStats(**counts, drift_reasons=reasons)

    def metrics(self) -> dict[str, float]:
        """`ledger_*` counts, as the explorer reports them under `rollout/`."""
        return {
            "ledger_calls": float(self.calls),
            "ledger_segments": float(self.segments),
            "ledger_drift": float(self.drift),
            "ledger_forks": float(self.forks),
            "ledger_unchosen": float(self.unchosen),
            "ledger_bridged": float(self.bridged),
            "ledger_tool_calls_ok": float(self.tool_calls_ok),
            "ledger_tool_calls_malformed": float(self.tool_calls_malformed),
        }


class SessionLedger:
    """The calls of one session and the trajectories they form (see the module doc)."""

    def __init__(self, session: str = "s", episodes: Iterator[int] | None = None) -> None:
        """`session`: the prefix of its call ids. `episodes`: where new episode numbers come
        from (shared by the sessions of one task, so their `EID.run`s differ); a fresh count
        from 0 when None."""
        self.session = session
        self.records: dict[str, CallRecord] = {}
        self.trajectories: list[Trajectory] = []
        self.stats = LedgerStats()
        self._calls = 0
        self._episodes = episodes if episodes is not None else itertools.count()
        self._by_end: dict[int, list[CallRecord]] = {}  # records by the length they end at
        self.tool_calls: dict[str, tuple[str, str]] = {}  # call id -> (parse status, error)

    # -- recording -----------------------------------------------------------------------------

    def record(
        self,
        samples: Sequence[Sample],
        *,
        fingerprint: str,
        how: str = "tokens",
        intent: Intent | None = None,
    ) -> list[CallRecord]:
        """Record one call's samples (in order); returns their records.

        Each sample is placed by its own `prompt_ids` (what the engine conditioned on):
        1. the parent is `intent.continues` when the prompt extends it, else the record with the
           longest held tokens the prompt extends (a tip before an interior one), else none
        2. a parent that is its trajectory's tip: the trajectory grows by the delta (mask 0)
           and the completion (mask 1); an interior parent: a fork copies the history up to it
        3. no parent: a new trajectory, counted as drift when `intent.continues` was given
        """
        intent = intent or Intent()
        call = self._calls
        self._calls += 1
        self.stats.calls += 1
        out = []
        for j, s in enumerate(samples):
            if len(s.logprobs) != len(s.response_ids):
                raise ValueError(
                    f"ledger {self.session!r}: call {call} sample {j} has "
                    f"{len(s.response_ids)} completion ids but {len(s.logprobs)} logprobs"
                )
            # 1.
            prompt = list(s.prompt_ids)
            parent = intent.continues
            if parent is None or not parent.is_prefix_of(prompt):
                parent = self._longest_parent(prompt)
            # 2. / 3.
            if parent is not None:
                traj = self._extend(parent, prompt)
                self.stats.bridged += 1
            else:
                traj = self._open(prompt, intent)
            rec = CallRecord(
                call_id=f"{self.session}/{call}/{j}",
                call=call,
                sample=j,
                prompt_ids=tuple(prompt),
                completion_ids=tuple(s.response_ids),
                logprobs=tuple(float(x) for x in s.logprobs),
                model_version=int(s.model_version),
                finish_reason=s.finish_reason,
                fingerprint=fingerprint,
                trajectory=traj.index,
                how=how,
            )
            sampled = s.finish_reason not in NOT_SAMPLED
            traj.tokens += rec.completion_ids
            traj.sampled += [sampled] * len(rec.completion_ids)
            traj.logprobs += list(rec.logprobs) if sampled else [0.0] * len(rec.completion_ids)
            traj.records.append(rec)
            self.records[rec.call_id] = rec
            self._by_end.setdefault(rec.end, []).append(rec)
            self.stats.samples += 1
            out.append(rec)
        self.stats.unchosen = len(self.trajectories) - sum(map(len, self.trained_paths()))
        return out

    def note_tool_calls(self, call_id: str, status: str, error: str = "") -> None:
        """What a tool-call parser made of record `call_id`'s reply (`endpoint.tool_calls`:
        "none", "ok" or "malformed", with the parser's error), kept for its experience
        (`info["tool_calls"]`) and counted. A reply is parsed once: a second note is refused."""
        if call_id not in self.records:
            raise KeyError(f"ledger {self.session!r}: no record {call_id!r} to note")
        if call_id in self.tool_calls:
            raise ValueError(f"ledger {self.session!r}: record {call_id!r} was already parsed")
        self.tool_calls[call_id] = (status, error)
        if status == "ok":
            self.stats.tool_calls_ok += 1
        elif status == "malformed":
            self.stats.tool_calls_malformed += 1

    def _longest_parent(self, prompt: list[int]) -> CallRecord | None:
        """The record whose held tokens `prompt` extends, longest first; a tip before others."""
        for end in sorted((e for e in self._by_end if e < len(prompt)), reverse=True):
            found = [r for r in self._by_end[end] if r.is_prefix_of(prompt)]
            if found:
                tips = [r for r in found if len(self.trajectories[r.trajectory].tokens) == r.end]
                return (tips or found)[0]
        return None

    def _extend(self, parent: CallRecord, prompt: list[int]) -> Trajectory:
        """The trajectory `prompt` continues from `parent` (forked if `parent` is not its tip),
        grown by the delta tokens prompt[parent.end:] (mask 0)."""
        traj = self.trajectories[parent.trajectory]
        if len(traj.tokens) != parent.end:  # not the tip: fork the shared history
            end = parent.end
            fork = Trajectory(
                index=len(self.trajectories),
                episode=traj.episode,
                prompt_length=traj.prompt_length,
                tokens=traj.tokens[:end],
                sampled=traj.sampled[:end],
                logprobs=traj.logprobs[:end],
                records=[r for r in traj.records if r.end <= end],
                opened_by="fork",
                parent=traj.index,
            )
            self.trajectories.append(fork)
            self.stats.segments += 1
            self.stats.forks += 1
            traj = fork
        delta = prompt[parent.end :]
        traj.tokens += delta
        traj.sampled += [False] * len(delta)
        traj.logprobs += [0.0] * len(delta)
        return traj

    def _open(self, prompt: list[int], intent: Intent) -> Trajectory:
        episode, parent, opened_by = None, None, "new"
        if intent.continues is not None:
            reason = intent.reason or "not_extended"
            self.stats.drift += 1
            self.stats.drift_reasons[reason] = self.stats.drift_reasons.get(reason, 0) + 1
            parent = intent.continues.trajectory
            episode = self.trajectories[parent].episode
            opened_by = f"drift:{reason}"
        traj = Trajectory(
            index=len(self.trajectories),
            episode=self._new_episode() if episode is None else episode,
            prompt_length=len(prompt),
            tokens=list(prompt),
            sampled=[False] * len(prompt),
            logprobs=[0.0] * len(prompt),
            opened_by=opened_by,
            parent=parent,
        )
        self.trajectories.append(traj)
        self.stats.segments += 1
        return traj

    def _new_episode(self) -> int:
        return next(self._episodes)

    # -- reading -------------------------------------------------------------------------------

    def trained_paths(self) -> list[list[Trajectory]]:
        """Per episode (in the order episodes opened), the trajectories its reward trains, in
        order: its parts 0, 1, ... (module doc).

        1. the tip: the trajectory holding the episode's latest record (the first sample of
           its latest call)
        2. walk back through `parent`: a drift part's parent is the part before it (on the
           path); a fork's parent is not (the fork holds the history they share), but the
           walk goes on through it to the parts before that
        """
        tips: dict[int, CallRecord] = {}
        for rec in self.records.values():  # in recording order: a later call replaces
            episode = self.trajectories[rec.trajectory].episode
            if episode not in tips or rec.call > tips[episode].call:
                tips[episode] = rec
        paths = []
        for rec in tips.values():
            cur = self.trajectories[rec.trajectory]
            path = [cur]
            while cur.parent is not None:
                parent = self.trajectories[cur.parent]
                if cur.opened_by.startswith("drift"):
                    path.append(parent)
                cur = parent
            paths.append(path[::-1])
        return paths

    def extract_experiences(
        self,
        reward: float | Mapping[int, float] | None = None,
        *,
        run_offset: int = 0,
        info: Mapping[str, Any] | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> list[Experience]:
        """One MULTI_TURN experience per trajectory of each episode's trained path
        (`trained_paths`; `EID.step` = its place in the path), in the order they were opened;
        fork branches off the paths are left out (`LedgerStats.unchosen`).

        tokens: the trajectory; prompt_length: its first prompt; logprobs (engine, 0 where not
        sampled) and action_mask (1 on sampled tokens only) over everything after the prompt,
        so the mask may have holes (tool/user turns). `reward`: one for every row, or per
        episode (its `EID.run` without `run_offset`), or None. model_version: the oldest weights any
        of its calls used (`info["model_versions"]` lists each call's); truncated: its last
        call stopped at its length budget. `info["turns"]`: `Trajectory.turn_spans`; when a
        parser read any of its replies (`note_tool_calls`), `info["tool_calls"]` gives each
        turn's parse status (None: not parsed) and `info["tool_call_errors"]` the malformed
        ones' errors by turn index.
        """
        steps = {t.index: i for path in self.trained_paths() for i, t in enumerate(path)}
        out = []
        for traj in self.trajectories:
            if traj.index not in steps:  # a branch its episode did not go on with
                continue
            p = traj.prompt_length
            if isinstance(reward, Mapping):
                if traj.episode not in reward:
                    raise KeyError(
                        f"ledger {self.session!r}: no reward given for episode {traj.episode} "
                        f"(rewards for {sorted(reward)})"
                    )
                r: float | None = float(reward[traj.episode])
            else:
                r = None if reward is None else float(reward)
            versions = [rec.model_version for rec in traj.records]
            out.append(
                Experience(
                    tokens=torch.tensor(traj.tokens, dtype=torch.long),
                    prompt_length=p,
                    logprobs=torch.tensor(traj.logprobs[p:], dtype=torch.float32),
                    action_mask=torch.tensor(traj.sampled[p:], dtype=torch.bool),
                    reward=r,
                    eid=EID(run=run_offset + traj.episode, step=steps[traj.index]),
                    model_version=min(versions),
                    truncated=traj.records[-1].finish_reason == "length",
                    kind=ExperienceKind.MULTI_TURN,
                    info={
                        **dict(info or {}),
                        "session": self.session,
                        "segment": traj.index,
                        "opened_by": traj.opened_by,
                        "turns": [list(span) for span in traj.turn_spans()],
                        "model_versions": versions,
                        "fingerprint": traj.records[-1].fingerprint,
                        **self._tool_call_info(traj),
                    },
                    metrics=dict(metrics or {}),
                )
            )
        return out

    def _tool_call_info(self, traj: Trajectory) -> dict[str, Any]:
        notes = [self.tool_calls.get(rec.call_id) for rec in traj.records]
        if not any(notes):
            return {}
        errors = {str(i): n[1] for i, n in enumerate(notes) if n and n[0] == "malformed"}
        return {
            "tool_calls": [n[0] if n else None for n in notes],
            **({"tool_call_errors": errors} if errors else {}),
        }


# -- fingerprints ------------------------------------------------------------------------------

_TOKENIZER_HASHES: dict[int, tuple[weakref.ref, str]] = {}


def _tokenizer_hash(tokenizer: Any) -> str:
    """sha256 of the tokenizer's full definition (the fast tokenizer's JSON: vocabulary, merges,
    normalizer, pre-tokenizer, added tokens), cached per tokenizer object."""
    if tokenizer is None:  # a token-level handle: ids in, ids out
        return "none"
    key = id(tokenizer)
    cached = _TOKENIZER_HASHES.get(key)
    if cached is not None and cached[0]() is tokenizer:
        return cached[1]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        blob = backend.to_str()
    else:  # a slow tokenizer: its vocabulary and special tokens
        blob = json.dumps(
            [sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens], sort_keys=True
        )
    digest = hashlib.sha256(blob.encode()).hexdigest()
    with contextlib.suppress(TypeError):  # not weak-referenceable: not cached
        _TOKENIZER_HASHES[key] = (weakref.ref(tokenizer), digest)
    return digest


def fingerprint(tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
    """16 hex digits naming what turns messages into ids: the tokenizer's definition, its chat
    template (as set now, e.g. `model.custom_chat_template`) and the template kwargs
    (`enable_thinking`). Stable across processes and runs; any change gives another value."""
    parts = {
        "tokenizer": _tokenizer_hash(tokenizer),
        "chat_template": getattr(tokenizer, "chat_template", None),
        "kwargs": dict(chat_template_kwargs or {}),
    }
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
