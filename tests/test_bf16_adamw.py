"""AdamW with bf16 moments (`algorithm.optimizer.state_dtype: bfloat16`), against AdamW's formula
and torch's own AdamW, with hand-derived expectations."""

import math
from types import SimpleNamespace

import pytest
import torch

from trinity.trainer.bf16_adamw import BF16StateAdamW, NoisePool, stochastic_round_to_bf16
from trinity.trainer.optim import build_optimizer

CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")],
)
DEVICES = ["cpu", CUDA]  # the rounding noise lives on the parameters' device


def opt_cfg(**kw):
    base = dict(
        lr=0.01, betas=(0.9, 0.999), weight_decay=0.1, lr_warmup_steps=0,
        lr_warmup_steps_ratio=0.0, lr_scheduler_type="constant", min_lr_ratio=0.0,
        state_dtype="bfloat16",
    )  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_stochastic_rounding_rounds_up_with_the_fraction_of_the_gap():
    # bf16 has 7 stored mantissa bits: its neighbours of 1.0 upward are 1 and 1 + 2^-7.
    # x = 1 + 2^-9 is a quarter of the way: it must round up with probability 1/4; -x mirrors it.
    n = 200_000
    pool = NoisePool(n, torch.Generator().manual_seed(0))

    def g():  # fresh noise for each rounding
        pool.refresh()
        return pool.draw(n)

    x = torch.full((n,), 1 + 2**-9)
    up = stochastic_round_to_bf16(x, g()).float()
    assert set(up.unique().tolist()) == {1.0, 1 + 2**-7}
    frac = (up > 1).float().mean().item()
    assert abs(frac - 0.25) < 4 * math.sqrt(0.25 * 0.75 / n)  # 4 standard errors
    down = stochastic_round_to_bf16(-x, g()).float()
    assert set(down.unique().tolist()) == {-1.0, -(1 + 2**-7)}
    assert abs((down < -1).float().mean().item() - 0.25) < 4 * math.sqrt(0.25 * 0.75 / n)
    # values a bf16 holds exactly come back unchanged; the mean of many roundings is x
    exact = torch.tensor([0.0, 1.0, -2.5, 3.0e-5], dtype=torch.bfloat16).float()
    assert torch.equal(stochastic_round_to_bf16(exact, g()[:4]).float(), exact)
    y = torch.full((n,), 0.3)
    assert stochastic_round_to_bf16(y, g()).float().mean().item() == pytest.approx(0.3, rel=2e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_one_update_is_adamw_s_formula_with_bf16_moments(device):
    """After one update m_hat = g, v_hat = g^2 (the bias corrections undo 1-b1 and 1-b2), so each
    entry moves by lr*sign(g) plus the decay: p <- p(1 - lr wd) - lr g/(|g| + eps). The moments
    are held in bf16: m = 0.1 g rounded to nearest, v = 0.001 g^2 within one bf16 step."""
    model = torch.nn.Linear(3, 1, bias=False, device=device)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0, 0.5]]))
    opt, _ = build_optimizer(model, opt_cfg(), total_steps=10, seed=0)
    assert isinstance(opt, BF16StateAdamW)
    g = torch.tensor([0.3, -4.0, 0.0])
    model.weight.grad = g.clone().view(1, 3).to(device)
    opt.step()
    w0 = torch.tensor([1.0, -2.0, 0.5])
    expected = w0 * (1 - 0.01 * 0.1) - 0.01 * g / (g.abs() + 1e-8)
    assert model.weight.detach()[0].tolist() == pytest.approx(expected.tolist(), abs=1e-7)
    st = opt.state[model.weight]
    assert st["exp_avg"].dtype == st["exp_avg_sq"].dtype == torch.bfloat16
    assert st["exp_avg_sq"].device.type == device
    assert torch.equal(st["exp_avg"][0].cpu(), (0.1 * g).to(torch.bfloat16))
    v = st["exp_avg_sq"][0].float().cpu()
    assert v.tolist() == pytest.approx((0.001 * g * g).tolist(), rel=2**-7)


@pytest.mark.parametrize("device", DEVICES)
def test_it_follows_torch_adamw_over_many_updates(device):
    """200 updates of a least-squares problem from the same start: the bf16-moment parameters stay
    within a small fraction of the distance both travelled from the start."""
    torch.manual_seed(0)
    a, b = torch.randn(64, 16, device=device), torch.randn(64, device=device)
    w_ref = torch.zeros(16, requires_grad=True, device=device)
    w_bf = torch.zeros(16, requires_grad=True, device=device)
    ref = torch.optim.AdamW([w_ref], lr=0.01, weight_decay=0.01)
    low = BF16StateAdamW([w_bf], lr=0.01, weight_decay=0.01, seed=1)
    for _ in range(200):
        for w, opt in ((w_ref, ref), (w_bf, low)):
            opt.zero_grad()
            ((a @ w - b) ** 2).mean().backward()
            opt.step()
    travelled = w_ref.detach().norm().item()
    assert travelled > 0.5
    assert (w_bf - w_ref).detach().norm().item() < 0.02 * travelled


