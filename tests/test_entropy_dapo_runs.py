"""Trinity-RFT's entropy (Clip_B, Clip_V) and DAPO math examples train with their own pieces:
their `algorithm` and reward sections as written there, the tiny model and local data put in,
2 steps of `trinity run` each (slow: ~30 s a run)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from test_e2e import run_trinity

pytestmark = pytest.mark.long  # Trinity-RFT's examples, trained: `make test-long`


def metrics(ckpt: Path) -> list[dict]:
    (path,) = ckpt.rglob("metrics.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(("fn", "mu", "repeat"), [("clipb", 2.5, 16), ("clipv", 8.5, 8)])
def test_an_entropy_example_trains_with_its_token_filter(tmp_path, tiny_model_dir, fn, mu, repeat):
    cfg = tmp_path / "entropy.yaml"
    cfg.write_text(
        textwrap.dedent(f"""
        project: math_dapo
        name: {fn}_example
        checkpoint_root_dir: {tmp_path / "ckpt"}
        model: {{model_path: {tiny_model_dir}, max_prompt_tokens: 64, max_response_tokens: 8}}
        algorithm:
          algorithm_type: grpo_verl
          advantage_fn: {fn}
          advantage_fn_args: {{mu: {mu}}}
          repeat_times: {repeat}
          kl_loss_fn_args: {{kl_coef: 0.0}}
        buffer:
          total_steps: 2
          batch_size: 2
          explorer_input:
            taskset:
              name: add
              storage_type: synthetic
              path: arithmetic
              generator_args: {{digits: 1, num_tasks: 8}}
              format: {{prompt_key: question, response_key: answer}}
              rollout_args: {{temperature: 1.0, logprobs: 20}}
            default_workflow_type: math_workflow
            default_reward_fn_type: math_boxed_reward
        synchronizer: {{sync_interval: 1}}
        """)
    )
    r = run_trinity(cfg, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    trained = [m for m in metrics(tmp_path / "ckpt") if "train/advantage/frac_clipped" in m]
    assert len(trained) == 2  # the filter's metrics at both steps: the trainer ran the piece
    assert all(0.0 <= m["train/advantage/frac_clipped"] <= 1.0 for m in trained)


def test_the_dapo_math_example_trains_with_its_reward(tmp_path, tiny_model_dir):
    """math_boxed_workflow + math_dapo_reward with the overlong penalty: L = 8, C = 4, so a
    response of 8 tokens (the cap) costs (4 - 8)/4 = -1 and the penalty reaches the reward."""
    data = tmp_path / "dapo"
    data.mkdir()
    rows = [
        {"prompt": f"What is {a}+{b}?", "solution": str(a + b)} for a in range(3) for b in range(3)
    ]
    (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = tmp_path / "dapo.yaml"
    cfg.write_text(
        textwrap.dedent(f"""
        project: Trinity-RFT-example
        name: dapo
        checkpoint_root_dir: {tmp_path / "ckpt"}
        model: {{model_path: {tiny_model_dir}, max_response_tokens: 8}}
        algorithm:
          algorithm_type: grpo
          repeat_times: 4
          policy_loss_fn_args: {{clip_range_low: 0.2, clip_range_high: 0.28}}
        buffer:
          total_steps: 2
          batch_size: 2
          explorer_input:
            taskset:
              name: dapo-math
              storage_type: file
              path: {data}
              format:
                prompt_key: prompt
                response_key: solution
                system_prompt: 'Solve the following math problem step by step.'
              rollout_args: {{temperature: 1.0, logprobs: 0}}
              workflow_args: {{use_base: true}}
              reward_fn_args:
                enable_overlong_penalty: true
                penalty_factor: 1.0
                max_response_length: 8
                cache_length: 4
            default_workflow_type: math_boxed_workflow
            default_reward_fn_type: math_dapo_reward
        synchronizer: {{sync_interval: 1}}
        """)
    )
    r = run_trinity(cfg, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rollouts = [m for m in metrics(tmp_path / "ckpt") if "rollout/format_score_mean" in m]
    assert len(rollouts) == 2
    for m in rollouts:  # every penalty lies in [-1, 0]; a capped response gets exactly -1
        assert -1.0 <= m["rollout/format_score_mean"] <= 0.0
        assert m["rollout/reward_mean"] == pytest.approx(
            m["rollout/accuracy_mean"] + m["rollout/format_score_mean"]
        )
