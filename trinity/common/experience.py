"""The Experience: one trajectory as the trainer sees it.

Token-in/token-out: `tokens` are exactly the ids the engine sampled (prompt + response), never
re-tokenised text. Response-side tensors (`logprobs`, `action_mask`, `advantages`, `returns`,
`token_level_reward`) have length `len(tokens) - prompt_length`; so do the rows of the optional
[R, k] `topk_ids` / `topk_logprobs`: the engine's k most likely tokens per response position and
their raw-policy logprobs, when sampled with `rollout_args.logprobs: k` (`SamplingParams.logprobs`).

This module does not import torch until a tensor is needed, so the processes that only pass
experiences on (the buffer, the driver) never load it: an experience pickles as its tensors' raw
bytes (`__reduce__`), and one unpickled or read from a dict (`from_dict`) keeps them packed until
a tensor field is first read. Its scalar fields, `response_length` and `to_dict` work packed.
"""

from __future__ import annotations

import array
import enum
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_TENSORS = (
    "tokens",
    "logprobs",
    "action_mask",
    "advantages",
    "returns",
    "token_level_reward",
    "topk_ids",
    "topk_logprobs",
)
_MATRICES = ("topk_ids", "topk_logprobs")  # [R, k]: the others are vectors
# how each field's list form (`to_dict`) reads from and writes to raw bytes without torch
_DTYPES = {
    "tokens": ("int64", "q"),
    "logprobs": ("float32", "f"),
    "action_mask": ("bool", "B"),
    "advantages": ("float32", "f"),
    "returns": ("float32", "f"),
    "token_level_reward": ("float32", "f"),
    "topk_ids": ("int64", "q"),
    "topk_logprobs": ("float32", "f"),
}
# a packed tensor: (torch dtype name, shape, raw bytes)
Packed = tuple[str, tuple[int, ...], bytes]
# the fields besides the tensors, as `to_bytes` writes them (the scalars `to_dict` writes)
_SCALARS = ("prompt_length", "reward", "eid", "model_version", "truncated", "kind",
            "prompt_text", "response_text", "info", "metrics")  # fmt: skip
BLOB_MAGIC = b"TEX2"  # `Experience.to_bytes`
_BLOB_V1 = b"TEX1"  # read only: its header a dict (the queue's logs of 2026-11-29)
_COMPACT = json.JSONEncoder(separators=(",", ":"))  # one encoder: `json.dumps` builds one a call
_ITEM_BYTES = {"int64": 8, "int32": 4, "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
               "bool": 1, "uint8": 1}  # fmt: skip


class ExperienceKind(enum.StrEnum):
    SINGLE_TURN = "single_turn"
    MULTI_TURN = "multi_turn"
    DPO = "dpo"
    SFT = "sft"


@dataclass(frozen=True)
class EID:
    """Experience id. `group` (batch, task) is the key GRPO-style advantages normalise over."""

    batch: int = 0  # explore step that produced it
    task: int = 0  # index of the task inside its batch
    run: int = 0  # which of the `repeat_times` samples of the task
    step: int = 0  # turn index for step-wise workflows
    suffix: str = ""  # taskset name, "eval", ...

    @property
    def group(self) -> tuple[int, int, str]:
        return (self.batch, self.task, self.suffix)

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "task": self.task,
            "run": self.run,
            "step": self.step,
            "suffix": self.suffix,
        }


