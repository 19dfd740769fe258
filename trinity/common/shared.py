"""Who uses the actors that the processes of one run share.

With `mode: explore` and `mode: train` in separate `trinity run` processes (fully asynchronous
RFT), the buffer and the synchronizer must outlive whichever process started them. They are
created detached under a name in the run's namespace; every process `attach`es on arrival under
its role in the run (`explorer/alpha`, `trainer`) and `detach`es when done, and the process whose
`detach` leaves no user kills the actor.

Users are a set of roles, not a count: a process killed with SIGKILL never detaches, and the same
role started again (`trinity run` of that process, alone) attaches under the same name, so it
neither counts twice nor keeps the shared actors alive after the run's last process is done.
"""

from __future__ import annotations

from trinity.common.resources import RunShares


class RefCounted:
    """Mixin for a shared actor: `attach(role)` / `detach(role)` track the processes using it."""

    _users: set[str] | None = None

    def attach(self, role: str) -> int:
        """`role` uses the actor (again, when its earlier process died). Returns how many users
        it had before (0: this process started the run; more: it joins a live run, or takes the
        place of its own dead process)."""
        if self._users is None:
            self._users = set()
        before = len(self._users)
        self._users.add(role)
        return before

    def detach(self, role: str) -> int:
        """Returns how many roles still use the actor (0: the caller should kill it)."""
        if self._users is None:
            self._users = set()
        self._users.discard(role)
        return len(self._users)

    def users(self) -> list[str]:
        return sorted(self._users or ())


class RunName(RefCounted):
    """The name the processes of one split run agree on (`launcher.run.agree_on_name`), and
    the run's ledger of cores (`common.resources.RunShares`).

    Created detached under a fixed name in the namespace of the run's configured name, with
    `get_if_exists`: the first process's proposal (its configured name, or `<name>_<timestamp>`
    when it reruns a finished run without `continue_from_checkpoint`) wins, and every process
    started while any process of the run lives reads it, so all of them write to one folder and
    never to an earlier run's. Its users are the run's processes by role, so it also counts the
    run's explorers for their shares of the cores; a process's share is freed when it detaches.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._shares: RunShares | None = None

    def get(self) -> str:
        return self.name

    def claim_cpus(
        self, role: str, engines: int, cpus: float | None = None, at_least: int = 0
    ) -> tuple[int, str]:
        """`role`'s cores (`RunShares.claim`) and the ledger in words (`RunShares.describe`).
        The run's first claim gives the cluster's `cpus` (every process sees the same)."""
        if self._shares is None:
            if cpus is None:
                raise RuntimeError(f"{role}: the run's first claim of cores must give the CPUs")
            self._shares = RunShares(int(cpus))
        explorers = sum(u.startswith("explorer/") for u in self.users()) or 1
        got = self._shares.claim(role, explorers, engines, at_least)
        return got, self._shares.describe(role)

    def detach(self, role: str) -> int:
        if self._shares is not None:
            self._shares.release(role)
        return super().detach(role)
