"""TrainerRunner: weights are published only for a consumer (fakes stand in for the Ray actors)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trinity.common import refs
from trinity.config import load_config
from trinity.trainer.runner import TrainerRunner


class FakeActor:
    """Records `actor.method.remote(*args)` calls; `ray.get` is the identity in these tests."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(remote=lambda *args: self.calls.append((name, args)))


@pytest.fixture
def fake_ray(monkeypatch):
    """`refs.get` is the identity (a fake's call returns its value) and the memory sync
    method's `refs.put` a stand-in ref."""
    monkeypatch.setattr(refs, "get", lambda x, timeout=None: x)
    monkeypatch.setattr(refs, "put", lambda x, local: "object-ref")


def sft_config(tmp_path, model_dir):
    p = tmp_path / "sft.yaml"
    p.write_text(
        f"mode: train\nmodel: {{model_path: {model_dir}}}\n"
        "algorithm: {algorithm_type: sft}\n"
        "buffer:\n  train_batch_size: 4\n  total_steps: 3\n  trainer_input:\n"
        "    experience_buffer: {storage_type: synthetic, path: arithmetic, "
        "generator_args: {digits: 1, num_tasks: 40, seed: 0}, "
        "format: {prompt_key: question, response_key: answer}}\n"
        "trainer: {micro_batch_size_per_gpu: 4, use_dynamic_bsz: false, save_interval: 0}\n"
    )
    return load_config(p)


@pytest.mark.parametrize(
    "publish_steps, publish_final, versions",
    [
        (False, False, []),  # SFT, nothing evaluates: nobody would read the weights
        (False, True, [3]),  # SFT then a final evaluation: only the final weights
        (True, True, [1, 2, 3, 3]),  # an explorer syncing every step (k = 1), then the final
    ],
)
def test_publishes_only_for_a_consumer(
    tmp_path, tiny_model_dir, fake_ray, publish_steps, publish_final, versions
):
    sync, hub = FakeActor(), FakeActor()
    r = TrainerRunner(sft_config(tmp_path, tiny_model_dir), str(tiny_model_dir), str(tmp_path),
                      None, sync, hub, 0)  # fmt: skip
    r.prepare(None, use_dataset=True)
    out = r.run(3, publish_steps=publish_steps, publish_final=publish_final)
    assert out["train_steps"] == 3
    assert [args[0] for name, args in sync.calls if name == "publish"] == versions
    assert [args[1] for name, args in hub.calls if name == "put"] == [1, 2, 3]  # metrics per step


def test_a_train_step_is_reported_before_its_checkpoint_lands(tmp_path, tiny_model_dir, fake_ray):
    # the hub journals a report before `put` returns, so a step whose checkpoint (and with it
    # its leases' ack) landed was reported: after a SIGKILL the next process merges the journal
    # (test_monitor) and the step has its record. Every put must come while its step's
    # checkpoint is not there yet, and every checkpointed step must have been put
    run_dir = tmp_path / "run"
    seen: list[tuple[int, bool]] = []

    class Hub:
        put = SimpleNamespace(
            remote=lambda source, step, metrics: seen.append(
                (step, (run_dir / f"global_step_{step}").exists())
            )
        )

    cfg = sft_config(tmp_path, tiny_model_dir)
    cfg = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"save_interval": 1})})
    r = TrainerRunner(cfg, str(tiny_model_dir), str(run_dir), None, FakeActor(), Hub(), 0)
    r.prepare(None, use_dataset=True)
    r.run(3, publish_steps=False, publish_final=False)
    assert seen == [(1, False), (2, False), (3, False)]
    assert sorted(p.name for p in run_dir.glob("global_step_*")) == [
        "global_step_1", "global_step_2", "global_step_3"
    ]  # fmt: skip
