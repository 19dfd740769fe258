"""Sampling filters against hand-derived distributions, and the engine's decode loop against
`model.generate` (greedy, left padding, rows stopping at different steps)."""

import numpy as np
import pytest
import torch

from trinity.explorer.engine import HFRolloutEngine, SamplingParams
from trinity.explorer.sampling import filter_logits, keyed_uniforms, sample_next, splitmix64

# probabilities 0.5, 0.3, 0.15, 0.05 as logits
PROBS = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
LOGITS = PROBS.log()


def kept(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits, dim=-1)


def test_top_p_keeps_tokens_whose_mass_above_is_below_p():
    # mass ranked strictly above each token: 0, 0.5, 0.8, 0.95 -> top_p=0.7 keeps tokens 0 and 1
    # renormalised: 0.5/0.8 = 0.625, 0.3/0.8 = 0.375
    got = kept(filter_logits(LOGITS, top_p=0.7))
    torch.testing.assert_close(got, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    # top_p=0.5: mass above token 1 is 0.5, not < 0.5 -> only token 0
    torch.testing.assert_close(
        kept(filter_logits(LOGITS, top_p=0.5)), torch.tensor([[1.0, 0, 0, 0]])
    )
    # a tiny top_p still keeps the most likely token
    torch.testing.assert_close(
        kept(filter_logits(LOGITS, top_p=1e-6)), torch.tensor([[1.0, 0, 0, 0]])
    )


def test_top_k_then_temperature():
    # top_k=3 drops 0.05; renormalised over 0.95: 0.5/0.95, 0.3/0.95, 0.15/0.95
    got = kept(filter_logits(LOGITS, top_k=3))
    torch.testing.assert_close(got, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    # temperature 0.5 squares the probabilities before renormalising: p^2 / sum p^2
    sq = PROBS**2
    torch.testing.assert_close(kept(filter_logits(LOGITS, temperature=0.5)), sq / sq.sum())
    # temperature is applied before top_p: p^2/sum = .7042, .2535, .0634, .0070 -> top_p=0.9 keeps 2
    got = kept(filter_logits(LOGITS, temperature=0.5, top_p=0.9))
    torch.testing.assert_close(got, torch.tensor([[0.25, 0.09, 0, 0]]) / 0.34)


def test_filters_apply_per_row():
    logits = torch.cat([LOGITS, LOGITS.flip(-1)])  # second row: most likely token is index 3
    got = kept(filter_logits(logits, top_k=1))
    torch.testing.assert_close(got, torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1.0]]))


def test_sample_next_draws_from_the_filtered_distribution():
    gen = torch.Generator().manual_seed(0)
    logits = LOGITS.expand(40_000, -1)
    draws = sample_next(logits, temperature=1.0, top_p=0.7, generator=gen)
    freq = torch.bincount(draws, minlength=4).float() / len(draws)
    # binomial std of a frequency near 0.6 over 40k draws is ~0.0024; allow ~4 sigma
    torch.testing.assert_close(freq, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.01, rtol=0)
    assert freq[2] == 0 and freq[3] == 0  # filtered tokens are never drawn
    assert sample_next(LOGITS, temperature=0.0).item() == 0  # greedy = argmax
    with pytest.raises(ValueError, match="temperature"):
        filter_logits(LOGITS, temperature=-1.0)


def test_decode_loop_matches_generate_with_padding_and_early_stops(tiny_model_dir):
    engine = HFRolloutEngine(str(tiny_model_dir), seed=0)
    texts = ["12+34=", "7+8=", "99+1= and 5", "3+45=", "1+1="]
    prompts = [engine.chat_prompt_ids([{"role": "user", "content": t}]) for t in texts]
    assert len({len(p) for p in prompts}) > 1  # the batch is left-padded
    # a random-init model never samples the real eos; make two common tokens stop tokens too, so
    # rows end at different steps and the loop drops finished rows from the batch
    first = engine.generate(prompts, SamplingParams(n=1, temperature=0.0, max_tokens=12))
    seen = [t for g in first for t in g[0].response_ids]
    stops = sorted(set(seen), key=seen.index)[1:3]
    engine.eos_ids |= set(stops)
    out = engine.generate(prompts, SamplingParams(n=2, temperature=0.0, max_tokens=12))
    lengths = set()
    for p, group in zip(prompts, out, strict=True):
        # reference: one unpadded prompt at a time through transformers' own generate
        ref = engine.model.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            do_sample=False,
            max_new_tokens=12,
            eos_token_id=sorted(engine.eos_ids),
            pad_token_id=engine.pad_id,
        )[0, len(p) :].tolist()
        stop_at = next((i + 1 for i, t in enumerate(ref) if t in engine.eos_ids), len(ref))
        for s in group:
            assert s.response_ids == ref[:stop_at]
            assert s.finish_reason == ("stop" if ref[stop_at - 1] in engine.eos_ids else "length")
            teacher = engine.logprobs(p + s.response_ids)[len(p) - 1 :]
            torch.testing.assert_close(
                torch.tensor(s.logprobs), torch.tensor(teacher), atol=1e-4, rtol=0
            )
            lengths.add(len(s.response_ids))
    assert len(lengths) > 1, "rows should stop at different steps"


