"""Colocation: the trainer and the rollout engines take turns on one device.

    cluster: {colocate: true}       # or Trinity-RFT's `mode: colocate`; chosen on one GPU

On a one-GPU machine both sides cannot keep their memory on the device at once: a policy's
weights, gradients and optimizer state beside the engines' weights and KV cache do not fit where
either alone does. So the device is a baton (`DeviceTurns`, a small actor of the run): a side
computes only while it holds it, and gives it back when its compute ends.

- The explorer's engines hold it from their first call of an explore step (a weight load, a
  generate, an evaluation) to the step's end (`BatchingClient.rest`): taking it, they wake
  (weights back on the device); giving it, they sleep (weights to host memory, caches freed:
  vLLM's sleep level 1, or our engine's, `HFRolloutEngine.sleep`).
- The trainer holds it from a train step's start to the end of that step's publish and
  checkpoint (`TrainerRunner`): taking it, it moves its parameters, gradients and optimizer
  state to the device; giving it, back to host memory (`Trainer.offload`).

Neither side waits for the other's data while it holds the baton: the explorer waits for weights
before its engines take it, the trainer reads its batch before it takes it, so the turns never
deadlock however the sync schedule interleaves the two (on-policy they simply alternate). A side
that fails gives the baton back as its error propagates; a side that waits says every
`NOTICE_S` seconds whom it waits for. Every turn is journaled (`device_turns.jsonl` in the stage
folder: side, taken, given, waited), which is how tests and users see that the two never
overlapped.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

SIDES = ("trainer", "engines")
NOTICE_S = 30.0


class DeviceTurns:
    """The baton: at most one side holds the device. An async Ray actor (`take` waits without
    blocking `give`), or a plain object awaited in one event loop."""

    def __init__(self, journal: str | None = None) -> None:
        self.holder: str | None = None
        self._free = asyncio.Condition()
        self._taken_at = 0.0
        self._waited = 0.0
        self.journal = Path(journal) if journal else None
        self.turns = {side: 0 for side in SIDES}

    async def take(self, side: str, timeout: float | None = None) -> float:
        """Wait until the device is free, then hold it as `side`; returns the seconds waited.
        Taking it again while holding it is a no-op. Raises TimeoutError naming the holder
        after `timeout` seconds."""
        _check(side)
        t0 = time.monotonic()
        async with self._free:
            while self.holder not in (None, side):
                left = None if timeout is None else timeout - (time.monotonic() - t0)
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"colocation: the {side} waited {time.monotonic() - t0:.0f} s for the "
                        f"device, which the {self.holder} still holds"
                    )
                try:
                    await asyncio.wait_for(self._free.wait(), min(NOTICE_S, left or NOTICE_S))
                except TimeoutError:
                    print(
                        f"colocation: the {side} waits for the device, held by the "
                        f"{self.holder} ({time.monotonic() - t0:.0f} s)",
                        flush=True,
                    )
            if self.holder == side:
                return 0.0
            self.holder, self._taken_at = side, time.time()
            self._waited = time.monotonic() - t0
            self.turns[side] += 1
            return self._waited

    async def give(self, side: str) -> None:
        """Give the device back (a no-op when `side` does not hold it), journaling the turn."""
        _check(side)
        async with self._free:
            if self.holder != side:
                return
            self.holder = None
            if self.journal is not None:
                turn = {
                    "side": side,
                    "taken": self._taken_at,
                    "given": time.time(),
                    "waited_s": round(self._waited, 6),
                }
                with self.journal.open("a") as f:
                    f.write(json.dumps(turn) + "\n")
            self._free.notify_all()

    def state(self) -> dict[str, Any]:
        """Who holds the device, and how many turns each side has taken."""
        return {"holder": self.holder, "turns": dict(self.turns)}


def _check(side: str) -> None:
    if side not in SIDES:
        raise ValueError(f"unknown side {side!r}; one of {', '.join(SIDES)}")


def read_journal(path: Path) -> list[dict[str, Any]]:
    """The turns a run journaled, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def overlaps(turns: list[dict[str, Any]]) -> list[tuple[dict, dict]]:
    """Pairs of journaled turns of different sides that overlap in time (none when the baton
    worked)."""
    ordered = sorted(turns, key=lambda t: t["taken"])
    return [
        (a, b)
        for i, a in enumerate(ordered)
        for b in ordered[i + 1 :]
        if a["side"] != b["side"] and b["taken"] < a["given"]
    ]


class EnginesTurn:
    """The rollout engines' side of the baton, kept by the explorer's client (`BatchingClient`):
    `hold` before an engine call (the first one of a turn takes the baton and wakes every
    engine), `rest` at the end of a step or an evaluation (every engine sleeps, the baton goes
    back). Concurrent calls of one turn take it once."""

    def __init__(self, turns: Any, engines: list[Any]) -> None:
        self.turns, self.engines = turns, engines
        self.holding = False
        self._lock = asyncio.Lock()
        self.metrics: dict[str, float] = {}  # since the last `rest`

    async def hold(self) -> None:
        if self.holding:
            return
        async with self._lock:
            if self.holding:
                return
            waited = await self.turns.take.remote("engines")
            t0 = time.perf_counter()
            moved = await asyncio.gather(*(e.wake_up.remote() for e in self.engines))
            self.holding = True
            self._add(wait_s=waited, wake_s=time.perf_counter() - t0, moved_bytes=sum(moved))

    async def rest(self, always: bool = False) -> dict[str, float]:
        """Sleep every engine and give the baton back (`always`: sleep them even when not
        holding it: after they were built). Returns this turn's `colocation/*` metrics."""
        async with self._lock:
            if self.holding or always:
                t0 = time.perf_counter()
                moved = await asyncio.gather(*(e.sleep.remote(1) for e in self.engines))
                self._add(sleep_s=time.perf_counter() - t0, moved_bytes=sum(moved))
            if self.holding:
                await self.turns.give.remote("engines")
                self.holding = False
            out = {f"colocation/engines_{k}": v for k, v in self.metrics.items()}
            self.metrics = {}
            return out

    def _add(self, **values: float) -> None:
        for k, v in values.items():
            self.metrics[k] = self.metrics.get(k, 0.0) + float(v)
