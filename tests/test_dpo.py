"""DPO in `mode: train`: preference rows become adjacent (chosen, rejected) experiences, bad rows
are refused by `validate` naming file, line and key, micro-batches never split a pair, and a run
on a generated preference set raises the chosen-over-rejected margin."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_e2e import ROOT, run_trinity

from trinity.algorithm.sample_strategy import SampleContext, best_of_group
from trinity.common.experience import EID, ExperienceKind
from trinity.config import load_config
from trinity.tasks import TasksetError, load_taskset
from trinity.trainer.batch import collate, micro_batches
from trinity.trainer.sft_data import task_to_pair_experiences


def preference_rows(n: int, seed: int = 0) -> list[dict]:
    """`a+b=` prompts; chosen = the sum, rejected = a wrong sum (off by 1..3)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        a, b = (int(x) for x in torch.randint(0, 10, (2,), generator=g))
        off = int(torch.randint(1, 4, (1,), generator=g))
        rows.append({"question": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + off)})
    return rows


def write_config(tmp_path: Path, data: Path, mode: str = "train", steps: int = 2) -> Path:
    cfg = tmp_path / "dpo.yaml"
    cfg.write_text(
        textwrap.dedent(f"""
        mode: {mode}
        project: pref
        name: dpo
        checkpoint_root_dir: {tmp_path / "ckpt"}
        model: {{model_path: "tiny://1m?seed=0", max_response_tokens: 4}}
        algorithm:
          algorithm_type: dpo
          policy_loss_fn_args: {{beta: 0.5}}
          optimizer: {{lr: 2.0e-3, weight_decay: 0.0}}
        buffer:
          train_batch_size: 8
          total_steps: {steps}
          total_epochs: 50
          trainer_input:
            experience_buffer:
              name: prefs
              storage_type: file
              path: {data}
              format: {{prompt_key: question, chosen_key: chosen, rejected_key: rejected}}
        trainer: {{micro_batch_size_per_gpu: 3, use_dynamic_bsz: false}}
        monitor: {{monitor_type: jsonl}}
        """)
    )
    return cfg


def storage(path: Path, **fmt) -> SimpleNamespace:
    cfg = load_config(write_config(path.parent, path))
    s = cfg.buffer.trainer_input.experience_buffer
    return s.model_copy(update={"format": s.format.model_copy(update=fmt)})


def test_preference_rows_load_as_pairs(tmp_path, tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    data = tmp_path / "p.jsonl"
    rows = [
        {"question": "1+1=", "chosen": "2", "rejected": "3"},
        {"question": "2+2=", "chosen": [{"role": "user", "content": "2+2="},
                                        {"role": "assistant", "content": "4"}],
         "rejected": [{"role": "assistant", "content": "5"}]},
    ]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_taskset(storage(data), require_pair=True)
    assert [t.pair for t in tasks] == [("2", "3"), ("4", "5")]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    chosen, rejected = task_to_pair_experiences(tasks[1], tok, None, None)
    # the same prompt, each reply + end-of-turn trained; run 0 = chosen, 1 = rejected
    assert chosen.prompt_length == rejected.prompt_length
    assert torch.equal(
        chosen.tokens[: chosen.prompt_length], rejected.tokens[: chosen.prompt_length]
    )
    assert tok.decode(chosen.response_tokens[:-1]) == "4"
    assert tok.decode(rejected.response_tokens[:-1]) == "5"
    assert (chosen.eid.run, rejected.eid.run) == (0, 1) and chosen.kind is ExperienceKind.DPO


@pytest.mark.parametrize(
    "row, message",
    [
        ({"question": "q", "chosen": "a"}, "no key 'rejected' (format.rejected_key)"),
        ({"question": "q", "chosen": "a", "rejected": "a"}, "identical"),
        ({"question": "q", "chosen": "a", "rejected": [{"role": "user", "content": "x"}]},
         "does not end with an assistant message"),
        ({"question": "q", "chosen": 3, "rejected": "a"}, "must be a non-empty reply text"),
    ],
)  # fmt: skip
def test_bad_preference_rows_name_file_line_and_key(tmp_path, row, message) -> None:
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"question": "q", "chosen": "a", "rejected": "b"}) + "\n")
    data.write_text(data.read_text() + json.dumps(row) + "\n")
    with pytest.raises(TasksetError, match=f"p.jsonl:2.*{re.escape(message)}"):
        load_taskset(storage(data), require_pair=True)


