"""Curricula (`trinity.tasks.curriculum`): BOTS's posterior update by hand and against
Trinity-RFT's formula, selection near the target, easy-to-hard order, and a selector's state
surviving a resume bit-exactly through the buffer's cursor."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_one_process import _cfg

from trinity.buffer.queue import QueueStorage
from trinity.config.preflight import _selector_problems
from trinity.tasks.curriculum import BetaPassRates
from trinity.tasks.selector import TaskStream, make_selector
from trinity.tasks.task import Task


def tasks(*rows: dict) -> list[Task]:
    return [Task(index=i, raw=row, prompt=f"q{i}", taskset_name="t") for i, row in enumerate(rows)]


# -- the posterior --------------------------------------------------------------------------------


def test_the_posterior_update_by_hand_without_reference_columns():
    """n = 3, m = 4, λ = ρ = 0.5; task 0 passes 3 of 4: p̃ = 0.75 for every task (the step's
    mean), then task 0: α = 0.5·1 + 0.5 + 0.5·3 + 0.5·4·0.75 = 4, β = 0.5 + 0.5 + 0.5·1 +
    0.5·4·0.25 = 2; tasks 1, 2: α = 1 + 1.5 = 2.5, β = 1 + 0.5 = 1.5."""
    rates = BetaPassRates(3, m=4, lamb=0.5, rho=0.5)
    rates.update([0], [0.75])
    assert rates.alphas.tolist() == [4.0, 2.5, 2.5] and rates.betas.tolist() == [2.0, 1.5, 1.5]
    assert rates.pass_rates().tolist() == [4 / 6, 2.5 / 4, 2.5 / 4]


def test_one_reference_column_shifts_by_the_policys_offset():
    """f = [0.2, 0.7]; task 0 passes at 0.5: offset c = 0.3, so task 1 is predicted 1.0."""
    rates = BetaPassRates(2, np.array([[0.2], [0.7]]), m=4, lamb=0.5, rho=0.5)
    rates.update([0], [0.5])
    assert rates.cap == pytest.approx(0.3)
    assert rates.alphas[1] == pytest.approx(0.5 + 0.5 + 0.5 * 4 * 1.0)  # p̃ = clip(0.7 + 0.3)


def trinity_rft_update(alphas, betas, features, cap, m, lamb, rho, indices, rates):
    """Trinity-RFT's InterpolationBetaPREstimator.update (two reference columns), written out
    from its formula as the reference."""
    anchors = features[indices].mean(axis=0)
    est = (np.mean(rates) - anchors[0]) / (anchors[1] - anchors[0] + 1e-6)
    cap = est if cap is None else 0.9 * cap + 0.1 * est
    s, f = np.zeros(len(alphas)), np.zeros(len(alphas))
    s[indices], f[indices] = np.array(rates) * m, (1 - np.array(rates)) * m
    p = np.clip((features[:, 1] - features[:, 0]) * cap + features[:, 0], 0, 1)
    p[indices] = rates
    alphas = (1 - lamb) * alphas + lamb + (1 - rho) * s + rho * p * m
    betas = (1 - lamb) * betas + lamb + (1 - rho) * f + rho * (1 - p) * m
    return alphas, betas, cap


def test_two_reference_columns_update_as_trinity_rfts_interpolation():
    rng = np.random.default_rng(0)
    features = np.sort(rng.uniform(0, 1, (20, 2)), axis=1)
    ours = BetaPassRates(20, features, m=8, lamb=0.1, rho=0.1)
    alphas, betas, cap = np.ones(20), np.ones(20), None
    for _ in range(5):
        idx = rng.choice(20, 6, replace=False).tolist()
        rates = (rng.integers(0, 9, 6) / 8).tolist()
        ours.update(idx, rates)
        alphas, betas, cap = trinity_rft_update(
            alphas, betas, features, cap, 8, 0.1, 0.1, idx, rates
        )
    np.testing.assert_allclose(ours.alphas, alphas, rtol=1e-12)
    np.testing.assert_allclose(ours.betas, betas, rtol=1e-12)


# -- selection ---------------------------------------------------------------------------------------


def difficulty(**kwargs) -> object:
    cfg = {"selector_type": "difficulty_based", "seed": 3, "kwargs": kwargs}
    return make_selector(SimpleNamespace(**cfg, feature_keys=kwargs.pop("feature_keys", [])))


def test_tau_0_takes_the_tasks_nearest_the_target_and_learns_from_feedback():
    stream = TaskStream(difficulty(target_reward=0.5, tau=0, m=4), tasks(*[{}] * 6), 2, 1)
    assert [t.index for t in (next(stream), next(stream))] == [0, 1]  # all 0.5: index order
    stream.feedback([0, 1, 2, 3], [1.0, 1.0, 0.0, 0.5])  # 3 sits at the target
    batch = [next(stream).index, next(stream).index]
    assert batch[0] == 3 and 2 not in batch[1:] and 0 not in batch and 1 not in batch


@pytest.mark.parametrize("staleness", [0.0, 0.5])
def test_a_stream_resumed_from_its_state_continues_bit_exactly(staleness):
    """A difficulty-based stream with sampled pass rates and a temperature (and half of each
    batch drawn by staleness), its state taken mid-batch (JSON, as the cursor stores it),
    continues exactly as the uninterrupted one."""
    kwargs = {"tau": 0.5, "do_sample": True, "target_reward": 0.5, "staleness_coef": staleness}

    def run(stop: int | None) -> tuple[list[int], dict | None]:
        s = TaskStream(difficulty(**kwargs), tasks(*[{}] * 12), 4, 3)
        out = []
        for k in range(20):
            out.append(next(s).index)
            if k % 4 == 3:
                s.feedback(out[-4:], [float(i % 3 == 0) for i in out[-4:]])
            if stop is not None and k == stop:
                return out, json.loads(json.dumps(s.state_dict()))
        return out, None

    whole, _ = run(None)
    head, state = run(9)  # two batches and a half: pending holds the rest of the third
    assert state["pending"] and state["taken"] == 10
    resumed = TaskStream(difficulty(**kwargs), tasks(*[{}] * 12), 4, 3)
    resumed.resume(10, state)
    tail = []
    for k in range(10, 20):
        tail.append(next(resumed).index)
        if k % 4 == 3:
            seen = (head + tail)[-4:]
            resumed.feedback(seen, [float(i % 3 == 0) for i in seen])
    assert head + tail == whole
    fresh = TaskStream(difficulty(), tasks(*[{}] * 12), 4, 3)
    with pytest.raises(ValueError, match="resuming it needs its state at the cursor"):
        fresh.resume(10, None)


class RecordingRng:
    """Stands in for numpy's Generator in `_stalest`: records the probabilities of the draw
    and returns the first `size` candidates by index."""

    def choice(self, n, size, replace, p):
        self.p = p.tolist()
        return np.flatnonzero(p)[:size]


def test_staleness_draws_its_share_by_steps_since_each_task_was_last_seen():
    """6 tasks, batches of 4, staleness_coef 0.5: 2 by score, 2 by staleness. After steps 1
    (tasks 0-3 seen) and 2 (tasks 2, 3 seen), c = 3 and staleness c - C_l is 2, 2, 1, 1, 3, 3;
    with tasks 2, 3 the closest to the target, the other four are drawn with probabilities
    2/10, 2/10, 0, 0, 3/10, 3/10."""
    sel = difficulty(target_reward=0.5, tau=0, m=4, staleness_coef=0.5)
    sel.prepare(tasks(*[{}] * 6))
    sel.feedback([0, 1, 2, 3], [1.0, 0.0, 0.5, 0.5])
    sel.feedback([2, 3], [0.5, 0.5])
    assert sel.last_seen.tolist() == [1, 1, 2, 2, 0, 0]
    rng = RecordingRng()
    assert sel._stalest(np.array([2, 3]), 2, rng) == [0, 1]
    assert rng.p == pytest.approx([0.2, 0.2, 0.0, 0.0, 0.3, 0.3])
    batch = sel.next_batch(6, 4, 2)
    assert batch[:2] == [2, 3] and len(set(batch)) == 4 and not {2, 3} & set(batch[2:])
    assert sel.next_batch(6, 4, 2) == batch  # the same batch number draws the same batch
    with pytest.raises(ValueError, match="staleness_coef must be in"):
        difficulty(staleness_coef=1.5)


def test_without_staleness_a_task_estimated_solved_is_never_drawn_again():
    """What staleness is for: tau 0 and target 0.5, task 0 seen passing every sample; with no
    staleness share the next 20 batches of 2 never hold it, with a share of 1/2 they do."""
    for coef, expect in ((0.0, False), (0.5, True)):
        sel = difficulty(target_reward=0.5, tau=0, m=8, lamb=0.1, rho=0.1, staleness_coef=coef)
        sel.prepare(tasks(*[{}] * 5))
        sel.feedback([0], [1.0])
        drawn = set()
        for b in range(20):
            batch = sel.next_batch(5, 2, b)
            sel.feedback(batch, [1.0 if i == 0 else 0.5 for i in batch])
            drawn |= set(batch)
        assert (0 in drawn) is expect


def test_offline_easy2hard_serves_the_highest_features_first():
    rows = [{"acc": 0.2, "len": 1}, {"acc": 0.9, "len": 5}, {"acc": 0.2, "len": 7}, {"acc": 0.5}]
    sel = make_selector({"selector_type": "offline_easy2hard", "feature_keys": ["acc"]})
    order = [t.index for b in sel.batches(tasks(*rows), 4, 2) for t in b]
    assert order == [1, 3, 2, 0] * 2  # ties: the later task first, as Trinity-RFT's
    nested = tasks({"m": {"p": 0.1}}, {"m": {"p": 0.8}})
    sel = make_selector({"selector_type": "offline_easy2hard", "feature_keys": ["m.p"]})
    assert [t.index for b in sel.batches(nested, 2) for t in b] == [1, 0]
    with pytest.raises(ValueError, match="task 3 of 't' has no 'len'"):
        make_selector({"selector_type": "offline_easy2hard", "feature_keys": ["len"]}).prepare(
            tasks(*rows)
        )


def test_selector_settings_are_checked_before_the_run():
    storage = _cfg().buffer.explorer_input.taskset
    ok = storage.model_copy(update={"data_selector": storage.data_selector.model_copy(
        update={"selector_type": "difficulty_based", "kwargs": {"tau": 0, "m": 8}})})  # fmt: skip
    assert _selector_problems("t", ok, 0) == []
    assert "not a dataset" in str(_selector_problems("t", ok, 0, explored=False)[0])
    bad = ok.model_copy(update={"data_selector": ok.data_selector.model_copy(
        update={"kwargs": {"temperature": 1}})})  # fmt: skip
    assert "unexpected keyword argument 'temperature'" in str(_selector_problems("t", bad, 0)[0])
    stale = ok.model_copy(update={"data_selector": ok.data_selector.model_copy(
        update={"kwargs": {"staleness_coef": 2}})})  # fmt: skip
    assert "staleness_coef must be in [0, 1], got 2" in str(_selector_problems("t", stale, 0)[0])
    three = ok.model_copy(update={"data_selector": ok.data_selector.model_copy(
        update={"kwargs": {}, "feature_keys": ["a", "b", "c"]})})  # fmt: skip
    with pytest.raises(ValueError, match="0, 1 or 2 feature_keys, not 3"):
        TaskStream(make_selector(three.data_selector), tasks(*[{"a": 0, "b": 0, "c": 0}] * 2), 1, 1)


@pytest.mark.long  # a whole run (about 20 s on 2 cores)
def test_a_run_with_difficulty_based_selection_keeps_its_state_at_the_cursor(
    tmp_path, tiny_model_dir
):
    from test_e2e import grpo_config, run_trinity

    cfg = grpo_config(tmp_path, tiny_model_dir)
    text = cfg.read_text().replace(
        "      format: {prompt_key: question, response_key: answer}\n",
        "      format: {prompt_key: question, response_key: answer}\n"
        "      data_selector: {selector_type: difficulty_based,\n"
        "        kwargs: {m: 4, target_reward: 0.5, tau: 0.5, do_sample: true}}\n",
        1,
    )
    assert "difficulty_based" in text
    cfg.write_text(text)
    r = run_trinity(cfg)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    buffer = tmp_path / "ckpt/e2e/grpo/buffer/exp.db"
    cursor = asyncio.run(QueueStorage(buffer).cursor("explorer"))
    assert cursor is not None and cursor.step == 3 and cursor.selector["taken"] == 12
    learned = cursor.selector["selector"]
    assert len(learned["alphas"]) == 40  # learned from three steps (a failing task: β grows)
    assert learned["alphas"] != [1.0] * 40 or learned["betas"] != [1.0] * 40


def _difficulty_run(tmp_path, tiny_model_dir, total_steps: int, resume: bool = False):
    """`grpo_config` with BOTS's selector (sampled posteriors, a temperature) for `total_steps`
    steps, a checkpoint every 2; returns the explorer's cursor and the run's folder."""
    from test_e2e import grpo_config, run_trinity

    cfg = grpo_config(tmp_path, tiny_model_dir)
    cfg.write_text(
        cfg.read_text().replace(
            "      format: {prompt_key: question, response_key: answer}\n",
            "      format: {prompt_key: question, response_key: answer}\n"
            "      data_selector: {selector_type: difficulty_based,\n"
            "        kwargs: {m: 4, target_reward: 0.5, tau: 0.5, do_sample: true}}\n",
            1,
        )
    )
    sets = [f"buffer.total_steps={total_steps}", "trainer.save_interval=2"]
    r = run_trinity(cfg, overrides=[*sets, "continue_from_checkpoint=true"] if resume else sets)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    run_dir = tmp_path / "ckpt/e2e/grpo"
    cursor = asyncio.run(QueueStorage(run_dir / "buffer/exp.db").cursor("explorer"))
    return cursor, run_dir, r.stdout


@pytest.mark.slow  # three whole runs (about 60 s on 2 cores)
def test_a_resumed_run_selects_and_learns_as_the_uninterrupted_one(tmp_path, tiny_model_dir):
    """4 steps in one run, against 2 steps then a resume to 4: the selector's posterior at the
    end, the tasks each step explored and the trained weights are the same, bit for bit."""
    from safetensors.torch import load_file

    (tmp_path / "whole").mkdir()
    (tmp_path / "cut").mkdir()
    whole, whole_dir, _ = _difficulty_run(tmp_path / "whole", tiny_model_dir, 4)
    half, _, _ = _difficulty_run(tmp_path / "cut", tiny_model_dir, 2)
    assert half.step == 2 and half.selector["taken"] == 8
    resumed, cut_dir, out = _difficulty_run(tmp_path / "cut", tiny_model_dir, 4, resume=True)
    assert "resuming stage main from" in out
    assert whole.step == resumed.step == 4 and whole.selector["taken"] == 16
    assert resumed.selector == whole.selector  # the posteriors, exactly (JSON floats)
    assert half.selector["selector"] != whole.selector["selector"]  # steps 3, 4 moved them

    def explored(run_dir) -> list[tuple]:
        recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        keys = ("rollout/reward_mean", "train/loss", "experience_pipeline/selection/valid_ratio")
        return [(r["step"], *(r.get(k) for k in keys)) for r in recs if "train/loss" in r]

    assert explored(cut_dir) == explored(whole_dir) and len(explored(whole_dir)) == 4
    wa = load_file(whole_dir / "global_step_4" / "model.safetensors")
    wb = load_file(cut_dir / "global_step_4" / "model.safetensors")
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