@dataclass
class Experience:
    tokens: torch.Tensor  # [L] int64, prompt + response
    prompt_length: int
    logprobs: torch.Tensor | None = None  # [R] float32, from the sampling engine
    action_mask: torch.Tensor | None = None  # [R] bool, 1 = trained token
    reward: float | None = None
    token_level_reward: torch.Tensor | None = None  # [R]
    advantages: torch.Tensor | None = None  # [R]
    returns: torch.Tensor | None = None  # [R]
    eid: EID = field(default_factory=EID)
    model_version: int = 0
    truncated: bool = False
    kind: ExperienceKind = ExperienceKind.SINGLE_TURN
    prompt_text: str | None = None
    response_text: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    topk_ids: torch.Tensor | None = None  # [R, k] int64, the engine's top-k token ids
    topk_logprobs: torch.Tensor | None = None  # [R, k] float32, their raw-policy logprobs

    def __post_init__(self) -> None:
        import torch

        self.tokens = torch.as_tensor(self.tokens, dtype=torch.long)
        n = self.response_length
        if n < 0:
            raise ValueError(
                f"prompt_length {self.prompt_length} exceeds token count {len(self.tokens)}"
            )
        if self.action_mask is None:
            self.action_mask = torch.ones(n, dtype=torch.bool)
        for name in _TENSORS[1:]:
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} has length {len(value)}, expected response length {n}")

    @property
    def response_length(self) -> int:
        packed = self.__dict__.get("_packed")
        if packed is not None and "tokens" not in self.__dict__:
            return _numel(packed["tokens"]) - self.prompt_length
        return len(self.tokens) - self.prompt_length

    @property
    def response_tokens(self) -> torch.Tensor:
        return self.tokens[self.prompt_length :]

    # -- serialisation (SQLite rows, files, Ray without torch pickling) -------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self._as_list("tokens"),
            "prompt_length": self.prompt_length,
            "logprobs": self._as_list("logprobs"),
            "action_mask": self._as_list("action_mask"),
            "reward": self.reward,
            "token_level_reward": self._as_list("token_level_reward"),
            "advantages": self._as_list("advantages"),
            "returns": self._as_list("returns"),
            "eid": self.eid.to_dict(),
            "model_version": self.model_version,
            "truncated": self.truncated,
            "kind": self.kind.value,
            "prompt_text": self.prompt_text,
            "response_text": self.response_text,
            "info": self.info,
            "metrics": self.metrics,
            **{name: self._as_list(name) for name in _MATRICES if self._has(name)},
        }

    def _has(self, name: str) -> bool:
        """Whether tensor field `name` is set, read without unpacking."""
        packed = self.__dict__.get("_packed")
        if packed is not None and name not in self.__dict__:
            return packed.get(name) is not None
        return getattr(self, name) is not None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Experience:
        """The experience `to_dict` wrote, packed (no torch until a tensor is read); a tensor
        of the wrong length raises ValueError here, as the constructor would."""
        packed: dict[str, Packed | None] = {}
        for name in _TENSORS:
            value = d.get(name)
            if value is None and name == "action_mask":
                value = [1] * (len(d["tokens"]) - d["prompt_length"])
            if value is None:
                packed[name] = None
                continue
            dtype, code = _DTYPES[name]
            if name in _MATRICES:  # [R, k] rows of equal length
                k = len(value[0]) if value else 0
                if any(len(row) != k for row in value):
                    raise ValueError(f"{name}: rows of different lengths (expected k = {k})")
                flat = [x for row in value for x in row]
                packed[name] = (dtype, (len(value), k), array.array(code, flat).tobytes())
                continue
            packed[name] = (dtype, (len(value),), array.array(code, value).tobytes())
        scalars = {
            "prompt_length": d["prompt_length"],
            "reward": d.get("reward"),
            "eid": EID(**d.get("eid", {})),
            "model_version": d.get("model_version", 0),
            "truncated": d.get("truncated", False),
            "kind": ExperienceKind(d.get("kind", "single_turn")),
            "prompt_text": d.get("prompt_text"),
            "response_text": d.get("response_text"),
            "info": d.get("info", {}),
            "metrics": d.get("metrics", {}),
        }
        exp = _unpack(scalars, packed)
        n = exp.response_length
        if n < 0:
            raise ValueError(
                f"prompt_length {exp.prompt_length} exceeds token count {n + exp.prompt_length}"
            )
        for name in _TENSORS[1:]:
            item = packed[name]
            length = None if item is None else item[1][0] if name in _MATRICES else _numel(item)
            if length is not None and length != n:
                raise ValueError(f"{name} has length {length}, expected response length {n}")
        return exp

    def to_bytes(self) -> bytes:
        """The experience as one blob: the raw bytes of its tensors behind a JSON header
        (`BLOB_MAGIC`, the header's length as 4 little-endian bytes, the header, then each
        tensor's bytes in `_TENSORS` order). The header is a list, by position: the scalars in
        `_SCALARS` order (`eid` as its 5 fields, `kind` as its value), then per tensor its
        [dtype, shape] or null. Exact (a float32 keeps its bits) and cheap for a packed
        experience: no number of a tensor is formatted as text. The queue's log and the sql
        storage keep these."""
        d = self.__dict__
        packed = d.get("_packed") or {}
        tensors = [packed[n] if n not in d else _pack(d[n]) for n in _TENSORS]
        eid = d["eid"]
        head = [d["prompt_length"], d["reward"],  # `_SCALARS`, in its order
                [eid.batch, eid.task, eid.run, eid.step, eid.suffix], d["model_version"],
                d["truncated"], d["kind"].value, d["prompt_text"], d["response_text"],
                d["info"], d["metrics"],
                [None if t is None else [t[0], t[1]] for t in tensors]]  # fmt: skip
        text = _COMPACT.encode(head).encode()
        raw = [t[2] for t in tensors if t is not None]
        return b"".join([BLOB_MAGIC, len(text).to_bytes(4, "little"), text, *raw])

    @classmethod
    def from_bytes(cls, blob: bytes) -> Experience:
        """The experience `to_bytes` wrote (or a `_BLOB_V1` one), packed. ValueError for a blob
        that is not one whole (cut short, with bytes left over, or naming an unknown dtype)."""
        magic = bytes(blob[:4])
        if magic not in (BLOB_MAGIC, _BLOB_V1) or len(blob) < 8:
            raise ValueError(f"not an experience blob (starts {bytes(blob[:8])!r})")
        at = 8 + int.from_bytes(blob[4:8], "little")
        if len(blob) < at:
            raise ValueError(f"experience blob cut short in its {at - 8}-byte header")
        head = json.loads(blob[8:at])
        try:
            if magic == _BLOB_V1:  # {"s": {name: scalar}, "t": [[dtype, shape, bytes] | null]}
                scalars, specs = head["s"], head["t"]
                scalars["eid"] = EID(**scalars["eid"])
            else:
                scalars, specs = dict(zip(_SCALARS, head[:-1], strict=True)), head[-1]
                scalars["eid"] = EID(*scalars["eid"])
            scalars["kind"] = ExperienceKind(scalars["kind"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"experience blob: its header is not one ({e})") from None
        packed: dict[str, Packed | None] = {}
        for name, item in zip(_TENSORS, specs, strict=True):
            if item is None:
                packed[name] = None
                continue
            dtype, shape = item[0], tuple(item[1])
            size = _ITEM_BYTES.get(dtype, 0) * math.prod(shape)
            if dtype not in _ITEM_BYTES or item[2:] not in ([], [size]) or len(blob) < at + size:
                raise ValueError(f"experience blob: {name} is not {size} bytes of {dtype} {shape}")
            packed[name] = (dtype, shape, bytes(blob[at : at + size]))
            at += size
        if at != len(blob):
            raise ValueError(f"experience blob has {len(blob) - at} bytes after its last tensor")
        return _unpack(scalars, packed)

    @classmethod
    def from_stored(cls, payload: bytes | str) -> Experience:
        """A stored payload: a blob (`to_bytes`), or JSON of `to_dict` as text or UTF-8 bytes
        (how logs and databases written before the blobs keep it)."""
        if isinstance(payload, str):
            return cls.from_dict(json.loads(payload))
        if payload[:4] in (BLOB_MAGIC, _BLOB_V1):
            return cls.from_bytes(payload)
        return cls.from_dict(json.loads(payload))

    # -- the packed form (pickling without torch) -------------------------------------------

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any], dict[str, Packed | None]]]:
        packed = self.__dict__.get("_packed") or {}
        tensors = {
            name: (packed[name] if name not in self.__dict__ else _pack(self.__dict__[name]))
            for name in _TENSORS
        }
        scalars = {k: v for k, v in self.__dict__.items() if k not in _TENSORS and k != "_packed"}
        return _unpack, (scalars, tensors)

    def __copy__(self) -> Experience:
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)  # a packed form is never changed, only dropped
        return new

    def __getattr__(self, name: str) -> Any:
        # only reached for a missing attribute: a tensor field still packed
        packed = self.__dict__.get("_packed")
        if packed is None or name not in _TENSORS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        import torch

        for field_name in _TENSORS:
            if field_name not in self.__dict__:
                self.__dict__[field_name] = _tensor(torch, packed[field_name])
        del self.__dict__["_packed"]
        return self.__dict__[name]

    def _as_list(self, name: str) -> list | None:
        packed = self.__dict__.get("_packed")
        if packed is None or name in self.__dict__:
            value = getattr(self, name)
            return None if value is None else value.tolist()
        item = packed[name]
        if item is None:
            return None
        dtype, shape, raw = item
        codes = {"int64": "q", "float32": "f", "bool": "B", "float64": "d", "int32": "i"}
        if dtype not in codes or len(shape) != 1:
            return getattr(self, name).tolist()  # another dtype or shape: torch reads it
        values = array.array(codes[dtype], raw).tolist()
        return [bool(v) for v in values] if dtype == "bool" else values


