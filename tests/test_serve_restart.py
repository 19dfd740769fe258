"""Issue 37's serve mode under a kill: two serve processes and one trainer of one run on a
private cluster; agent threads (the `openai` client, short timeouts, retries) commit groups to
both endpoints at once; one serve process is SIGKILLed while it holds an acknowledged partial
group and started again under its name. Every group whose commits were all answered 200 is
trained whole, exactly once; no session is trained twice; nothing acknowledged is lost (slow:
four `trinity` processes)."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from test_serve import lines_of, popen, url_of
from test_topologies import assert_clean, config, counts

from tests.ray_cluster import private_cluster
from trinity.common.experience import Experience

pytestmark = pytest.mark.slow

GROUP = 2  # sessions per group (GRPO compares them)
GROUPS = 3  # groups each agent thread commits
THREADS = 2  # agent threads per endpoint
ENDPOINTS = ("alpha", "beta")  # the two serve processes (explorer.name)
ROWS = len(ENDPOINTS) * THREADS * GROUPS * GROUP  # one trajectory per session
BATCH = 8  # experiences per train step
STEPS = ROWS // BATCH
QUESTION = [{"role": "user", "content": "2+3="}]


@dataclass
class Endpoint:
    """A serve process's URL as the agents know it (changed when it is started again)."""

    name: str
    url: str = ""
    up: threading.Event = field(default_factory=threading.Event)

    def client(self) -> openai.OpenAI:
        self.up.wait(timeout=240)
        return openai.OpenAI(base_url=self.url, api_key="-", timeout=30, max_retries=3)


class Gone(Exception):
    """The endpoint answered 410, or the agent gave up on the session: its episode is run again
    in a new session."""


def call(ep: Endpoint, fn: Any) -> Any:
    """`fn(client)`, retried while the endpoint's process is down (killed: until the one started
    again serves); a 410 raises `Gone`."""
    deadline = time.time() + 240
    while True:
        try:
            return fn(ep.client())
        except openai.APIStatusError as e:
            if e.status_code == 410:
                raise Gone(str(e)) from None
            raise
        except openai.APITimeoutError:  # the agent's own short timeout: its call to make
            raise
        except openai.APIConnectionError:
            assert time.time() < deadline, f"{ep.name} did not come back"
            time.sleep(0.5)


def timed_out(ep: Endpoint, path: str, body: dict, timeout: float) -> None:
    """A post whose answer the client stops waiting for after `timeout` s (it may or may not
    have landed; the agent's retry must be answered as the first)."""
    with contextlib.suppress(openai.APIError):  # a timeout, or the process is down
        ep.client().with_options(timeout=timeout, max_retries=0).post(
            path, cast_to=object, body=body
        )


def episode(ep: Endpoint, model: str, sid: str, group: str, flaky: int) -> None:
    """One episode in session `sid`: two calls, the reward, the commit to `group`. `flaky` 1:
    its first call is sent with a timeout too short to read the answer, and the agent gives the
    session up (a same-session retry of a call sampled before the hang-up would be a second
    trajectory: docs/agentic.md); 2: its feedback and commit are first sent so, then retried.
    Raises `Gone` when the session cannot be committed (lost with a killed process)."""
    head = {"X-Session-Id": sid}

    def chat(msgs: list, timeout: float | None = None) -> str:
        def create(c: openai.OpenAI) -> Any:
            if timeout is not None:
                c = c.with_options(timeout=timeout, max_retries=0)
            return c.chat.completions.create(
                model=model, messages=msgs, max_tokens=4, extra_headers=head
            )

        return call(ep, create).choices[0].message.content or ""

    try:  # an answer faster than the short timeout is the session's first call
        reply = chat(QUESTION, timeout=0.001 if flaky == 1 else None)
    except openai.APITimeoutError:
        raise Gone("timed out") from None
    again = chat([*QUESTION, {"role": "assistant", "content": reply},
                  {"role": "user", "content": "sure?"}])  # fmt: skip
    reward = float("5" in reply + again)
    feedback = {"session_id": sid, "reward": reward, "key": sid}
    commit = {"session_id": sid, "group": group, "group_size": GROUP}
    if flaky == 2:
        timed_out(ep, "/feedback", feedback, 0.01)
    call(ep, lambda c: c.post("/feedback", cast_to=object, body=feedback))
    if flaky == 2:
        timed_out(ep, "/commit", commit, 0.01)
    call(ep, lambda c: c.post("/commit", cast_to=object, body=commit))


