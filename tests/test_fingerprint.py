"""The weight fingerprint (`trinity/sync/fingerprint.py`): every sync method's payload carries
the hashes of what the trainer sent, and an engine that receives other weights fails, naming
the tensors and both hashes."""

from __future__ import annotations

import pytest
import torch
from test_sync_collective import _run_engines

from trinity.sync import shared
from trinity.sync.fingerprint import (
    SAMPLED_ABOVE,
    Fingerprint,
    WeightsMismatch,
    check,
    digest,
    fingerprint,
    split,
    tensor_hash,
)
from trinity.sync.method import sync_method


def state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(6, 4, generator=g),
        "norm.weight": torch.randn(4, generator=g).to(torch.bfloat16),
        "steps": torch.tensor([seed, 2**40], dtype=torch.int64),
    }


def perturbed(s: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`s` with one value of embed.weight moved by one ulp: the smallest change there is."""
    out = {k: v.clone() for k, v in s.items()}
    w = out["embed.weight"]
    w[2, 1] = torch.nextafter(w[2, 1], torch.tensor(float("inf")))
    return out


def test_a_hash_sees_every_value_shape_and_dtype():
    s = state()
    assert tensor_hash(s["embed.weight"]) == tensor_hash(s["embed.weight"].clone())
    assert tensor_hash(s["embed.weight"]) != tensor_hash(perturbed(s)["embed.weight"])
    assert tensor_hash(s["embed.weight"]) != tensor_hash(s["embed.weight"].reshape(4, 6))
    assert tensor_hash(s["embed.weight"]) != tensor_hash(s["embed.weight"].double())
    # a non-contiguous view hashes as its values, like the copy an engine receives
    assert tensor_hash(s["embed.weight"].t()) == tensor_hash(s["embed.weight"].t().contiguous())


def test_a_large_tensor_is_hashed_on_strided_samples_that_include_both_ends():
    big = torch.zeros(SAMPLED_ABOVE * 3)
    base = tensor_hash(big)
    for i in (0, big.numel() - 1, 3 * 1000):  # sampled indices: 0, the last, every 3rd
        changed = big.clone()
        changed[i] = 1.0
        assert tensor_hash(changed) != base, i


def test_check_names_the_changed_missing_and_extra_tensors_with_both_hashes():
    sent = fingerprint(state(), version=4)
    got = perturbed(state())
    del got["steps"]
    got["extra.bias"] = torch.zeros(2)
    with pytest.raises(WeightsMismatch) as info:
        check(sent, got, "memory")
    message = str(info.value)
    assert "version 4" in message and "2 of 3 tensors differ" in message and "1 extra" in message
    assert f"embed.weight: sent {sent.hashes['embed.weight']}, received " in message
    assert "steps: sent" in message and "received nothing" in message
    assert "extra.bias: received, never sent" in message
    check(sent, state(), "memory")  # the same weights: nothing raised
    assert sent.digest == digest(dict(reversed(sent.hashes.items())))  # order-free


def tampered(method: str, tmp_path) -> list:
    """A payload of `method` whose tensors are not the ones its fingerprint hashed: the
    fingerprint of `state()`, the method's own payload of `perturbed(state())`."""
    m = sync_method(method)
    _, stamp = split(m.send(state(), 1, tmp_path / "a"))
    own, _ = split(m.send(perturbed(state()), 1, tmp_path / "b"))
    assert isinstance(stamp, Fingerprint)
    return [*own, stamp]


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(
        address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
        namespace="fingerprint",
    )  # fmt: skip
    yield
    ray.shutdown()


@pytest.mark.parametrize("method", ["memory", "checkpoint"])
def test_weights_changed_after_the_hash_fail_the_sync(method, tmp_path, request):
    if method == "memory":
        request.getfixturevalue("ray_local")
    m = sync_method(method)
    payload = m.send(state(), 1, tmp_path / "ok")
    got = m.receive(payload)  # unchanged: received and checked
    assert sorted(got) == sorted(state())
    with pytest.raises(WeightsMismatch, match=rf"sync_method {method}.*embed\.weight: sent"):
        m.receive(tampered(method, tmp_path))


def test_a_collective_broadcast_of_other_weights_fails_on_every_engine(tmp_path):
    got = _run_engines([tampered("nccl", tmp_path)], world=2)
    for rank in (0, 1):
        assert isinstance(got[rank][0], str), rank
        assert "arrived changed" in got[rank][0] and "embed.weight" in got[rank][0]


def test_a_live_method_carries_no_fingerprint(monkeypatch):
    """`shared`: the engines map the trainer's own tensors, which change in place (each step,
    and a resume restores its checkpoint into them): no transport, nothing to check."""
    monkeypatch.setattr(shared, "_node", lambda: "node-a")
    model = torch.nn.Linear(3, 2)
    m = sync_method("shared")
    payload = m.send(model.state_dict(), 1, None)
    assert split(payload)[1] is None
    with torch.no_grad():
        model.weight[0, 0] += 1.0
    assert torch.equal(m.receive(payload)["weight"], model.weight.detach())


def test_a_payload_without_a_fingerprint_is_received_unchecked(tmp_path):
    m = sync_method("checkpoint")
    own, _ = split(m.send(state(), 1, tmp_path))
    assert sorted(m.receive(own)) == sorted(state())


@pytest.mark.long  # a whole run (10-20 s on 2 cores)
def test_a_run_checks_every_sync_and_stamps_each_experience_with_its_weights(
    tmp_path, tiny_model_dir
):
    """GRPO, 3 steps, memory sync: steps 2 and 3 load published weights, each checked
    (`sync/fingerprint_ok`); their experiences carry the digest of those weights."""
    import json

    from test_e2e import grpo_config, run_trinity

    config = grpo_config(tmp_path, tiny_model_dir)
    r = run_trinity(config, overrides=["synchronizer.sync_method=memory"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "ckpt/e2e/grpo/metrics.jsonl").open()]
    assert [x.get("sync/fingerprint_ok") for x in recs if "rollout/reward_mean" in x] == [
        None,
        1.0,
        1.0,
    ]
