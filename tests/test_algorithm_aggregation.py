"""Loss aggregation: every mode by hand, a loop oracle, and micro-batch invariance (values and grads)."""

from __future__ import annotations

import pytest
import torch

from trinity.algorithm import LOSS_AGG_MODES, Aggregator


def close(actual: torch.Tensor | float, expected: float, atol: float = 1e-6) -> None:
    actual = torch.as_tensor(actual)
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[True, True, False], [True, False, False]])


def test_modes_by_hand() -> None:
    # masked entries: row 0 → 1, 2 (sum 3, 2 tokens); row 1 → 4 (sum 4, 1 token); 3 tokens, 2 seqs, T = 3
    close(Aggregator("token-mean")(LOSS, MASK), 7 / 3)  # (1 + 2 + 4)/3
    close(Aggregator("token-sum")(LOSS, MASK), 7.0)  # 1 + 2 + 4
    close(Aggregator("seq-mean-token-sum")(LOSS, MASK), 3.5)  # (3 + 4)/2
    close(Aggregator("seq-mean-token-mean")(LOSS, MASK), 2.75)  # (3/2 + 4/1)/2 = (1.5 + 4)/2
    close(Aggregator("seq-mean-token-sum-norm")(LOSS, MASK), 7 / 6)  # (3 + 4)/(2·3)


def test_explicit_global_counts() -> None:
    close(Aggregator("token-mean", num_tokens=10)(LOSS, MASK), 0.7)  # 7/10
    close(Aggregator("seq-mean-token-sum", num_seqs=4)(LOSS, MASK), 1.75)  # 7/4
    close(Aggregator("seq-mean-token-mean", num_seqs=5)(LOSS, MASK), 1.1)  # 5.5/5
    close(Aggregator("seq-mean-token-sum-norm", num_seqs=2, norm_length=7)(LOSS, MASK), 0.5)  # 7/14


def test_a_row_with_no_trained_token_leaves_the_sequence_count() -> None:
    # 4 sequences, row 2 excluded (all-zero mask): the seq-mean modes average over the 3 others
    loss = torch.tensor([[1.0, 2.0], [3.0, 5.0], [7.0, 9.0], [4.0, 6.0]])
    mask = torch.tensor([[True, True], [True, False], [False, False], [True, True]])
    # token means: row 0 (1+2)/2 = 1.5, row 1 3/1 = 3, row 3 (4+6)/2 = 5 → (1.5 + 3 + 5)/3
    close(Aggregator("seq-mean-token-mean")(loss, mask), 9.5 / 3)
    # token sums 3, 3, 10 → 16/3; with L = 2: 16/(3·2)
    close(Aggregator("seq-mean-token-sum")(loss, mask), 16 / 3)
    close(Aggregator("seq-mean-token-sum-norm")(loss, mask), 16 / 6)


def test_empty_sequence_and_empty_mask() -> None:
    mask = torch.tensor([[True, True, False], [False, False, False]])
    close(Aggregator("seq-mean-token-mean")(LOSS, mask), 1.5)  # 1.5/1: the empty row is no seq
    none = torch.zeros(2, 3, dtype=torch.bool)
    for mode in LOSS_AGG_MODES:
        close(Aggregator(mode)(LOSS, none), 0.0)


def test_masked_nan_does_not_leak() -> None:
    loss = LOSS.clone()
    loss[1, 2] = float("nan")
    loss[0, 2] = float("inf")
    for mode in LOSS_AGG_MODES:
        assert torch.isfinite(Aggregator(mode)(loss, MASK))


def test_unknown_mode_lists_valid_modes() -> None:
    with pytest.raises(
        ValueError, match="token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean"
    ):
        Aggregator("mean")


def agg_oracle(mode: str, loss: list[list[float]], mask: list[list[bool]]) -> float:
    n_tokens = sum(sum(row) for row in mask)
    seq_sums = [
        sum(x for x, m in zip(lr, mr, strict=True) if m) for lr, mr in zip(loss, mask, strict=True)
    ]
    seq_lens = [sum(mr) for mr in mask]
    n_seqs, horizon = sum(1 for n in seq_lens if n > 0), len(loss[0])
    if mode == "token-mean":
        return sum(seq_sums) / n_tokens
    if mode == "token-sum":
        return sum(seq_sums)
    if mode == "seq-mean-token-sum":
        return sum(seq_sums) / n_seqs
    if mode == "seq-mean-token-mean":
        return sum(s / n for s, n in zip(seq_sums, seq_lens, strict=True) if n > 0) / n_seqs
    return sum(seq_sums) / (n_seqs * horizon)


def random_case(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    loss = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    mask = torch.rand(7, 5, generator=gen) > 0.4
    mask[3] = False  # one fully masked sequence
    mask[0, 0] = True
    return loss, mask


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed", range(3))
def test_matches_loop_oracle(mode: str, seed: int) -> None:
    loss, mask = random_case(seed)
    close(Aggregator(mode)(loss, mask), agg_oracle(mode, loss.tolist(), mask.tolist()), atol=1e-12)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed", range(3))
def test_micro_batch_invariance(mode: str, seed: int) -> None:
    """Σ over micro-batches of agg(part) with GLOBAL counts == agg(whole): values and gradients."""
    loss, mask = random_case(seed)
    whole_loss = loss.clone().requires_grad_(True)
    whole = Aggregator(mode)(whole_loss, mask)
    whole.backward()

    split_loss = loss.clone().requires_grad_(True)
    agg = Aggregator(
        mode,
        num_tokens=float(mask.sum()),
        num_seqs=float(mask.any(dim=-1).sum()),
        norm_length=float(mask.shape[1]),
    )
    total = torch.zeros((), dtype=loss.dtype)
    for rows in (slice(0, 2), slice(2, 3), slice(3, 7)):  # uneven micro-batches
        part = agg(split_loss[rows], mask[rows])
        part.backward()  # gradient accumulation
        total = total + part.detach()
    close(total, float(whole.detach()), atol=1e-12)
    torch.testing.assert_close(split_loss.grad, whole_loss.grad, atol=1e-12, rtol=0)


def test_local_counts_are_not_invariant_for_token_mean() -> None:
    # a sanity check that the property above is not vacuous: local counts give a different total
    loss, mask = random_case(0)
    local = sum(Aggregator("token-mean")(loss[r], mask[r]) for r in (slice(0, 2), slice(2, 7)))
    assert abs(float(local) - float(Aggregator("token-mean")(loss, mask))) > 1e-3