def test_sampled_sequences_are_reproducible_from_the_seed(tiny_model_dir):
    params = SamplingParams(n=4, temperature=1.0, top_p=0.9, top_k=50, max_tokens=8)
    runs = []
    for _ in range(2):
        engine = HFRolloutEngine(str(tiny_model_dir), seed=3)
        p = engine.chat_prompt_ids([{"role": "user", "content": "5+6="}])
        runs.append([s.response_ids for s in engine.generate([p], params)[0]])
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in runs[0]}) > 1  # the n samples of one prompt differ


def test_splitmix64_matches_the_reference_sequence():
    # SplitMix64 seeded with 0 (Vigna's splitmix64.c: state += golden gamma, then mix) outputs
    # 0xE220A8397B1DCDAF, then 0x6E789E6AA1B965F4; splitmix64(x) mixes x + gamma, so
    # splitmix64(0) and splitmix64(gamma) are those two outputs
    gamma = 0x9E3779B97F4A7C15
    out = splitmix64(np.array([0, gamma], dtype=np.uint64))
    assert [int(v) for v in out] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


def test_keyed_draws_follow_the_filtered_distribution():
    keys = np.arange(40_000, dtype=np.uint64)
    u = keyed_uniforms(keys, t=3)
    assert u.shape == (40_000, 1) and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    logits = LOGITS.expand(len(keys), -1)
    picked = sample_next(logits, temperature=1.0, uniforms=u)
    freq = torch.bincount(picked, minlength=4).float() / len(keys)
    # binomial std of each frequency is at most sqrt(0.25 / 40000) = 0.0025
    torch.testing.assert_close(freq, PROBS[0], atol=0.01, rtol=0)
    # top_p=0.7 keeps tokens 0 and 1, renormalised: 0.5/0.8 and 0.3/0.8
    picked = sample_next(logits, temperature=1.0, top_p=0.7, uniforms=u)
    freq = torch.bincount(picked, minlength=4).float() / len(keys)
    torch.testing.assert_close(freq, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.01, rtol=0)
    # another step's uniforms are another draw: about 1 - sum(p^2) = 1 - 0.365 = 0.635 of the picks change
    again = sample_next(logits, temperature=1.0, uniforms=keyed_uniforms(keys, t=4))
    changed = (again != sample_next(logits, temperature=1.0, uniforms=u)).float().mean()
    assert abs(float(changed) - 0.635) < 0.015


def test_a_keyed_prompt_samples_the_same_tokens_whatever_shares_its_batch(tiny_model_dir):
    params = SamplingParams(n=3, temperature=1.0, top_p=0.95, max_tokens=8)
    engine = HFRolloutEngine(str(tiny_model_dir), seed=0)
    a = engine.chat_prompt_ids([{"role": "user", "content": "5+6="}])
    b = engine.chat_prompt_ids([{"role": "user", "content": "12+34="}])
    alone = engine.generate([a], params, keys=[7])[0]
    other_engine = HFRolloutEngine(str(tiny_model_dir), seed=99)  # another generator seed
    batched = other_engine.generate([b, a, a], params, keys=[8, 7, 9])
    ids = lambda samples: [s.response_ids for s in samples]  # noqa: E731
    assert ids(batched[1]) == ids(alone)
    assert ids(batched[2]) != ids(alone)  # another key, other samples
    assert len({tuple(r) for r in ids(alone)}) > 1  # the n samples of one prompt differ
    # unkeyed prompts still repeat from the engine's seed
    first = HFRolloutEngine(str(tiny_model_dir), seed=3).generate([a], params)[0]
    assert ids(HFRolloutEngine(str(tiny_model_dir), seed=3).generate([a], params)[0]) == ids(first)