class Agents:
    """THREADS agent threads per endpoint, each committing GROUPS groups of GROUP sessions; a
    session that is gone (410) is run again in a new one. `acked`: each group's sessions whose
    commits were answered 200. Alpha's first thread stops after the first member of its second
    group (`half`) until the test has killed and restarted alpha (`resume`)."""

    def __init__(self, endpoints: dict[str, Endpoint], model: str) -> None:
        self.endpoints, self.model = endpoints, model
        self.acked: dict[str, list[str]] = {}
        self.reruns, self.errors = 0, []
        self.half, self.resume = threading.Event(), threading.Event()
        self.threads = [
            threading.Thread(target=self._agent, args=(ep, t), daemon=True)
            for ep in endpoints.values() for t in range(THREADS)
        ]  # fmt: skip

    def _agent(self, ep: Endpoint, t: int) -> None:
        try:
            n = 0
            for g in range(GROUPS):
                group, members = f"{ep.name}-t{t}-g{g}", []
                while len(members) < GROUP:
                    sid, n = f"{ep.name}-t{t}-s{n}", n + 1
                    try:
                        episode(ep, self.model, sid, group, flaky=n % 3)
                    except Gone:
                        self.reruns += 1
                        continue
                    members.append(sid)
                    if (ep.name, t, g, len(members)) == ("alpha", 0, 1, 1):
                        self.half.set()  # alpha holds an acknowledged partial group now
                        assert self.resume.wait(timeout=240)
                        # its commit again, as a retry whose answer was lost: still a 200
                        commit = {"session_id": sid, "group": group, "group_size": GROUP}
                        call(ep, lambda c, b=commit: c.post("/commit", cast_to=object, body=b))
                self.acked[group] = members
        except Exception as e:  # reported by the test
            self.errors.append(f"{ep.name} t{t}: {e!r}")
            self.half.set()


def listener_pid(port: int) -> int:
    """The process with a socket listening on 127.0.0.1:`port` (the serve process's explorer
    actor, a Ray worker, serves the endpoint)."""
    inodes = {
        line.split()[9]
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
        if line.split()[3] == "0A" and int(line.split()[1].rsplit(":", 1)[1], 16) == port
    }
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        with contextlib.suppress(OSError):
            if os.readlink(fd) in {f"socket:[{i}]" for i in inodes}:
                return int(fd.parts[2])
    raise AssertionError(f"nobody listens on port {port}")


