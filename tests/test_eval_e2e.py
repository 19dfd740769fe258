"""Several samples per eval task end to end: a `mode: bench` of a tiny model reports avg@n,
pass@k and maj@k with intervals that agree with its own per-sample records."""

import json
import math
import statistics

import pytest
import yaml
from test_e2e import grpo_config, run_trinity

SAMPLED = {  # the same tasks as add_eval, 4 samples each at temperature 1
    "name": "add_sampled",
    "storage_type": "synthetic",
    "path": "arithmetic",
    "split": "test",
    "generator_args": {"digits": 1, "num_tasks": 8, "seed": 0},
    "format": {"prompt_key": "question", "response_key": "answer"},
    "repeat_times": 4,
    "rollout_args": {"temperature": 1.0},
}


@pytest.mark.slow  # a whole bench run (10-25 s on 2 cores)
def test_eval_repeat_times_reports_pass_at_k_from_its_samples(tmp_path, tiny_model_dir):
    cfg = grpo_config(tmp_path, tiny_model_dir)
    data = yaml.safe_load(cfg.read_text())
    data["buffer"]["explorer_input"]["eval_tasksets"].append(SAMPLED)
    cfg.write_text(yaml.safe_dump(data))
    r = run_trinity(cfg, overrides=["mode=bench", "monitor.detailed_stats=true"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    rec = json.loads((run_dir / "metrics.bench.jsonl").read_text().splitlines()[-1])
    samples = [json.loads(x) for x in (run_dir / "bench.samples.jsonl").read_text().splitlines()]
    mine = [s for s in samples if s["taskset"] == "add_sampled"]
    assert len(mine) == 8 * 4 and not any(s["failed"] for s in mine)  # 4 samples per task
    by_task: dict[int, list[bool]] = {}
    for s in mine:
        by_task.setdefault(s["task"], []).append(s["correct"])
    # reference: Chen et al.'s closed form over the records
    for k in (1, 2, 4):
        want = statistics.fmean(
            1 - math.comb(4 - sum(c), k) / math.comb(4, k) for c in by_task.values()
        )
        got = rec[f"eval/add_sampled/pass@{k}"]
        assert got == pytest.approx(want, abs=1e-9), k
        assert (
            rec[f"eval/add_sampled/pass@{k}_ci_low"]
            <= got
            <= rec[f"eval/add_sampled/pass@{k}_ci_high"]
        )
    acc = statistics.fmean(s["correct"] for s in mine)
    assert rec["eval/add_sampled/avg@4"] == rec["eval/add_sampled/accuracy"] == pytest.approx(acc)
    assert "eval/add_sampled/maj@4" in rec and rec["eval/add_sampled/failed"] == 0.0
    assert "eval/add_sampled/pass@8" not in rec
    # the greedy set: one sample each, pass@1 = avg@1 = accuracy
    assert (
        rec["eval/add_eval/pass@1"] == rec["eval/add_eval/avg@1"] == rec["eval/add_eval/accuracy"]
    )
    # monitor.detailed_stats: the spread over tasks of each task's accuracy
    per_task = [statistics.fmean(c) for c in by_task.values()]
    assert rec["eval/add_sampled/accuracy/std"] == pytest.approx(statistics.pstdev(per_task))
    assert rec["eval/add_sampled/accuracy/min"] == min(per_task)
    assert rec["eval/add_sampled/accuracy/max"] == max(per_task)