def validate(cfg: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trinity.cli", "validate", "--config", str(cfg)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "TRINITY_CACHE_DIR": str(cfg.parent / "cache")},
    )  # fmt: skip


def test_validate_refuses_bad_pairs_and_dpo_on_rollouts(tmp_path) -> None:
    data = tmp_path / "p.jsonl"
    rows = [*preference_rows(4), {"question": "1+1=", "chosen": "2"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = validate(write_config(tmp_path, data))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "p.jsonl:5" in r.stderr and "format.rejected_key" in r.stderr, r.stderr
    data.write_text("".join(json.dumps(r) + "\n" for r in preference_rows(4)))
    r = validate(write_config(tmp_path, data))
    assert r.returncode == 0, r.stdout + r.stderr
    r = validate(write_config(tmp_path, data, mode="both"))
    assert r.returncode == 2 and "trains on (chosen, rejected) pairs" in r.stderr, r.stderr


def test_micro_batches_keep_pairs_together() -> None:
    exps = [
        SimpleNamespace(
            tokens=torch.arange(2 + n), prompt_length=2, response_length=n, logprobs=None,
            action_mask=torch.ones(n, dtype=torch.bool), reward=None, token_level_reward=None,
            advantages=None, eid=EID(task=i // 2, run=i % 2), info={},
        )
        for i, n in enumerate([1, 3, 2, 2, 5, 1])
    ]  # fmt: skip
    batch = collate(exps, pad_id=0)
    fixed = micro_batches(batch, 3, unit=2)  # 3 rows round up to 2 whole pairs
    assert [g.tolist() for g in fixed] == [[0, 1, 2, 3], [4, 5]]
    # token budget 16: lengths 3, 5 | 4, 4 | 7, 3 → pairs of longest 5, 4, 7: 5·2 + ... packs
    # (0, 1) and (2, 3) as 4 rows × longest 5 = 20 > 16, so each pair alone
    budget = micro_batches(batch, 1, max_tokens=16, unit=2)
    assert [g.tolist() for g in budget] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError, match="units of 2"):
        micro_batches(collate(exps[:3], pad_id=0), 2, unit=2)


def test_best_of_group_keeps_each_tasks_best() -> None:
    def e(task, run, reward):
        return SimpleNamespace(eid=EID(task=task, run=run), reward=reward)

    exps = [e(0, 0, 0.0), e(1, 0, 1.0), e(0, 1, 1.0), e(0, 2, 1.0), e(1, 1, 0.5), e(2, 0, None)]
    picked = best_of_group(exps, SampleContext())
    assert [(x.eid.task, x.eid.run) for x in picked] == [(0, 1), (1, 0), (2, 0)]  # first of ties
    assert [
        (x.eid.task, x.eid.run) for x in best_of_group(exps, SampleContext(), min_reward=1.0)
    ] == [
        (0, 1),
        (1, 0),
    ]


@pytest.mark.long  # a learning curve: 12 DPO steps of a whole run
def test_dpo_mode_train_raises_the_chosen_over_rejected_margin(tmp_path) -> None:
    data = tmp_path / "prefs.jsonl"
    # 16 pairs, 8 a batch: 12 steps are 6 epochs. Measured in-process with these settings
    # (lr 2e-3, β 0.5): the margin of the last 4 steps ≈ 2.5 and accuracy ≈ 0.94, from 0 and 0.5
    data.write_text("".join(json.dumps(r) + "\n" for r in preference_rows(16)))
    r = run_trinity(write_config(tmp_path, data, steps=12), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "pref" / "dpo"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [rec for rec in records if "train/dpo_loss" in rec]
    assert len(trained) == 12
    # step 1 sees π_θ = π_ref: margin 0 and loss log 2 exactly (before its update)
    assert abs(trained[0]["train/reward_margin"]) < 1e-6
    assert abs(trained[0]["train/dpo_loss"] - 0.6931472) < 1e-5
    late = trained[-4:]
    margin = sum(x["train/reward_margin"] for x in late) / len(late)
    accuracy = sum(x["train/reward_accuracy"] for x in late) / len(late)
    assert margin > 0.5 and accuracy > 0.75, (margin, accuracy)
    assert (run_dir / "global_step_12" / "model.safetensors").exists()
