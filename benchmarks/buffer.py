"""Experience storage throughput: queue, sql on SQLite and sql on PostgreSQL, in one run.

    .venv/bin/python benchmarks/buffer.py [--experiences 20000] [--batch 64] [--tokens 64]
        [--pg-url postgresql://...]

Each storage is driven as a run drives it, through its async API in one process: the write
phase appends `--experiences` tiny synthetic experiences (`--tokens` tokens, half prompt, with
logprobs) `--batch` per `write` call, each call with an explorer cursor (one transaction); the
read phase takes them `--batch` per `read` (a lease) and acks each lease (one transaction each).
Each storage runs `--repeats` rounds (a fresh file or buffer each, the storages interleaved) and
the median of each rate is shown; every round is in the JSON.
Experiences are built packed (`Experience.from_dict`), as the buffer's process receives them.
Targets on 2 cores: queue >= 20,000/s, SQLite >= 5,000/s, PostgreSQL >= 2,000/s (each phase).

Durability is each storage's own: the queue's SQLite log and sql on SQLite at synchronous=FULL
(one fsync per transaction), on a real disk (a temporary folder under /tmp, not a tmpfs where
one is mounted elsewhere); PostgreSQL with its defaults (fsync on, synchronous commit), a private
server started here (`tests/postgres.py`) unless `--pg-url` names one. Prints a table and writes
benchmarks/results/buffer.json, with the load average at the start (a shared machine's numbers
are measured under load).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from trinity.buffer.queue import QueueStorage  # noqa: E402
from trinity.buffer.sql import SQLStorage  # noqa: E402
from trinity.buffer.storage import Cursor  # noqa: E402
from trinity.common.experience import Experience  # noqa: E402


def experiences(n: int, tokens: int) -> list[Experience]:
    prompt = tokens // 2
    return [
        Experience.from_dict({
            "tokens": [(i * 31 + k) % 32000 for k in range(tokens)],
            "prompt_length": prompt,
            "logprobs": [-0.5] * (tokens - prompt),
            "reward": float(i % 2),
            "eid": {"batch": i // 64, "task": i % 64},
        })
        for i in range(n)
    ]  # fmt: skip


async def drive(storage: object, exps: list[Experience], batch: int) -> dict[str, float]:
    """Write every experience `batch` per call, then read and ack them `batch` per lease."""
    n = len(exps)
    t0 = time.perf_counter()
    for step, at in enumerate(range(0, n, batch)):
        await storage.write(exps[at : at + batch], Cursor("bench", step + 1, at + batch))
    t1 = time.perf_counter()
    got = 0
    while got < n:
        lease = await storage.read(min(batch, n - got), timeout=60)
        got += len(lease.experiences)
        await storage.ack([lease.id])
    t2 = time.perf_counter()
    counts = await storage.stats()
    assert counts["trained"] == n and counts["pending"] == 0, counts
    return {
        "write_per_s": n / (t1 - t0),
        "read_ack_per_s": n / (t2 - t1),
        "both_per_s": n / (t2 - t0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiences", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="rounds per storage; the median shown")
    ap.add_argument("--pg-url", default=None, help="a PostgreSQL database to use (default: own)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/buffer.json")
    args = ap.parse_args()
    exps = experiences(args.experiences, args.tokens)
    gc.collect()
    gc.freeze()  # the experiences are not the collector's work during the timed phases
    load = os.getloadavg()
    folder = Path(tempfile.mkdtemp(prefix="buffer_bench", dir="/tmp"))
    server = None
    if args.pg_url is None:
        from postgres import PostgresServer

        server = PostgresServer(fast=False)
        server.start()
    try:
        pg = args.pg_url or server.create_database("bench")
        cap = args.experiences
        storages = {
            "queue": lambda: QueueStorage(folder / f"queue{time.time_ns()}.db", cap),
            "sql (SQLite)": lambda: SQLStorage(str(folder / f"sql{time.time_ns()}.sqlite"), cap),
            "sql (PostgreSQL)": lambda: SQLStorage(pg, cap, name=f"bench/{time.time_ns()}"),
        }
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in storages}
        for _ in range(args.repeats):  # interleaved: a burst of other load hits every storage
            for name, make in storages.items():
                storage = make()
                runs[name].append(asyncio.run(drive(storage, exps, args.batch)))
                if isinstance(storage, SQLStorage):
                    storage.shutdown()
        rows = {
            name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            for name, rs in runs.items()
        }
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{args.experiences} experiences of {args.tokens} tokens, {args.batch} per call, "
          f"median of {args.repeats}; load average at start {load[0]:.2f}")  # fmt: skip
    print(f"{'storage':<18} {'write/s':>10} {'read+ack/s':>11} {'both/s':>9}")
    for name, r in rows.items():
        print(
            f"{name:<18} {r['write_per_s']:>10,.0f} {r['read_ack_per_s']:>11,.0f} "
            f"{r['both_per_s']:>9,.0f}"
        )
    result = {
        "benchmark": "buffer",
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_average_at_start": list(load),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "pg_url")},
        "results": rows,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
