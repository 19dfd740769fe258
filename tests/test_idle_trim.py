"""`IdleTrim` hands a process's freed heap back to the OS once it idles (common/memory.py).

Run in a fresh process each (a process's heap is its history): the work grows 30 tensors by one
step 64 times, as the engine's KV cache does, twice, and frees them. Without the trim glibc keeps
the freed blocks (RSS stays hundreds of MB above the start); with it, one idle period later the
RSS is back within 100 MB of where it started.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

WORK = textwrap.dedent("""
    import json, re, sys, time
    import torch
    from trinity.common.memory import IdleTrim

    torch.set_num_threads(1)

    def rss_mb():
        return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024

    trim = IdleTrim(idle_s=0.2) if sys.argv[1] == "trim" else None
    start = rss_mb()
    for _ in range(2):
        with trim.busy() if trim else open("/dev/null"):
            cache = [torch.zeros(64, 3, 40, 64) for _ in range(30)]
            for _ in range(64):
                cache = [torch.cat([k, torch.zeros(64, 3, 1, 64)], dim=2) for k in cache]
            del cache
    time.sleep(1.0)  # idle: the trim thread runs after 0.2 s
    print(json.dumps({"start": start, "idle": rss_mb()}))
""")


def rss(mode: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", WORK, mode], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.long  # a memory trial: two processes grow a 144 MB cache and idle
def test_an_idle_process_gives_its_freed_heap_back():
    kept, trimmed = rss("keep"), rss("trim")
    # the control shows what there is to give back: the cache's last size is 30 x 64 x 3 x 104
    # x 64 x 4 B = 144 MB, and the freed blocks of its growth stay in the heap (~400 MB here)
    assert kept["idle"] - kept["start"] > 200, kept
    assert trimmed["idle"] - trimmed["start"] < 100, trimmed
