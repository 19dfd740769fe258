"""Reference counting for the actors that the processes of one run share.

With `mode: explore` and `mode: train` in separate `trinity run` processes (fully asynchronous
RFT), the buffer and the synchronizer must outlive whichever process started them. They are
created detached under a name in the run's namespace; every process that uses one `attach`es on
arrival and `detach`es when done, and the process whose `detach` returns 0 kills the actor.
"""

from __future__ import annotations


class RefCounted:
    """Mixin for a shared actor: `attach()` / `detach()` count the processes using it."""

    _attached: int = 0

    def attach(self) -> int:
        self._attached += 1
        return self._attached

    def detach(self) -> int:
        """Returns how many processes still use the actor (0: the caller should kill it)."""
        self._attached = max(0, self._attached - 1)
        return self._attached
