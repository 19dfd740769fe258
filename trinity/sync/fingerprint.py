"""A weight fingerprint on every sync: the engine checks that it received what the trainer sent.

    payload = Fingerprinted(method).send(state, version, sync_dir)   # ... + [Fingerprint]
    tensors = Fingerprinted(method).receive(payload)                 # raises WeightsMismatch

Every sync method is wrapped (`sync.method.sync_method`): its trainer half hashes each tensor it
publishes and appends the hashes to the payload; its engine half strips them, receives the
tensors the method's own way, and hashes them again. A tensor that differs (a transport that
dropped, reordered or corrupted bytes, a name that went missing) fails the sync with both
hashes and the tensor names: the engine never samples with weights nobody trained. Payloads
without a fingerprint (a checkpoint loaded by path) are received unchecked, and a live method
(`shared`: the engines map the trainer's own tensors, which change in place, a resume restoring
its checkpoint into them) carries none: there is no transport to check.

A tensor's hash (`tensor_hash`) is blake2b over its shape, dtype and values: every value of a
tensor up to `SAMPLED_ABOVE` elements, and above that `SAMPLED_ABOVE` values at a fixed stride
(first and last included), so hashing stays cheap on billion-parameter models while any change
of a small tensor, and of the sampled values of a large one, is caught. `digest` folds a whole
fingerprint into 16 hex digits: the weights' identity, which the explorer reports with each
step's experiences (`Experience.info["weights_fingerprint"]`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity.common.rollout import Peers

if TYPE_CHECKING:
    import torch

SAMPLED_ABOVE = 1 << 20  # elements: a larger tensor is hashed on this many strided values


class WeightsMismatch(RuntimeError):
    """The weights an engine received are not the ones the trainer sent."""


@dataclass(frozen=True)
class Fingerprint:
    """The per-tensor hashes of the weights of `version`, carried as the payload's last item."""

    version: int
    hashes: dict[str, str]

    @property
    def digest(self) -> str:
        return digest(self.hashes)


def tensor_hash(t: torch.Tensor) -> str:
    """blake2b (16 hex digits) of `t`'s shape, dtype and values (module doc: sampled when big)."""
    import torch

    flat = t.detach().reshape(-1)
    if flat.numel() > SAMPLED_ABOVE:
        idx = torch.linspace(0, flat.numel() - 1, SAMPLED_ABOVE, device=flat.device).long()
        flat = flat[idx]
    data = flat.contiguous().cpu().view(torch.uint8).numpy().tobytes()
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{tuple(t.shape)}|{t.dtype}|".encode())
    h.update(data)
    return h.hexdigest()


def fingerprint(state: dict[str, torch.Tensor], version: int) -> Fingerprint:
    return Fingerprint(version, {name: tensor_hash(t) for name, t in state.items()})


def digest(hashes: dict[str, str]) -> str:
    """One 16-hex-digit hash of a fingerprint (names and hashes, in name order)."""
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(hashes):
        h.update(f"{name}={hashes[name]};".encode())
    return h.hexdigest()


def split(payload: list[Any]) -> tuple[list[Any], Fingerprint | None]:
    """(the method's own payload, its fingerprint or None)."""
    if payload and isinstance(payload[-1], Fingerprint):
        return payload[:-1], payload[-1]
    return payload, None


def check(expected: Fingerprint, got: dict[str, torch.Tensor], method: str) -> None:
    """WeightsMismatch naming every tensor whose hash differs, is missing or is extra."""
    found = {name: tensor_hash(t) for name, t in got.items()}
    bad = sorted(n for n in expected.hashes if found.get(n) != expected.hashes[n])
    extra = sorted(set(found) - set(expected.hashes))
    if not bad and not extra:
        return
    shown = [f"{n}: sent {expected.hashes[n]}, received {found.get(n, 'nothing')}" for n in bad]
    shown += [f"{n}: received, never sent" for n in extra]
    more = f" (and {len(shown) - 5} more)" if len(shown) > 5 else ""
    raise WeightsMismatch(
        f"sync_method {method}: the weights of version {expected.version} arrived changed: "
        f"{len(bad)} of {len(expected.hashes)} tensors differ from what the trainer sent"
        + (f", {len(extra)} extra" if extra else "")
        + f": {'; '.join(shown[:5])}{more}"
    )


class Fingerprinted:
    """A sync method whose payloads carry their fingerprint (module doc); it is the method to
    its callers: `hands_over`, `live` and anything else are the wrapped method's."""

    def __init__(self, method: Any, name: str) -> None:
        self.method, self.name = method, name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.method, attr)

    def send(self, state: dict[str, torch.Tensor], version: int, sync_dir: Path) -> list[Any]:
        if self.method.live:  # the engines map the trainer's own tensors: they change in place
            return self.method.send(state, version, sync_dir)  # (a resume restores into them)
        stamp = fingerprint(state, version)  # before the method may hand the tensors over
        return [*self.method.send(state, version, sync_dir), stamp]

    def receive(self, payload: list[Any], peers: Peers | None = None) -> dict[str, torch.Tensor]:
        own, expected = split(payload)
        tensors = self.method.receive(own, peers)
        if expected is not None:
            check(expected, tensors, self.name)
        return tensors

    def discard(self, payload: list[Any]) -> None:
        self.method.discard(split(payload)[0])
