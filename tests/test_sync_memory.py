"""`sync_method: memory` ships every tensor in its own dtype: a bf16 model arrives bit-exact in
half the bytes a float32 copy would take."""

from __future__ import annotations

import pytest
import torch

from trinity.sync.method import sync_method


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(
        address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
        namespace="sync-memory",
    )  # fmt: skip
    yield
    ray.shutdown()


def _bf16_model() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 32, generator=g).to(torch.bfloat16)
    w[0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-40])  # odd bit patterns
    return {
        "embed.weight": w,
        "norm.weight": torch.randn(32, generator=g).to(torch.bfloat16),
        "head.weight": w.t(),  # not contiguous
        "f8": torch.randn(8, generator=g).to(torch.float8_e4m3fn),
        "steps": torch.tensor(7, dtype=torch.int64),  # numpy has it: sent as is
    }


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def test_a_bf16_model_round_trips_bit_exactly_in_half_the_bytes(ray_local, tmp_path):
    import ray

    state = _bf16_model()
    payload = sync_method("memory").send(state, 1, tmp_path)
    got = sync_method("memory").receive(payload)
    assert sorted(got) == sorted(state)
    for k, want in state.items():
        assert got[k].dtype == want.dtype and got[k].shape == want.shape, k
        assert torch.equal(_bits(got[k]), _bits(want)), k
    # the stored arrays: 64*32 + 32 + 32*64 bf16 values at 2 bytes = 8256 bytes (16512 as
    # float32, the old wire format), 8 float8 at 1 byte, one int64 at 8 bytes
    arrays = ray.get(payload[0])["arrays"]
    assert sum(a.nbytes for a in arrays.values()) == 2 * (64 * 32 + 32 + 32 * 64) + 8 + 8
    bf16 = ("embed.weight", "norm.weight", "head.weight")
    assert sum(arrays[k].nbytes for k in bf16) * 2 == sum(
        state[k].float().numel() * 4 for k in bf16
    )