class BufferRows:
    """Every row the buffer's log ever held, read as it goes (a trained row's payload is deleted
    at its ack, a train step after it was written): row id -> (session id, group id)."""

    def __init__(self, path: Path) -> None:
        self.path, self.rows = path, {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.is_set():
            if self.path.exists():
                db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
                try:
                    got = db.execute(
                        "SELECT e.id, p.data FROM experience_log e JOIN experience_payload p "
                        "ON p.id = e.id WHERE e.id > ?",
                        (max(self.rows, default=0),),
                    ).fetchall()
                except sqlite3.OperationalError:  # the tables are not made yet
                    got = []
                finally:
                    db.close()
                for i, data in got:
                    e = Experience.from_bytes(data)
                    self.rows[i] = (e.info["session_id"], e.eid.group)
            time.sleep(0.05)


class Process:
    """A `trinity` process of the run, its output read as it comes."""

    def __init__(self, cmd: str, cfg: Path, cluster: Any, *sets: str) -> None:
        self.p = popen(cmd, cfg, cluster, *sets)
        self.out, self.seen = lines_of(self.p), []

    def url(self) -> str:
        return url_of(self.out, self.seen)

    def finish(self, bound_s: float) -> str:
        """Its exit (within `bound_s`) and all it printed."""
        self.p.wait(timeout=bound_s)
        deadline = time.time() + 30  # what is left in the pipe
        while time.time() < deadline:
            with contextlib.suppress(queue.Empty):
                line = self.out.get(timeout=1)
                if line is None:
                    break
                self.seen.append(line)
        return "".join(self.seen)


def test_a_serve_process_killed_mid_run_loses_nothing_acknowledged(tmp_path, tiny_model_dir):
    t0 = time.time()
    extra = "synchronizer: {sync_method: checkpoint}\n"
    cfg = config(tmp_path, tiny_model_dir, "serve_restart", extra)
    rows = BufferRows(tmp_path / "ckpt" / "topo" / "serve_restart" / "buffer" / "exp.db")
    common = (f"algorithm.repeat_times={GROUP}",
              "buffer.trainer_input.experience_buffer.max_read_timeout=300")  # fmt: skip
    serving = ("explorer.api_port=0", "explorer.service_status_check_interval=1",
               "explorer.feedback_window=300", *common)  # fmt: skip
    with private_cluster() as cluster:

        def serve(name: str) -> Process:
            return Process("serve", cfg, cluster, *serving, f"explorer.name={name}")

        servers = {name: serve(name) for name in ENDPOINTS}
        trainer = Process(
            "run", cfg, cluster, "mode=train", f"buffer.total_steps={STEPS}",
            f"buffer.train_batch_size={BATCH}", "trainer.save_interval=1", *common,
        )  # fmt: skip
        endpoints = {name: Endpoint(name, servers[name].url()) for name in ENDPOINTS}
        for ep in endpoints.values():
            ep.up.set()
        agents = Agents(endpoints, str(tiny_model_dir))
        for t in agents.threads:
            t.start()
        # SIGKILL alpha (its endpoint's process and its driver) while it holds a group with
        # one member committed and answered 200; start it again under its name
        assert agents.half.wait(timeout=240) and not agents.errors, agents.errors
        alpha = endpoints["alpha"]
        alpha.up.clear()
        os.kill(listener_pid(int(alpha.url.rsplit(":", 1)[1].split("/")[0])), signal.SIGKILL)
        servers["alpha"].p.kill()
        dead = servers["alpha"].finish(60)
        servers["alpha"] = serve("alpha")
        alpha.url = servers["alpha"].url()
        alpha.up.set()
        agents.resume.set()
        for t in agents.threads:
            t.join(timeout=300)
        assert not agents.errors, agents.errors
        t_out = trainer.finish(300)
        s_out = {name: p.finish(120) for name, p in servers.items()}
        time.sleep(0.5)  # the poller's last look
        rows.stop.set()
        assert trainer.p.returncode == 0, t_out[-4000:]
        for name, p in servers.items():
            assert p.p.returncode == 0, s_out[name][-4000:]
    taken = re.search(r"serve: (\d+) committed sessions the previous process", s_out["alpha"])
    assert taken and int(taken.group(1)) >= 1, (dead[-2000:], s_out["alpha"][-3000:])
    check_trained_once(counts(cfg), rows.rows, agents.acked)
    print(f"sessions run again: {agents.reruns}; wall {time.time() - t0:.0f} s")


def check_trained_once(c: dict[str, int], rows: dict[int, tuple], acked: dict) -> None:
    """Every row written was trained once (none dropped, none left); each acknowledged session
    is in exactly one row, and no other session is; a group's rows share one group id, which
    holds them only."""
    assert_clean(c, trained=ROWS)
    assert c["dropped"] == 0, c
    assert len(rows) == c["written"], (len(rows), c)  # the poller saw every row
    sessions = [sid for sid, _ in rows.values()]
    assert len(sessions) == len(set(sessions)), sorted(rows.values())
    group_of = dict(rows.values())
    assert len(acked) == len(ENDPOINTS) * THREADS * GROUPS
    members = {sid for group in acked.values() for sid in group}
    assert set(group_of) == members, sorted(set(group_of) ^ members)
    for name, group in acked.items():
        ids = {group_of[sid] for sid in group}
        assert len(ids) == 1, (name, ids)
        assert sorted(s for s, g in group_of.items() if g in ids) == sorted(group), name
