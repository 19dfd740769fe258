"""The run's Data-Juicer server: recipes run by one Data-Juicer process that started once.

    service:
      data_juicer:
        auto_start: true     # started with the run, stopped at its end
        port: 0              # 0 or unset: a free port
        # python: .venv-dj/bin/python   (default: the python beside TRINITY_DJ_PROCESS)
    # or: server_url: http://127.0.0.1:5005   (a worker of ours already running)

Without it each recipe with an op not built here runs `dj-process` once (`recipes`), paying
Data-Juicer's import and start every time. With it the explorer starts our worker
(`dj_worker.py`, run by the Data-Juicer environment's python) when it starts (`spawn` in its
constructor, `wait_ready` before its first recipe), and every such recipe is one HTTP call to it
(`run`, within the op's `timeout_s`); `stop` at the explorer's shutdown.

- Health: the worker is ready when its `GET /health` answers as ours (`server:
  trinity-dj-worker`), within `START_TIMEOUT_S`; a worker that exits first is an error with the
  tail of its log (`<run folder>/data_juicer/server.log`).
- A worker that died is restarted once per run, and said so; a second death is an error.
- A recipe over its timeout: the call fails, and a worker we started is stopped (it is busy
  with a run it cannot cancel); the next recipe starts a fresh one.
- No orphan: the worker exits when its standard input closes, and this process holds the other
  end, so it goes with this process however it ends (a Ray actor killed, Ctrl-C); `stop` and an
  `atexit` hook end it sooner.

`server_url` is a worker of ours, not Trinity-RFT's server: that one is a Flask app of
Trinity-RFT's own package (it imports `trinity.service...` and needs Trinity-RFT installed
beside Data-Juicer), keeps sessions (`/create`, `/close`), and takes and returns a step's
experiences as Arrow streams of Trinity-RFT's Experience columns in multipart forms
(`/process_experience`); its `/process_task` ranks and writes the taskset itself. Speaking it
would bring pyarrow and datasets into both environments and Trinity-RFT's Experience layout
into ours. A URL that answers `/health` but not as ours is refused, naming that.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from trinity.data.recipes import RecipeError, dj_command

WORKER = Path(__file__).with_name("dj_worker.py")
SERVER_NAME = "trinity-dj-worker"  # dj_worker.SERVER_NAME (that file imports nothing of ours)
START_TIMEOUT_S = 300.0  # Data-Juicer's import and start
HEALTH_TIMEOUT_S = 10.0  # one /health call
STOP_TIMEOUT_S = 10.0  # after SIGTERM, before SIGKILL
LOG_TAIL = 2000  # characters of the worker's log quoted in an error


class DataJuicerServerError(RecipeError):
    """The Data-Juicer server cannot be started, reached, or did not run a recipe."""


def worker_python(python: str | None, dj_process: str | None) -> str | None:
    """The Data-Juicer environment's python: `python` when given, else the one beside
    `dj_process` (TRINITY_DJ_PROCESS); None when neither is set."""
    if python:
        return python
    if dj_process:
        return str(Path(dj_process).parent / "python")
    return None


def health(url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> dict[str, Any]:
    """`url`'s /health answer, when it is a worker of ours; DataJuicerServerError saying what
    answered otherwise."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as r:
            body = json.loads(r.read())
    except (OSError, ValueError) as e:  # URLError, a refused connection, a timeout, not JSON
        raise DataJuicerServerError(f"Data-Juicer server at {url} is not reachable: {e}") from e
    if not (isinstance(body, dict) and body.get("server") == SERVER_NAME):
        raise DataJuicerServerError(
            f"{url} answers /health but is not a Data-Juicer worker of ours ({body!r}): "
            "service.data_juicer.server_url takes a `trinity/data/dj_worker.py` server "
            "(Trinity-RFT's own server speaks another protocol; docs/data.md)"
        )
    return body