# A field's default lives in the generated __init__; without the class attribute, reading a
# packed field that has a default (`logprobs`, ...) reaches __getattr__ instead of the default.
for _name in _TENSORS:
    if _name in Experience.__dict__:
        delattr(Experience, _name)


def episode_rows(experiences: Sequence[Experience]) -> list[list[int]]:
    """The rows of each episode (indexes into `experiences`), episodes in the order of their
    first row. Rows sharing EID group and run are one episode's parts (the ledger's drift
    segments, a step-wise workflow's turns); an episode has one row per step, so a row that
    repeats a step of its (group, run) starts another episode: rows left at run 0, step 0 are
    one episode each. The rule `trinity.algorithm.episodes.episode_index` applies to a batch."""
    seen: dict[tuple, int] = {}  # (group, run, step) -> its rows so far
    where: dict[tuple, int] = {}  # (group, run, occurrence) -> its episode's place in `out`
    out: list[list[int]] = []
    for i, e in enumerate(experiences):
        part = (e.eid.group, e.eid.run, e.eid.step)
        occurrence = seen[part] = seen.get(part, -1) + 1
        key = (e.eid.group, e.eid.run, occurrence)
        if key not in where:
            where[key] = len(out)
            out.append([])
        out[where[key]].append(i)
    return out


