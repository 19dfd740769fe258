"""What durability costs: SQLite log transactions per second, `synchronous` NORMAL vs FULL, and
a checkpoint save with and without its fsyncs.

    .venv/bin/python benchmarks/buffer_durability.py [--rows 256] [--tokens 512] [--dir PATH]

The queue storage makes one transaction per explorer write (a step's experiences and its cursor),
one per trainer read (the lease) and one per ack (`trinity/buffer/sqlite_log.py`). Each is timed
here on `SQLiteLog` itself, for a single experience per transaction (the worst case: the cost is
per transaction) and for a step-sized batch, with the log's old setting (NORMAL: a transaction
survives a process crash, not a power loss) and its current one (FULL: it survives both). Every
row is written, leased and acked once, as in a run. The log lives in `--dir` (default: a
temporary folder under benchmarks/results, on the disk checkpoints go to; a tmpfs would hide the
fsync). Prints a table and writes benchmarks/results/buffer_durability.json.

Checkpoint rows: `save_hf_checkpoint` of the `10m` tiny model with an optimizer-sized trainer
state (two fp32 copies of the weights, as AdamW keeps), median of 5 saves, as written now
(every file and folder fsynced before the rename) and with the fsync calls replaced by no-ops
(what the save cost before).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trinity.buffer.sqlite_log import SQLiteLog
from trinity.buffer.storage import Cursor
from trinity.common.experience import Experience
from trinity.trainer import checkpoint as ckpt


def experience(i: int, tokens: int) -> Experience:
    prompt = tokens // 4
    return Experience(
        tokens=torch.randint(0, 32000, (tokens,)),
        prompt_length=prompt,
        logprobs=-torch.rand(tokens - prompt),
        reward=float(i % 2),
    )


def run(folder: Path, mode: str, rows: int, batch: int, tokens: int) -> dict[str, float]:
    """Write `rows` experiences `batch` per transaction, lease and ack them `batch` per lease."""
    log = SQLiteLog(folder / f"{mode}_{batch}.db")
    log.conn.execute(f"PRAGMA synchronous={mode}")
    exps = [experience(i, tokens) for i in range(batch)]
    n = rows // batch
    t0 = time.perf_counter()
    ids = []
    for step in range(n):
        ids.append(log.append(exps, Cursor("bench", step, step * batch)))
    t1 = time.perf_counter()
    for lease, step_ids in enumerate(ids, start=1):
        log.lease(step_ids, lease)
    t2 = time.perf_counter()
    for lease in range(1, n + 1):
        log.ack([lease])
    t3 = time.perf_counter()
    counts = log.counts()
    log.close()
    if counts["trained"] != n * batch or counts["trained_twice"]:
        raise RuntimeError(f"{mode}: the log lost or doubled rows: {counts}")
    return {
        "writes_per_s": n / (t1 - t0),
        "leases_per_s": n / (t2 - t1),
        "acks_per_s": n / (t3 - t2),
        "experiences_written_per_s": n * batch / (t1 - t0),
    }


def checkpoint_rows(folder: Path, repeats: int = 5) -> list[dict[str, float | str]]:
    """Median seconds of a checkpoint save with its fsyncs and with them as no-ops."""
    from trinity.models import create_tiny_model, load_model, load_tokenizer

    path = create_tiny_model(folder / "model", preset="10m", seed=0)
    model, tok = load_model(str(path), dtype="float32", device="cpu"), load_tokenizer(str(path))
    weights = model.state_dict()
    state = {
        "optimizer": {k: (torch.zeros_like(v), torch.zeros_like(v)) for k, v in weights.items()}
    }
    mb = 3 * sum(v.numel() * v.element_size() for v in weights.values()) / 2**20
    rows = []
    synced = (ckpt._fsync_file, ckpt._fsync_dir)
    for label in ("fsync (now)", "no fsync (before)"):
        if label.startswith("no"):
            ckpt._fsync_file = ckpt._fsync_dir = lambda p: None
        times = []
        for i in range(repeats):
            t0 = time.perf_counter()
            ckpt.save_hf_checkpoint(model, tok, folder / label[:2], i, 2, state, [i])
            times.append(time.perf_counter() - t0)
        rows.append({"save": label, "mb": mb, "median_s": statistics.median(times)})
    ckpt._fsync_file, ckpt._fsync_dir = synced
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=256, help="experiences per measurement")
    ap.add_argument("--batch", type=int, default=64, help="experiences per step-sized transaction")
    ap.add_argument("--tokens", type=int, default=512, help="tokens per experience")
    ap.add_argument("--dir", default=None, help="where the log files go")
    results = Path(__file__).parent / "results"
    ap.add_argument("--out", default=str(results / "buffer_durability.json"))
    args = ap.parse_args()
    results.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir or results) as tmp:
        for batch in (1, args.batch):
            for mode in ("NORMAL", "FULL"):
                r = run(Path(tmp), mode, args.rows, batch, args.tokens)
                rows.append({"synchronous": mode, "experiences_per_transaction": batch, **r})
        ckpt_rows = checkpoint_rows(Path(tmp))
    head = f"{'synchronous':<12} {'exps/txn':>8} {'writes/s':>10} {'leases/s':>10} {'acks/s':>10} {'exps written/s':>15}"
    print(head)
    for r in rows:
        print(
            f"{r['synchronous']:<12} {r['experiences_per_transaction']:>8} "
            f"{r['writes_per_s']:>10.0f} {r['leases_per_s']:>10.0f} {r['acks_per_s']:>10.0f} "
            f"{r['experiences_written_per_s']:>15.0f}"
        )
    print()
    print(f"{'checkpoint save':<20} {'MB':>6} {'median s':>9}")
    for r in ckpt_rows:
        print(f"{r['save']:<20} {r['mb']:>6.0f} {r['median_s']:>9.3f}")
    meta = {
        "rows": args.rows,
        "tokens": args.tokens,
        "sqlite": __import__("sqlite3").sqlite_version,
        "platform": platform.platform(),
        "dir": str(args.dir or results),
    }
    Path(args.out).write_text(
        json.dumps({"meta": meta, "rows": rows, "checkpoint": ckpt_rows}, indent=2)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
