"""The Synchronizer: owns the latest weights version and hands weights from trainer to explorer.

    synchronizer: {sync_method: memory, sync_interval: 1, sync_offset: 0}

`sync_method` decides how weights travel, the schedule (`trinity.sync.schedule`) when:

payloads are opaque here: the method's trainer half made them, its engine half reads them, and
`discard` releases one (`trinity.sync.method`; `memory.py`, `checkpoint.py`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from trinity.common.shared import RefCounted
from trinity.sync.method import sync_method


class TrainingFinished(Exception):
    """The trainer finished (its step budget, or the data ran out) before publishing the
    weights asked for: an explorer waiting for them stops instead of waiting forever."""


class SynchronizerActor(RefCounted):
    """Ray actor. `publish` from the trainer; `wait_for`, `latest` or `request` from explorers.

    Explorers are readers: each registers by name (`register_reader`), every take records the
    version it now holds, and it releases when done. What is kept after each publish or take:
    - the newest version (a final evaluation, an explorer that arrives later);
    - every version a reader holds (a restarted engine reloads it: `BatchingClient`);
    - versions newer than the oldest one a reader holds, up to `max_versions` newest
      (`schedule.versions_to_keep`: what the schedule can still request), so an explorer that
      asks for version v gets exactly v even when the trainer has moved on (`sync_offset > 0`),
      and a reader that never reads holds memory to a bound. An explorer asking for a version
      dropped by that bound gets the next newer one, as for a skipped version.
    With no reader registered only the newest is kept: nothing accumulates when nobody reads.
    """

    def __init__(self, method: str, max_versions: int) -> None:
        if max_versions < 1:
            raise ValueError(f"max_versions must be >= 1, got {max_versions}")
        self.method_name = method
        self.method = sync_method(method)
        self.max_versions = max_versions
        self.version = 0
        self._payloads: dict[
            int, list[Any]
        ] = {}  # [ObjectRef] or [path]; a list keeps refs as refs
        self._cond = asyncio.Condition()
        self._failed: str | None = None
        self._finished: int | None = None  # the trainer's last step, once it has finished
        self.trained = 0  # the trainer's newest trained step (explorer_driven: maybe unpublished)
        self.wanted = 0  # a version an explorer waits for and asked the trainer for (0: none)
        self.readers: dict[str, int] = {}  # registered explorer -> the version it holds

    async def register_reader(self, name: str, holds: int = 0) -> None:
        """Explorer `name` reads versions from now on; it holds `holds` (0: its start weights)."""
        async with self._cond:
            self.readers[name] = holds
            self._prune()

    async def release_reader(self, name: str) -> None:
        """Explorer `name` reads no more: what only it held is dropped."""
        async with self._cond:
            self.readers.pop(name, None)
            self._prune()

    def _take(self, reader: str, got: int) -> tuple[int, list[Any]]:
        self.readers[reader] = got
        payload = self._payloads[got]
        self._prune()
        return got, payload

    def _prune(self) -> None:
        """Drop (and discard) the versions no reader can still ask for (see the class doc)."""
        if not self._payloads:
            return
        newest = max(self._payloads)
        held = set(self.readers.values())
        floor = min(held) if held else newest
        window = sorted(self._payloads)[-self.max_versions :]
        keep = {v for v in window if v >= floor} | held | {newest}
        for v in [v for v in self._payloads if v not in keep]:
            self._discard(self._payloads.pop(v))

    async def publish(self, version: int, payload: list[Any]) -> None:
        async with self._cond:
            if version < self.version:
                raise ValueError(f"weights version went back from {self.version} to {version}")
            self.version = version
            self.trained = max(self.trained, version)
            if version >= self.wanted:
                self.wanted = 0
            replaced = self._payloads.pop(version, None)
            if replaced is not None and replaced != payload:
                self._discard(replaced)
            self._payloads[version] = payload
            self._prune()
            self._cond.notify_all()

    async def trainer_started(self, step: int) -> None:
        """A trainer (re)starts at train step `step` (0, or the checkpoint it resumed from).

        A trainer restarted alone in a split run continues from its checkpoint, which can be
        older than what its dead predecessor published: the versions after `step` came from a
        timeline that is gone. They are discarded (the resumed trainer publishes those version
        numbers again, from its own weights), readers holding them count as holding `step`,
        and the failure the predecessor reported is cleared, so explorers wait for the new one.
        """
        async with self._cond:
            self._failed = None
            self._finished = None
            for v in [v for v in self._payloads if v > step]:
                self._discard(self._payloads.pop(v))
            self.readers = {r: min(v, step) for r, v in self.readers.items()}
            self.version = min(self.version, step)
            self.trained = min(self.trained, step)
            self.wanted = 0
            self._cond.notify_all()

    async def finish(self, step: int) -> None:
        """The trainer is done after train step `step`: whoever waits for a later version gets
        `TrainingFinished` instead of waiting for weights that never come."""
        async with self._cond:
            self._finished = step
            self._cond.notify_all()

    def _ended(self, version: int, unpublished: bool = False) -> None:
        """Raise why `version` will never be published, if it will not (`unpublished`: it has
        no payload, whatever the version count says)."""
        if self.version >= version and not unpublished:
            return
        if self._failed is not None:
            raise RuntimeError(f"trainer stopped before publishing v{version}: {self._failed}")
        if self._finished is not None:
            raise TrainingFinished(
                f"the trainer finished after step {self._finished}: no weights v{version}"
            )

    async def fail(self, reason: str) -> None:
        """The trainer died: wake waiting explorers with an error instead of a hang."""
        async with self._cond:
            self._failed = reason
            self._cond.notify_all()

    async def wait_for(
        self, version: int, timeout: float | None = None, ask: bool = False, *, reader: str
    ) -> tuple[int, list[Any]]:
        """Block until weights of `version` (or, if skipped, the next newer one) are published;
        `reader` holds them from now on.

        `ask`: also ask the trainer to publish (explorer_driven, where it publishes on request).
        """
        if ask:
            self.wanted = max(self.wanted, version)

        def published() -> bool:  # v0 has a payload only from a trainer that hands it over
            return self.version >= version and any(v >= version for v in self._payloads)

        def ready() -> bool:
            return published() or self._failed is not None or self._finished is not None

        async with self._cond:
            try:
                await asyncio.wait_for(self._cond.wait_for(ready), timeout)
            except TimeoutError as e:
                raise TimeoutError(
                    f"waited {timeout}s for weights v{version}; latest is v{self.version}, the "
                    f"trainer has trained step {self.trained}"
                ) from e
            if not published():
                self._ended(version, unpublished=True)
            return self._take(reader, min(v for v in self._payloads if v >= version))

    def _discard(self, payload: list[Any]) -> None:
        self.method.discard(payload)

    def latest_version(self) -> int:
        return self.version

    def finished_step(self) -> int | None:
        """The trainer's last step once it has finished (its budget), else None."""
        return self._finished

    async def trained_step(self, step: int) -> bool:
        """The trainer has trained `step`; True when an explorer asked for weights newer than
        the published ones (`sync_style: explorer_driven`): the trainer should publish now."""
        async with self._cond:
            self.trained = max(self.trained, step)
            self._cond.notify_all()
            return self.wanted > self.version and step > self.version

    async def request(
        self, have: int, timeout: float | None = None, *, reader: str
    ) -> tuple[int, list[Any]] | None:
        """explorer_driven: the trainer's current weights if newer than `have`, else None.

        Published weights newer than `have` come at once. Otherwise, when the trainer has trained
        past `have`, ask it and wait until it publishes (after the step it is in); when it has not,
        there is nothing newer: None, and the explorer goes on with its weights.
        """
        async with self._cond:
            if self.version <= have and (self.trained <= have or self._finished is not None):
                return None
            if self.version <= have:
                self.wanted = max(self.wanted, have + 1)
                try:
                    await asyncio.wait_for(
                        self._cond.wait_for(
                            lambda: (
                                self.version > have
                                or self._failed is not None
                                or self._finished is not None
                            )
                        ),
                        timeout,
                    )
                except TimeoutError as e:
                    raise TimeoutError(
                        f"asked the trainer for weights newer than v{have} and waited {timeout}s "
                        f"(it has trained step {self.trained})"
                    ) from e
                if self.version <= have and self._finished is not None:
                    return None  # it finished: nothing newer comes
                self._ended(have + 1)
            return self._take(reader, max(self._payloads))

    async def latest(self, newer_than: int, *, reader: str) -> tuple[int, list[Any]] | None:
        """The newest published weights if newer than `newer_than`, else None (never waits).

        What an explorer in its own process (`mode: explore`) asks at each sync point: it takes
        whatever the trainer has published by then.
        """
        async with self._cond:
            if not self._payloads or self.version <= newer_than:
                return None
            return self._take(reader, max(self._payloads))