class DataJuicerServer:
    """A worker of ours: started and owned here (`python` given), or at `url` (docs above)."""

    def __init__(
        self,
        url: str | None = None,
        python: str | None = None,
        port: int | None = None,
        log_dir: str | Path | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        if (url is None) == (python is None):
            raise ValueError("a Data-Juicer server is either started (python) or at a url")
        self.url = url.rstrip("/") if url else None
        self.python = python
        self.port = port or 0
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="trinity-dj-"))
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None  # the worker's, from /health
        self.restarts = 0
        self._port_file = self.log_dir / "server.port"
        self._log: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, svc: Any, log_dir: str | Path) -> DataJuicerServer | None:
        """The server `service.data_juicer` asks for; None: recipes run `dj-process` each."""
        if svc is None:
            return None
        if svc.auto_start:
            python = worker_python(svc.python, dj_command())
            if python is None:
                raise DataJuicerServerError(auto_start_hint())
            return cls(python=python, port=svc.port, log_dir=log_dir)
        if svc.server_url:
            return cls(url=svc.server_url, log_dir=log_dir)
        return None

    @property
    def owned(self) -> bool:
        return self.python is not None

    # -- life ----------------------------------------------------------------------------------

    def spawn(self) -> None:
        """Start the worker process (owned), not waiting for it; nothing at a url."""
        if not self.owned or (self.proc is not None and self.proc.poll() is None):
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._port_file.unlink(missing_ok=True)
        self._log = open(self.log_dir / "server.log", "ab")  # noqa: SIM115 (the worker's life)
        self.proc = subprocess.Popen(
            [str(self.python), str(WORKER), "--port", str(self.port),
             "--port-file", str(self._port_file), "--exit-on-stdin-eof"],
            stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
            cwd=self.log_dir,
        )  # fmt: skip
        self.url = None
        atexit.register(self.stop)

    def wait_ready(self) -> None:
        """Until the worker answers /health as ours (`start_timeout_s`); a worker that exits
        first, or never answers, is an error with its log's tail."""
        if not self.owned:
            self.pid = health(self.url or "")["pid"]
            return
        if self.proc is None:
            self.spawn()
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if (code := self.proc.poll()) is not None:
                self.stop()
                raise DataJuicerServerError(
                    f"the Data-Juicer server ({self.python} {WORKER.name}) exited {code} while "
                    f"starting:\n{self.log_tail()}"
                )
            if self.url is None and self._port_file.is_file():
                self.url = f"http://127.0.0.1:{int(self._port_file.read_text())}"
            if self.url is not None:
                try:
                    self.pid = health(self.url, timeout_s=2.0)["pid"]
                    return
                except DataJuicerServerError:
                    pass
            if time.monotonic() > deadline:
                self.stop()
                raise DataJuicerServerError(
                    f"the Data-Juicer server did not answer /health within "
                    f"{self.start_timeout_s:g} s; stopped it:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def start(self) -> None:
        self.spawn()
        self.wait_ready()

    def stop(self) -> None:
        """End a worker we started (SIGTERM, then SIGKILL after STOP_TIMEOUT_S); a url's is
        left running."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()  # the worker exits on its own at EOF
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        atexit.unregister(self.stop)

    def log_tail(self) -> str:
        path = self.log_dir / "server.log"
        if not path.is_file():
            return "(no log)"
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - LOG_TAIL))
            return f.read().decode(errors="replace") or "(its log is empty)"

    def _died(self, grace_s: float = 0.0) -> bool:
        """A worker we started has exited (waiting up to `grace_s`: a dropped connection can
        come just before its process ends)."""
        if not self.owned or self.proc is None:
            return False
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _restart(self, why: str) -> None:
        """Start the worker again, once per run; DataJuicerServerError the second time."""
        code = self.proc.poll() if self.proc is not None else None
        if self.restarts >= 1:
            self.stop()
            raise DataJuicerServerError(
                f"the Data-Juicer server (pid {self.pid}) died again ({why}, exit {code}); it "
                f"was restarted once already:\n{self.log_tail()}"
            )
        self.restarts += 1
        print(
            f"Data-Juicer server (pid {self.pid}) died ({why}, exit {code}): restarting it "
            "(once per run)",
            flush=True,
        )
        self.stop()
        self.start()
        print(f"Data-Juicer server restarted: pid {self.pid} at {self.url}", flush=True)

    # -- recipes -------------------------------------------------------------------------------

    def run(
        self, ops: list[tuple[str, dict[str, Any]]], rows: list[dict], timeout_s: float
    ) -> list[dict]:
        """`rows` through the recipe `ops` by the worker, within `timeout_s`: the rows it
        exports. A worker we started that died is restarted once per run, and the call made
        again; one at a time (the worker runs one recipe at a time anyway)."""
        body = json.dumps({"process": [{n: a} for n, a in ops], "rows": rows}).encode()
        with self._lock:
            while True:
                if self.owned and self.proc is None:  # stopped after a timeout: a fresh one
                    self.start()
                elif self._died():
                    self._restart("found dead before a recipe")
                try:
                    return self._post(body, timeout_s)
                except ConnectionError as e:
                    if not self._died(grace_s=2.0):
                        raise DataJuicerServerError(
                            f"Data-Juicer server at {self.url} did not answer: {e}"
                        ) from e
                    self._restart(f"during a recipe: {e}")  # the second time: raises

    def _post(self, body: bytes, timeout_s: float) -> list[dict]:
        """One POST /process; ConnectionError when the worker went away."""
        req = urllib.request.Request(
            f"{self.url}/process", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return json.loads(r.read())["rows"]
        except urllib.error.HTTPError as e:
            said = json.loads(e.read() or b"{}")
            raise DataJuicerServerError(
                f"Data-Juicer failed (server {self.url}, HTTP {e.code}): {said.get('error', said)}"
            ) from e
        except TimeoutError as e:
            raise self._timed_out(timeout_s) from e
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise self._timed_out(timeout_s) from e
            raise ConnectionError(str(e.reason)) from e
        except (ConnectionError, OSError) as e:  # reset, closed mid-answer
            raise ConnectionError(str(e)) from e

    def _timed_out(self, timeout_s: float) -> DataJuicerServerError:
        pid = self.pid
        if self.owned:
            self.stop()  # busy with a run it cannot cancel; the next recipe starts a fresh one
        return DataJuicerServerError(
            f"Data-Juicer ran over its timeout ({timeout_s:g} s) on the server at {self.url}"
            + (f"; stopped it (pid {pid}): the next recipe starts a new one" if self.owned else "")
        )


def auto_start_hint() -> str:
    return (
        "service.data_juicer.auto_start needs a Data-Juicer environment: install py-data-juicer "
        "in an environment of its own (make setup-data-juicer) and set TRINITY_DJ_PROCESS to "
        "its dj-process, or set service.data_juicer.python to its python"
    )


def service_problems(svc: Any) -> list[tuple[str, str]]:
    """What `validate` says of `service.data_juicer` where a recipe needs it (key path,
    problem): auto_start has a Data-Juicer environment, a server_url answers as ours."""
    at = "service.data_juicer"
    if svc is None:
        return []
    problems = []
    if svc.auto_start and svc.server_url:
        problems.append(
            (
                f"{at}.server_url",
                "auto_start starts a server of its own and would not use server_url: set one",
            )
        )
    if svc.auto_start:
        python = worker_python(svc.python, dj_command())
        if python is None:
            problems.append((f"{at}.auto_start", auto_start_hint()))
        elif not os.access(python, os.X_OK):
            where = f"{at}.python" if svc.python else f"{at}.auto_start"
            problems.append((where, f"{python} is not an executable python; {auto_start_hint()}"))
        else:
            found = subprocess.run(
                [python, "-c", "import importlib.util as u; print(u.find_spec('data_juicer'))"],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if found.returncode != 0 or found.stdout.strip() == "None":
                problems.append(
                    (f"{at}.auto_start", f"{python} has no data_juicer module; {auto_start_hint()}")
                )
    elif svc.server_url:
        try:
            health(svc.server_url.rstrip("/"))
        except DataJuicerServerError as e:
            problems.append((f"{at}.server_url", str(e)))
    return problems


def service_notes(svc: Any) -> list[str]:
    """Keys of `service.data_juicer` that do nothing as set (Trinity-RFT's examples set a port
    beside server_url)."""
    at = "service.data_juicer"
    return [
        f"{at}.{key}: only an auto-started server's; ignored without auto_start"
        for key in ("port", "python")
        if getattr(svc, key) is not None and not svc.auto_start
    ]
