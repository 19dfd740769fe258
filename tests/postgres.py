"""A private PostgreSQL server for tests and benchmarks: initdb'd in a temporary folder, listening
on a Unix socket only, stopped (and its folder removed) at the end.

    with PostgresServer() as pg:
        url = pg.create_database("t1")   # postgresql+psycopg://postgres@/t1?host=<socket dir>&port=5432

The binaries are found from `TRINITY_PG_BIN`, `pg_config --bindir`, the newest
`/usr/lib/postgresql/*/bin` (Debian), or `initdb` on PATH. PostgreSQL refuses to run as root, so
as root the server runs as the `postgres` user (`runuser`), its folder owned by it.
`PostgresUnavailable` says why a server could not start: tests skip on it locally and fail on it
in CI (`tests/conftest.py`, `postgres_required`).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be started here; the message says why."""


def pg_bindir() -> Path:
    """The folder of initdb / pg_ctl (module doc), or PostgresUnavailable."""
    if env := os.environ.get("TRINITY_PG_BIN"):
        return Path(env)
    if pg_config := shutil.which("pg_config"):
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if out.returncode == 0 and (Path(out.stdout.strip()) / "initdb").exists():
            return Path(out.stdout.strip())
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if found:
        return Path(found[-1]).parent
    if initdb := shutil.which("initdb"):
        return Path(initdb).parent
    raise PostgresUnavailable(
        "no PostgreSQL binaries (initdb, pg_ctl): install postgresql or set TRINITY_PG_BIN"
    )


class PostgresServer:
    """One private server (module doc). `fast`: fsync off (tests: only client processes are
    killed, never the server, so nothing a client saw committed is lost); off for benchmarks."""

    def __init__(self, fast: bool = True, port: int = 5432) -> None:
        self.fast, self.port = fast, port
        self.root: Path | None = None
        self._as: list[str] = []

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, *cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self._as, *cmd], capture_output=True, text=True, timeout=120)

    def start(self) -> None:
        bindir = self._bindir = pg_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="pg", dir="/tmp"))  # short: socket paths
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable("running as root and no 'postgres' user") from None
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        data, log = self.root / "data", self.root / "server.log"
        done = self._run(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
        if done.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {done.stderr.strip()[-500:]}")
        opts = f"-k {self.root} -p {self.port} -c listen_addresses=''"
        if self.fast:
            opts += " -c fsync=off -c full_page_writes=off"
        done = self._run(
            str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(log), "-w", "start"
        )
        if done.returncode != 0:
            tail = log.read_text()[-500:] if log.exists() else done.stderr
            raise PostgresUnavailable(f"pg_ctl start failed: {tail.strip()}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@/{database}?host={self.root}&port={self.port}"

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        with psycopg.connect(
            host=str(self.root), port=self.port, user="postgres", dbname="postgres",
            autocommit=True,
        ) as conn:  # fmt: skip
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.root is None:
            return
        if (self.root / "data" / "postmaster.pid").exists():
            self._run(str(self._bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m",
                      "immediate", "-w", "stop")  # fmt: skip
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None
