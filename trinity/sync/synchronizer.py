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


class SynchronizerActor(RefCounted):
    """Ray actor. `publish` from the trainer, `wait_for` from the explorer.

    A published version is kept until an explorer has taken it or a newer one, so an explorer
    that asks for version v gets exactly v even when the trainer has already moved on
    (`sync_offset > 0`): the schedule is honoured exactly, not "latest wins". At most
    `max_versions` (newest) are held (`schedule.versions_to_keep`: what the schedule can still
    request; 1 when nobody explores), so memory stays bounded when no one reads; an explorer
    asking for a version dropped by that bound gets the next newer one, as for a skipped version.
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
        self.trained = 0  # the trainer's newest trained step (explorer_driven: maybe unpublished)
        self.wanted = 0  # a version an explorer waits for and asked the trainer for (0: none)

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
            for old in sorted(self._payloads)[: -self.max_versions]:
                self._discard(self._payloads.pop(old))
            self._cond.notify_all()

    async def fail(self, reason: str) -> None:
        """The trainer died: wake waiting explorers with an error instead of a hang."""
        async with self._cond:
            self._failed = reason
            self._cond.notify_all()

    async def wait_for(
        self, version: int, timeout: float | None = None, ask: bool = False
    ) -> tuple[int, list[Any]]:
        """Block until weights of `version` (or, if skipped, the next newer one) are published.

        `ask`: also ask the trainer to publish (explorer_driven, where it publishes on request).
        """
        if ask:
            self.wanted = max(self.wanted, version)

        def ready() -> bool:
            return self.version >= version or self._failed is not None

        async with self._cond:
            try:
                await asyncio.wait_for(self._cond.wait_for(ready), timeout)
            except TimeoutError as e:
                raise TimeoutError(
                    f"waited {timeout}s for weights v{version}; latest is v{self.version}"
                ) from e
            if self.version < version:
                raise RuntimeError(f"trainer stopped before publishing v{version}: {self._failed}")
            got = min(v for v in self._payloads if v >= version)
            payload = self._payloads[got]
            for old in [v for v in self._payloads if v < got]:
                self._discard(self._payloads.pop(old))
            return got, payload

    def _discard(self, payload: list[Any]) -> None:
        self.method.discard(payload)

    def latest_version(self) -> int:
        return self.version

    async def trained_step(self, step: int) -> bool:
        """The trainer has trained `step`; True when an explorer asked for weights newer than
        the published ones (`sync_style: explorer_driven`): the trainer should publish now."""
        async with self._cond:
            self.trained = max(self.trained, step)
            self._cond.notify_all()
            return self.wanted > self.version and step > self.version

    async def request(
        self, have: int, timeout: float | None = None
    ) -> tuple[int, list[Any]] | None:
        """explorer_driven: the trainer's current weights if newer than `have`, else None.

        Published weights newer than `have` come at once. Otherwise, when the trainer has trained
        past `have`, ask it and wait until it publishes (after the step it is in); when it has not,
        there is nothing newer: None, and the explorer goes on with its weights.
        """
        async with self._cond:
            if self.version <= have and self.trained <= have:
                return None
            if self.version <= have:
                self.wanted = max(self.wanted, have + 1)
                try:
                    await asyncio.wait_for(
                        self._cond.wait_for(
                            lambda: self.version > have or self._failed is not None
                        ),
                        timeout,
                    )
                except TimeoutError as e:
                    raise TimeoutError(
                        f"asked the trainer for weights newer than v{have} and waited {timeout}s "
                        f"(it has trained step {self.trained})"
                    ) from e
                if self.version <= have:
                    raise RuntimeError(f"trainer stopped before publishing: {self._failed}")
            got = max(self._payloads)
            return got, self._payloads[got]

    async def latest(self, newer_than: int) -> tuple[int, list[Any]] | None:
        """The newest published weights if newer than `newer_than`, else None (never waits).

        What an explorer in its own process (`mode: explore`) asks at each sync point: it takes
        whatever the trainer has published by then.
        """
        async with self._cond:
            if not self._payloads or self.version <= newer_than:
                return None
            got = max(self._payloads)
            return got, self._payloads[got]
