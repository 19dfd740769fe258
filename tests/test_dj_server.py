"""The run's Data-Juicer server (`trinity.data.dj_server`, `dj_worker.py`), against a stand-in
Data-Juicer (tests/data/stand_in_data_juicer: its ops keep_flagged, stamp_pid, sleep, die,
fail) run by this interpreter; and against a real one where TRINITY_TEST_DJ_PROCESS names it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from test_one_process import _cfg

from trinity.config.preflight import preflight
from trinity.data.dj_server import DataJuicerServer, DataJuicerServerError, health
from trinity.data.operators import build_operator
from trinity.data.recipes import DJ_ENV, RecipeRunner
from trinity.data.task_ops import OpContext

STAND_IN = Path(__file__).parent / "data" / "stand_in_data_juicer"
ROWS = [{"i": 0, "flag": True}, {"i": 1, "flag": False}, {"i": 2, "flag": True}]


def alive(pid: int) -> bool:
    """`pid` is a running process (a zombie, exited but not reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A factory of auto-started servers running the stand-in; each stopped at the end."""
    monkeypatch.setenv("PYTHONPATH", str(STAND_IN))  # the worker's python finds data_juicer
    made: list[DataJuicerServer] = []

    def make(**kw) -> DataJuicerServer:
        srv = DataJuicerServer(python=sys.executable, log_dir=tmp_path / f"dj{len(made)}", **kw)
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.stop()


def test_an_auto_started_server_answers_health_and_runs_every_recipe_in_one_process(server):
    srv = server()
    srv.start()
    said = health(srv.url)
    assert said["server"] == "trinity-dj-worker" and said["data_juicer"] == "stand-in"
    assert said["pid"] == srv.pid == srv.proc.pid
    first = srv.run([("keep_flagged", {}), ("stamp_pid", {})], ROWS, timeout_s=30)
    assert first == [{"i": 0, "flag": True, "pid": srv.pid}, {"i": 2, "flag": True, "pid": srv.pid}]
    # a recipe's run (RecipeRunner: the task pipeline's) and an experience operator's go to it
    kept, _ = asyncio.run(
        RecipeRunner([("stamp_pid", {})]).process(ROWS[:1], OpContext(data_juicer=srv))
    )
    assert kept == [{"i": 0, "flag": True, "pid": srv.pid}]
    pid = srv.pid
    srv.stop()
    assert gone_within(pid, 5)


def test_the_experience_operator_sends_its_recipe_to_the_server(server, tmp_path, monkeypatch):
    import torch

    from trinity.common.experience import EID, Experience

    monkeypatch.delenv(DJ_ENV, raising=False)  # no dj-process: only the server runs it
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("process:\n  - stamp_pid: {}\n")
    op = build_operator("data_juicer", {"config_path": str(recipe)})
    assert op.data_juicer_ops() == ["stamp_pid"]
    exps = [
        Experience(tokens=torch.tensor([1, 2]), prompt_length=1, prompt_text="p",
                   response_text="r", eid=EID(task=0))
    ]  # fmt: skip
    srv = server()
    srv.start()
    asyncio.run(op.prepare(exps, OpContext(data_juicer=srv)))
    assert op.process(exps)[0] == exps and exps[0].info["pid"] == srv.pid


def test_data_juicers_error_comes_back_with_its_message(server):
    srv = server()
    srv.start()
    with pytest.raises(DataJuicerServerError, match=r"HTTP 500.*ValueError: no such column"):
        srv.run([("fail", {"message": "no such column"})], ROWS, timeout_s=30)
    assert srv.run([("keep_flagged", {})], ROWS[1:], timeout_s=30) == [ROWS[2]]  # still serving


def test_a_recipe_over_its_timeout_fails_and_the_busy_server_is_replaced(server):
    srv = server()
    srv.start()
    busy = srv.pid
    with pytest.raises(DataJuicerServerError, match=r"over its timeout \(0.5 s\).*stopped it"):
        srv.run([("sleep", {"seconds": 30})], ROWS, timeout_s=0.5)
    assert gone_within(busy, 5)
    assert srv.run([("stamp_pid", {})], ROWS[:1], timeout_s=30)[0]["pid"] == srv.pid != busy
    assert srv.restarts == 0  # stopped by us, not died


def test_a_server_that_dies_is_restarted_once_then_its_death_is_an_error(server, capsys):
    srv = server()
    srv.start()
    first = srv.pid
    os.kill(first, signal.SIGKILL)  # dies between two recipes
    assert gone_within(first, 5)
    rows = srv.run([("stamp_pid", {})], ROWS[:1], timeout_s=30)
    second = srv.pid
    assert rows[0]["pid"] == second != first and srv.restarts == 1
    assert f"Data-Juicer server (pid {first}) died" in capsys.readouterr().out
    with pytest.raises(DataJuicerServerError, match=r"died again.*restarted once already"):
        srv.run([("die", {})], ROWS, timeout_s=30)  # dies during a recipe: no second restart
    assert srv.proc is None and not alive(second)


def test_a_recipe_that_kills_the_server_is_tried_once_more_on_a_restarted_one(server, capsys):
    srv = server()
    srv.start()
    with pytest.raises(DataJuicerServerError, match="died again"):
        srv.run([("die", {})], ROWS, timeout_s=30)
    out = capsys.readouterr().out
    assert "restarting it (once per run)" in out and "Data-Juicer server restarted: pid" in out


def test_a_server_that_cannot_start_says_why(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)  # no data_juicer for the worker
    srv = DataJuicerServer(python=sys.executable, log_dir=tmp_path)
    with pytest.raises(DataJuicerServerError, match=r"exited 1 while starting(.|\n)*data_juicer"):
        srv.start()
    assert srv.proc is None


def test_no_orphan_when_the_process_that_started_the_server_is_killed(tmp_path, monkeypatch):
    """The worker holds its starter's pipe: a starter killed outright (no `stop`, no atexit)
    takes the worker with it."""
    monkeypatch.setenv("PYTHONPATH", str(STAND_IN))
    starter = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
        "from trinity.data.dj_server import DataJuicerServer\n"
        f"srv = DataJuicerServer(python=sys.executable, log_dir={str(tmp_path)!r})\n"
        "srv.start()\n"
        "print(srv.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(proc.stdout.readline())
        assert alive(worker)
        proc.kill()
        proc.wait()
        assert gone_within(worker, 10)
    finally:
        proc.kill()


# -- validate --------------------------------------------------------------------------------


class NotOurs(BaseHTTPRequestHandler):
    """Answers /health as Trinity-RFT's server does."""

    def do_GET(self):
        body = json.dumps({"status": "ok"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_validate_checks_the_data_juicer_service(tmp_path, monkeypatch, server):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("process:\n  - language_id_score_filter: {lang: en}\n")
    dj_op = {"name": "data_juicer", "args": {"config_path": str(recipe)}}

    def problems(**svc):
        cfg = _cfg(
            service={"data_juicer": svc},
            data_processor={"experience_pipeline": {"operators": [dj_op]}},
        )
        report = preflight(cfg)
        notes.clear()
        notes.extend(n for n in report.notes if "service.data_juicer" in n)
        return {
            p.path: p.message for p in report.problems if p.path.startswith(("service", "data_"))
        }

    notes: list[str] = []

    monkeypatch.delenv(DJ_ENV, raising=False)
    at = "service.data_juicer"
    # a server URL nobody answers at: refused naming it (and the recipe is the server's)
    said = problems(server_url="http://127.0.0.1:9")
    assert said == {f"{at}.server_url": said[f"{at}.server_url"]}
    assert "Data-Juicer server at http://127.0.0.1:9 is not reachable" in said[f"{at}.server_url"]
    # a server that answers /health, but not as ours
    other = HTTPServer(("127.0.0.1", 0), NotOurs)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{other.server_address[1]}"
        assert "not a Data-Juicer worker of ours" in problems(server_url=url)[f"{at}.server_url"]
    finally:
        other.shutdown()
    # a worker of ours: accepted, recipe included
    srv = server()
    srv.start()
    assert problems(server_url=srv.url) == {}
    # auto_start without a Data-Juicer environment
    said = problems(auto_start=True)
    assert "make setup-data-juicer" in said[f"{at}.auto_start"]
    assert DJ_ENV in said[f"{at}.auto_start"]
    assert problems(auto_start=True, python=sys.executable) == {}  # the stand-in's on PYTHONPATH
    monkeypatch.delenv("PYTHONPATH")
    said = problems(auto_start=True, python=sys.executable)
    assert "has no data_juicer module" in said[f"{at}.auto_start"]
    assert problems(port=5005, server_url=srv.url) == {}  # Trinity-RFT's example sets both
    assert notes == [f"{at}.port: only an auto-started server's; ignored without auto_start"]
    # neither: the recipe needs dj-process, as before
    said = problems()
    assert "not built natively" in said["data_processor.experience_pipeline.operators[0].args"]
    # a recipe of ops built here needs no server: an unreachable one is only noted unused
    recipe.write_text("process:\n  - text_length_filter: {min_len: 1, text_key: prompt_text}\n")
    assert problems(server_url="http://127.0.0.1:9", port=5005) == {}
    assert any("no server is started or used" in n for n in notes)


# -- a real Data-Juicer ------------------------------------------------------------------------


@pytest.mark.slow  # a real Data-Juicer's start: about 20 s and more on 2 cores
@pytest.mark.skipif(
    not os.environ.get("TRINITY_TEST_DJ_PROCESS"),
    reason="set TRINITY_TEST_DJ_PROCESS to a real dj-process (make setup-data-juicer)",
)
def test_a_real_data_juicer_server_pays_its_start_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(DJ_ENV, os.environ["TRINITY_TEST_DJ_PROCESS"])
    from trinity.config.side_schema import DataJuicerServiceConfig

    srv = DataJuicerServer.from_config(DataJuicerServiceConfig(auto_start=True), tmp_path)
    rows = [
        {"text": "ab", "i": 0},  # shorter than 5
        {"text": "hello world, a longer text", "i": 1},  # 26 > 20 characters
        {"text": "mail me: a@b.com", "i": 2},  # 16: kept, its e-mail address cleaned
    ]
    ops = [("text_length_filter", {"min_len": 5, "max_len": 20}), ("clean_email_mapper", {})]
    runner = RecipeRunner(ops, timeout_s=600)
    try:
        t0 = time.perf_counter()
        srv.start()
        started = time.perf_counter() - t0
        pid, times = srv.pid, []
        for _ in range(2):
            t0 = time.perf_counter()
            kept, _ = asyncio.run(runner.process(rows, OpContext(data_juicer=srv)))
            times.append(time.perf_counter() - t0)
            assert kept == [{"text": "mail me: ", "i": 2}]
            assert srv.pid == pid == health(srv.url)["pid"] and srv.restarts == 0
    finally:
        srv.stop()
    with capsys.disabled():
        print(
            f"\nreal Data-Juicer server: start {started:.1f} s, first recipe {times[0]:.1f} s, "
            f"second {times[1]:.1f} s (pid {pid} both)"
        )


@pytest.mark.slow  # a whole run
def test_a_run_starts_one_server_for_its_steps_and_stops_it(tmp_path):
    """Trinity-RFT's experience-pipeline example with a recipe of a stand-in op and
    `auto_start`: the explorer starts the server, every step's recipe goes to it, and it is gone
    when the run ends."""
    import re

    from test_e2e import run_trinity
    from test_pipeline_examples import ROOT, tiny_copy, write

    path, cfg = tiny_copy("grpo_gsm8k_experience_pipeline.yaml", tmp_path)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("process:\n  - stamp_pid: {}\n")
    cfg["data_processor"]["experience_pipeline"]["operators"][0]["args"]["config_path"] = str(
        recipe
    )
    cfg["service"] = {"data_juicer": {"auto_start": True, "python": sys.executable}}
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{STAND_IN}"}
    r = run_trinity(write(path, cfg), env_extra=env, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    [pid] = re.findall(r"Data-Juicer server \(pid (\d+)\) at http://127\.0\.0\.1:\d+", r.stdout)
    assert not alive(int(pid))
    [log] = (tmp_path / "ckpt").rglob("data_juicer/server.log")
    assert log.read_text().count('"POST /process HTTP/1.1" 200') == 2  # 2 steps, one server