def exclude_from_training(experiences: Sequence[Experience], reason: str) -> None:
    """Keep `experiences` out of training, saying why: their action masks become 0 (no token
    is trained; they still fill the step, so every step keeps its size) and
    `info["excluded"] = reason`. The explorer counts them per step (`rollout/excluded`, and
    `rollout/excluded_groups` for tasks excluded whole)."""
    import torch

    for e in experiences:
        assert e.action_mask is not None  # filled by Experience.__post_init__
        e.action_mask = torch.zeros_like(e.action_mask)
        e.info["excluded"] = reason


def _pack(t: torch.Tensor | None) -> Packed | None:
    """A tensor as (dtype name, shape, raw bytes): no torch needed to hold or pickle it."""
    if t is None:
        return None
    import torch

    flat = t.detach().cpu().contiguous().reshape(-1)
    return (
        str(t.dtype).removeprefix("torch."),
        tuple(t.shape),
        flat.view(torch.uint8).numpy().tobytes(),
    )


def _tensor(torch: Any, item: Packed | None) -> torch.Tensor | None:
    if item is None:
        return None
    dtype_name, shape, raw = item
    dtype = getattr(torch, dtype_name)
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)


def _numel(item: Packed | None) -> int:
    assert item is not None
    n = 1
    for d in item[1]:
        n *= d
    return n


def _unpack(scalars: dict[str, Any], tensors: dict[str, Packed | None]) -> Experience:
    """An experience whose tensors stay packed until one is read (`Experience.__getattr__`)."""
    exp = object.__new__(Experience)
    exp.__dict__.update(scalars)
    exp.__dict__["_packed"] = tensors
    return exp
