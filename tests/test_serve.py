"""Mode serve with a train process: the example agent (examples/serve/agent.py, only the `openai`
client) drives episodes, posts rewards and commits; the trainer learns from them; the endpoint
takes the new weights (slow: two `trinity` processes on a private cluster)."""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
import time

import pytest
from test_topologies import ROOT, assert_clean, config, counts

from tests.ray_cluster import private_cluster

pytestmark = pytest.mark.slow

GROUP = 4  # sessions committed with one group: GRPO compares them
TRAIN_STEPS = 3


def popen(cmd: str, cfg, cluster, *sets: str) -> subprocess.Popen:
    args = [a for s in [*sets, f"cluster.ray_address={cluster.address}"] for a in ("--set", s)]
    return subprocess.Popen(
        [sys.executable, "-m", "trinity.cli", cmd, "--config", str(cfg), *args],
        cwd=ROOT,
        env={**cluster.env, "TRINITY_CACHE_DIR": str(cfg.parent / "cache")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def lines_of(p: subprocess.Popen) -> queue.Queue:
    """The process's output lines, read in a thread (so reading never blocks the test)."""
    q: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in p.stdout:  # type: ignore[union-attr]
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def url_of(out: queue.Queue, seen: list[str], bound_s: float = 240) -> str:
    """The endpoint URL a `trinity serve` prints, read from its output lines `out` (each kept
    in `seen`, shown when it ends first) within `bound_s` s."""
    deadline = time.time() + bound_s
    while True:
        line = out.get(timeout=max(1, deadline - time.time()))
        assert line is not None, "".join(seen)[-4000:]
        seen.append(line)
        if m := re.search(r"serving .* at (http://\S+/v1)", line):
            return m.group(1)


def test_an_openai_client_agent_is_trained_through_serve_mode(tmp_path, tiny_model_dir):
    cfg = config(
        tmp_path,
        tiny_model_dir,
        "serve",
        "synchronizer: {sync_method: checkpoint}\n",
    )
    with private_cluster() as cluster:
        server = popen(
            "serve", cfg, cluster,
            "explorer.api_port=0", "explorer.service_status_check_interval=1",
            "explorer.feedback_window=120",
        )  # fmt: skip
        out, seen = lines_of(server), []
        url = url_of(out, seen, bound_s=180)
        trainer = popen(
            "run", cfg, cluster,
            "mode=train", f"buffer.total_steps={TRAIN_STEPS}",
            f"buffer.train_batch_size={2 * GROUP}", "trainer.save_interval=1",
        )  # fmt: skip
        # the example agent (docs/agentic.md): the openai client, /feedback, /commit
        agent = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "serve" / "agent.py"), "--url", url,
             "--batches", str(TRAIN_STEPS), "--groups", "2", "--group-size", str(GROUP)],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert agent.returncode == 0, agent.stderr[-3000:]
        versions = json.loads(agent.stdout.strip().splitlines()[-1])["versions"]
        t_out, _ = trainer.communicate(timeout=600)
        server.wait(timeout=120)
        s_out = "".join(seen) + "".join(iter(out.get, None))
        assert trainer.returncode == 0, t_out[-4000:]
        assert server.returncode == 0, s_out[-4000:]
    assert re.search(r"the trainer (has )?finished", s_out), s_out[-3000:]
    # the weights version the agent saw rose as the trainer published: batch k saw v(k-1)
    per_batch = 2 * GROUP * 2  # sessions x calls
    assert versions == [k for k in range(TRAIN_STEPS) for _ in range(per_batch)], versions
    c = counts(cfg)
    assert_clean(c, trained=TRAIN_STEPS * 2 * GROUP)
