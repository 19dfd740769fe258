"""PPO with a critic, GRPO, DAPO, GSPO and CISPO each raise the quickstart's reward.

One SFT run (the quickstart's first stage, shortened) gives a model that gets part of the sums
right; each algorithm then runs the quickstart's RL stage from it, with only `algorithm_type`
changed (PPO's critic learns at the actor's lr; DAPO without its overlong penalty, whose zone
would cover the longest right answer in this 6-token budget), and must raise the rollout reward:
the mean of its last 5 steps above that of its first 5 by a clear margin.

The stage is cut to 30 steps at a constant lr after a 3-step warm-up: the quickstart's 20-step
warm-up and cosine, squeezed into 25 steps, left only a few steps at full lr, and DAPO's rise
(+0.04 on seed 0) fell inside the step-to-step noise. At 30 steps, each of the five rose by
+0.13 to +0.23 on seeds 0 and 1 (5-step means; one step's mean over 16 tasks × 8 samples moves
by about ±0.06), DAPO's measured over every sample drawn (`rollout/*`), not only the groups
its dynamic sampling keeps, which stay near 0.6 while the policy improves.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import yaml
from test_e2e import ROOT, run_trinity

CONFIG = ROOT / "examples" / "quickstart" / "quickstart.yaml"
STEPS = 30
pytestmark = pytest.mark.long  # a learning curve each: `make test-long`


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def write(config: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory) -> tuple[Path, dict, dict]:
    """(the SFT checkpoint, the base config, the RL stage) of a shortened quickstart."""
    work = tmp_path_factory.mktemp("learn_sft")
    base = yaml.safe_load(CONFIG.read_text())
    base["cluster"] = {"ray_address": "local"}  # its own Ray: never join another run's
    base["project"] = "learn_algorithms"
    sft_stage, rl_stage = base.pop("stages")
    base["checkpoint_root_dir"] = str(work / "ckpt")
    base["buffer"]["explorer_input"]["eval_tasksets"] = []  # reward is the measure here
    base["explorer"]["eval_on_startup"] = False
    sft_stage["buffer"]["total_steps"] = 400
    sft_stage["algorithm"]["optimizer"]["lr_scheduler_type"] = "constant"
    cfg = {**base, "name": "sft", "stages": [sft_stage]}
    r = run_trinity(write(cfg, work / "sft.yaml"), timeout=1500, cache=work / "cache")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ckpt = work / "ckpt" / base["project"] / "sft" / "global_step_400"  # one stage: no subfolder
    assert ckpt.is_dir(), sorted((work / "ckpt").rglob("global_step_*"))
    return ckpt, base, rl_stage


@pytest.mark.parametrize("algorithm", ["ppo", "grpo", "dapo", "gspo", "cispo", "grpo_bf16_state"])
def test_the_algorithm_raises_the_quickstart_reward(sft_model, tmp_path, algorithm) -> None:
    """`grpo_bf16_state`: GRPO with AdamW's moments in bf16 (algorithm.optimizer.state_dtype)."""
    ckpt, base, rl_stage = sft_model
    stage = json.loads(json.dumps(rl_stage))
    stage["algorithm"]["algorithm_type"] = algorithm.removesuffix("_bf16_state")
    stage["buffer"]["total_steps"] = STEPS
    stage["buffer"]["batch_size"] = 16
    stage["explorer"]["eval_interval"] = 0
    stage["algorithm"]["optimizer"].update(lr_warmup_steps=3, lr_scheduler_type="constant")
    if algorithm.endswith("_bf16_state"):
        stage["algorithm"]["optimizer"]["state_dtype"] = "bfloat16"
    if algorithm == "ppo":  # its default critic lr (1e-5) is for billion-parameter critics
        stage["trainer"] = {"critic": {"optimizer": {"lr": stage["algorithm"]["optimizer"]["lr"]}}}
    if algorithm == "dapo":  # the 6-token budget is the longest right answer: no overlong zone
        stage["algorithm"]["overlong_penalty"] = {"enable": False}
    cfg = {**base, "name": algorithm, "stages": [stage],
           "checkpoint_root_dir": str(tmp_path / "ckpt")}  # fmt: skip
    cfg["model"] = {**base["model"], "model_path": str(ckpt)}
    r = run_trinity(write(cfg, tmp_path / f"{algorithm}.yaml"), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rewards = [
        rec["rollout/reward_mean"]
        for rec in metrics(tmp_path / "ckpt" / base["project"] / algorithm)
        if "rollout/reward_mean" in rec
    ]
    assert len(rewards) == STEPS
    first, last = statistics.fmean(rewards[:5]), statistics.fmean(rewards[-5:])
    assert last > first + 0.05, (algorithm, first, last, rewards)
