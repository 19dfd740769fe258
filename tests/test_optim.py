"""Learning-rate schedule, by hand."""

import math
from types import SimpleNamespace

import pytest
import torch

from trinity.trainer.optim import build_optimizer, lr_factor, warmup_steps


def test_warmup_then_constant():
    # warmup 4: factors 1/4, 2/4, 3/4, 4/4, then 1
    assert [lr_factor(s, 4, 10, "constant", 0.0) for s in range(6)] == [
        0.25,
        0.5,
        0.75,
        1.0,
        1.0,
        1.0,
    ]


def test_linear_and_cosine_decay_to_min_ratio():
    # no warmup, total 10, min 0.1: linear at step 5 = 0.1 + 0.9 * (1 - 0.5) = 0.55
    assert lr_factor(5, 0, 10, "linear", 0.1) == pytest.approx(0.55)
    assert lr_factor(10, 0, 10, "linear", 0.1) == pytest.approx(0.1)
    # cosine at halfway = 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55; at the end 0.1
    assert lr_factor(5, 0, 10, "cosine", 0.1) == pytest.approx(0.55)
    assert lr_factor(10, 0, 10, "cosine", 0.1) == pytest.approx(0.1)
    # with warmup 2 of 10: progress at step 6 = (6 - 2) / 8 = 0.5
    assert lr_factor(6, 2, 10, "cosine", 0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))


def test_warmup_steps_from_ratio_and_bad_style():
    cfg = SimpleNamespace(lr_warmup_steps=-1, lr_warmup_steps_ratio=0.1)
    assert warmup_steps(cfg, 50) == 5
    cfg.lr_warmup_steps = 3
    assert warmup_steps(cfg, 50) == 3
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        lr_factor(5, 0, 10, "exponential", 0.0)


def test_scheduler_drives_the_optimizer_lr():
    model = torch.nn.Linear(2, 2)
    opt_cfg = SimpleNamespace(
        lr=0.1, betas=(0.9, 0.999), weight_decay=0.0, lr_warmup_steps=2,
        lr_warmup_steps_ratio=0.0, lr_scheduler_type="constant", min_lr_ratio=0.0, state_dtype="float32",
    )  # fmt: skip
    opt, sched = build_optimizer(model, opt_cfg, total_steps=10)
    seen = []
    for _ in range(3):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.05, 0.1, 0.1])


def test_the_fused_update_is_adamw_s_formula():
    """One fused AdamW update on CPU, checked against the formula (Loshchilov & Hutter):
    p <- p (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps), m_hat = g, v_hat = g^2 after one step,
    so each entry moves by lr sign(g) (up to eps), plus the decay."""
    model = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0, 0.5]]))
    opt_cfg = SimpleNamespace(
        lr=0.01, betas=(0.9, 0.999), weight_decay=0.1, lr_warmup_steps=0,
        lr_warmup_steps_ratio=0.0, lr_scheduler_type="constant", min_lr_ratio=0.0, state_dtype="float32",
    )  # fmt: skip
    opt, _ = build_optimizer(model, opt_cfg, total_steps=10)
    assert opt.param_groups[0]["fused"] is True  # no all-parameter temporaries (optim.py)
    model.weight.grad = torch.tensor([[0.3, -4.0, 0.0]])
    opt.step()
    w0, g = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.3, -4.0, 0.0])
    expected = w0 * (1 - 0.01 * 0.1) - 0.01 * g / (g.abs() + 1e-8)
    assert model.weight.detach()[0].tolist() == pytest.approx(expected.tolist(), abs=1e-7)
