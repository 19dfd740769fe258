"""How fast this machine multiplies matrices today: a yardstick printed beside wall times.

    .venv/bin/python benchmarks/machine_speed.py            # 1024² fp32 matmul on 2 threads

Machines of one kind differ in speed by up to 2x from one day to the next, so a wall time means
little alone. The median GFLOP/s of a 1024 × 1024 fp32 matmul (2·1024³ flops) on `--threads`
torch threads, over `--repeats` timed runs after a warm-up, places a reader's machine beside the
one a number was measured on. `benchmarks/quickstart_seeds.py` records it before every seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def matmul_gflops(n: int = 1024, threads: int = 2, repeats: int = 30) -> float:
    """Median GFLOP/s of an n × n fp32 matmul on `threads` torch threads."""
    import torch

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    for _ in range(5):  # warm-up: thread pool, caches, frequency
        torch.mm(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    gflops = matmul_gflops(args.n, args.threads, args.repeats)
    if args.json:
        print(json.dumps({"n": args.n, "threads": args.threads, "gflops": gflops}))
    else:
        print(f"{args.n}² fp32 matmul on {args.threads} threads: {gflops:.0f} GFLOP/s (median)")


if __name__ == "__main__":
    main()