def test_the_second_moment_reaches_e_g2_where_round_to_nearest_stalls():
    """Constant gradient 1 from v = 0: fp32 gives v_t = 1 - 0.999^t (0.9502 at t = 3000). Rounded
    to nearest, bf16 stops near 0.2 (an increment 0.001(1 - v) is below half a bf16 step of v);
    rounded stochastically, v tracks the fp32 value."""
    w = torch.zeros(4096, requires_grad=True)
    opt = BF16StateAdamW([w], lr=0.0, weight_decay=0.0, seed=0)
    w.grad = torch.ones_like(w)
    for _ in range(3000):
        opt.step()
    v = opt.state[w]["exp_avg_sq"].float().mean().item()
    assert v == pytest.approx(1 - 0.999**3000, abs=0.01)
    nearest = torch.zeros((), dtype=torch.bfloat16)
    for _ in range(3000):
        nearest = (0.999 * nearest.float() + 0.001).to(torch.bfloat16)
    assert nearest.item() < 0.5  # why the rounding is stochastic


def test_large_tensors_are_updated_in_chunks_with_the_same_result():
    """Chunking splits the update, not the arithmetic: the first moment (rounded to nearest) is
    the same bits whatever the chunk size, the parameters equal up to the second moment's
    random rounding (a relative 2^-8 of an update of lr = 0.01 per step)."""
    torch.manual_seed(0)
    start, grads = torch.randn(1000), [torch.randn(1000) for _ in range(5)]
    out, m = [], []
    for chunk in (1000, 97):
        w = start.clone().requires_grad_(True)
        opt = BF16StateAdamW([w], lr=0.01, seed=3, chunk=chunk)
        for g in grads:
            w.grad = g.clone()
            opt.step()
        out.append(w.detach())
        m.append(opt.state[w]["exp_avg"])
    assert torch.equal(m[0], m[1])
    assert (out[0] - start).abs().mean() > 0.01  # the entries moved
    torch.testing.assert_close(out[0], out[1], rtol=0, atol=5 * 0.01 * 2**-8)


@pytest.mark.parametrize("device", DEVICES)
def test_a_saved_and_loaded_state_continues_exactly(device):
    torch.manual_seed(0)
    start = torch.randn(2, 300, device=device)
    grads = [torch.randn(2, 300, device=device) for _ in range(6)]

    def run(split: bool) -> torch.Tensor:
        w = start.clone().requires_grad_(True)
        opt = BF16StateAdamW([w], lr=0.01, seed=5)
        for i, g in enumerate(grads):
            if split and i == 3:  # a checkpoint and a restart into a fresh optimizer
                saved = opt.state_dict()
                w = w.detach().clone().requires_grad_(True)
                opt = BF16StateAdamW([w], lr=0.01, seed=99)  # the seed is restored, not reused
                opt.load_state_dict(saved)
                assert opt.state[w]["exp_avg_sq"].dtype == torch.bfloat16
            w.grad = g.clone()
            opt.step()
        return w.detach()

    assert torch.equal(run(False), run(True))


def test_a_float32_state_cannot_be_resumed_as_bf16():
    w = torch.zeros(3, requires_grad=True)
    fp32 = torch.optim.AdamW([w])
    w.grad = torch.ones(3)
    fp32.step()
    with pytest.raises(ValueError, match="state_dtype"):
        BF16StateAdamW([w]).load_state_dict(fp32.state_dict())


def test_the_config_key_reaches_the_trainer_and_its_checkpoint(tmp_path, tiny_model_dir):
    """state_dtype bfloat16: the trainer's moments are bf16 after a step, a checkpoint resumes
    into a fresh trainer that makes exactly the next update an uninterrupted one makes, and a
    misspelt value is a config error naming the key."""
    from test_trainer import experiences, make_config
    from transformers import AutoConfig

    from trinity.config import ConfigError
    from trinity.trainer.trainer import Trainer

    vocab = AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    cfg = make_config(tmp_path, tiny_model_dir, optim="state_dtype: bfloat16")
    a = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    a.train_step(experiences(vocab, seed=0))
    assert isinstance(a.optimizer, BF16StateAdamW)
    moments = [s["exp_avg_sq"] for s in a.optimizer.state.values()]
    assert moments and all(m.dtype == torch.bfloat16 for m in moments)
    ckpt = a.save_checkpoint(tmp_path / "ckpt", step=1)
    b = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    b.resume(ckpt)
    for t in (a, b):
        t.train_step(experiences(vocab, seed=1))
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    with pytest.raises(ConfigError, match="state_dtype"):
        make_config(tmp_path, tiny_model_dir, optim="state_dtype: bf16")
