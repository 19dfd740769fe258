"""Rollout engine and request batcher: logprobs are the policy's, stops at eos, weights update."""

import asyncio

import torch

from trinity.common.rollout import Sample
from trinity.explorer.engine import HFRolloutEngine, SamplingParams
from trinity.explorer.in_process import InProcess
from trinity.explorer.model_client import BatchingClient, TaskModelHandle
from trinity.sync.method import sync_method


def prompt(engine, text="12+34="):
    return engine.chat_prompt_ids([{"role": "user", "content": text}])


def test_logprobs_match_a_teacher_forced_forward_pass(tiny_model_dir):
    engine = HFRolloutEngine(str(tiny_model_dir), seed=0)
    p = prompt(engine)
    groups = engine.generate(
        [p, prompt(engine, "7+8=")], SamplingParams(n=3, temperature=1.0, max_tokens=6)
    )
    assert [len(g) for g in groups] == [3, 3]
    for s in groups[0]:
        assert len(s.logprobs) == len(s.response_ids) >= 1
        assert s.finish_reason in ("stop", "length")
        if s.finish_reason == "stop":
            assert s.response_ids[-1] in engine.eos_ids
        else:
            assert len(s.response_ids) == 6
        # the logprob the engine reports = log_softmax of a plain forward pass over the sequence
        full = s.prompt_ids + s.response_ids
        ref = engine.logprobs(full)[len(s.prompt_ids) - 1 :]
        torch.testing.assert_close(
            torch.tensor(s.logprobs), torch.tensor(ref), atol=1e-4, rtol=1e-4
        )


def test_greedy_is_deterministic_and_weights_update_bumps_version(tiny_model_dir, tmp_path):
    engine = HFRolloutEngine(str(tiny_model_dir), seed=0)
    p = prompt(engine)
    greedy = SamplingParams(n=2, temperature=0.0, max_tokens=5)
    a = engine.generate([p], greedy)[0]
    assert a[0].response_ids == a[1].response_ids
    # all-zero weights: every next-token distribution becomes uniform; they travel through the
    # checkpoint method's trainer half (a file) and its engine half, as in a run
    zeros = {k: torch.zeros_like(v) for k, v in engine.model.state_dict().items()}
    payload = sync_method("checkpoint").send(zeros, 7, tmp_path)
    assert engine.update_weights("checkpoint", payload, version=7) == 7
    out = engine.generate([p], SamplingParams(n=1, temperature=1.0, max_tokens=3))[0][0]
    assert out.model_version == 7
    vocab = engine.model.config.vocab_size
    torch.testing.assert_close(
        torch.tensor(out.logprobs),
        torch.full((len(out.logprobs),), -torch.log(torch.tensor(float(vocab)))),
    )


def test_a_handed_over_update_is_kept_not_copied_and_the_tie_holds(tiny_model_dir):
    """A sync method that hands its tensors over (`hands_over`): the engine keeps them as its
    parameters (one copy of the weights, not the transport's and its own), the tied output
    embedding follows the new input embedding, and it samples as an engine that copied the same
    weights does. Tensors of another dtype are converted (copied), never written into."""
    from trinity.models.loading import distinct_tensors
    from trinity.sync.method import SYNC_METHOD

    adopting, copying = (HFRolloutEngine(str(tiny_model_dir), seed=0) for _ in range(2))
    g = torch.Generator().manual_seed(0)
    new = {
        k: v.detach() + 0.05 * torch.randn(v.shape, generator=g)
        for k, v in distinct_tensors(adopting.model.state_dict()).items()
    }
    assert "lm_head.weight" not in new  # tied: sent once, under the input embedding's name
    assert SYNC_METHOD.get("memory").hands_over and SYNC_METHOD.get("checkpoint").hands_over
    assert not SYNC_METHOD.get("nccl").hands_over  # it receives the next version in place
    adopting.load_state(new, 5, take=True)
    held = adopting.model.state_dict()
    assert all(held[k].data_ptr() == t.data_ptr() for k, t in new.items())
    assert adopting.model.lm_head.weight is adopting.model.model.embed_tokens.weight
    copying.load_state({k: t.double() for k, t in new.items()}, 5, take=True)  # float64: cast
    assert copying.model.lm_head.weight.dtype == torch.float32
    assert all(copying.model.state_dict()[k].data_ptr() != t.data_ptr() for k, t in new.items())
    params = SamplingParams(n=2, temperature=1.0, max_tokens=6)
    a = adopting.generate([prompt(adopting)], params, keys=[11])[0]
    b = copying.generate([prompt(copying)], params, keys=[11])[0]
    assert [s.response_ids for s in a] == [s.response_ids for s in b]
    for x, y in zip(a, b, strict=True):  # equal up to kernel rounding (memory alignment)
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs))


class FakeEngine:
    """Stands in for a Ray actor handle: records the batches it is sent."""

    def __init__(self):
        self.calls = []
        outer = self

        class Method:
            def remote(self, prompts, params, keys=None):
                outer.calls.append((len(prompts), params))
                fut = asyncio.get_running_loop().create_future()
                # sample i of prompt [p] answers [p, i] (the handle records real Samples)
                fut.set_result(
                    [[Sample(p, [p[0], i], [0.0, 0.0], "stop", 0) for i in range(params.n)]
                     for p in prompts]
                )  # fmt: skip
                return fut

        self.generate = Method()


def test_batcher_merges_concurrent_requests_per_sampling_params():
    engines = [FakeEngine(), FakeEngine()]
    client = BatchingClient(engines)
    train = SamplingParams(n=4, temperature=1.0)
    greedy = SamplingParams(n=1, temperature=0.0)

    async def main():
        handles = [TaskModelHandle(client, None, train if i < 6 else greedy) for i in range(8)]
        return await asyncio.gather(*(h.generate([i]) for i, h in enumerate(handles)))

    out = [[s.response_ids for s in samples] for samples in asyncio.run(main())]
    # every request got its own answers back, in order
    assert out[0] == [[0, 0], [0, 1], [0, 2], [0, 3]] and out[7] == [[7, 0]]
    # 6 train prompts split 3/3 over two engines in one call each; 2 greedy prompts 1/1
    sizes = sorted((n, p.temperature) for e in engines for n, p in e.calls)
    assert sizes == [(1, 0.0), (1, 0.0), (3, 1.0), (3, 1.0)]


def test_keyed_tasks_sample_the_same_whatever_the_batching_and_engine_count(tiny_model_dir):
    params = SamplingParams(n=4, temperature=1.0, max_tokens=6)
    questions = ["1+2=", "3+4=", "5+6=", "7+8=", "12+34="]

    def engines(k):
        return [InProcess(HFRolloutEngine(str(tiny_model_dir), seed=10 * i)) for i in range(k)]

    async def task(client, tok, i):
        handle = TaskModelHandle(client, tok, params, key=1000 + i)
        first = await handle.chat([{"role": "user", "content": questions[i]}])
        # a workflow's 2nd call, made as soon as its 1st is answered, while the batch's other
        # shards may still run (it used to wait forever: no batch was gathering)
        second = await handle.generate(first[0].response_ids[:2] or [5])
        return [s.response_ids for s in first + second]

    async def together(k):  # every task at once: one batch per turn, sharded over k engines
        client = BatchingClient(engines(k))
        tok = client.engines[0].engine.tokenizer
        return await asyncio.gather(*(task(client, tok, i) for i in range(len(questions))))

    async def one_by_one():  # each task alone in its batches
        client = BatchingClient(engines(1))
        tok = client.engines[0].engine.tokenizer
        return [await task(client, tok, i) for i in reversed(range(len(questions)))][::-1]

    batched, sharded, alone = (
        asyncio.run(together(1)),
        asyncio.run(together(2)),
        asyncio.run(one_by_one()),
    )
    assert batched == sharded == alone
    assert len({tuple(map(tuple, r)) for r in batched}) == len(questions)


def _no_eos(engine):
    """Never stop at eos: every row runs to its length budget, so lengths are known exactly."""
    engine.eos_ids = set()
    return engine


def test_each_prompt_has_its_own_length_budget(tiny_model_dir):
    engine = HFRolloutEngine(str(tiny_model_dir), seed=0)
    short, long_ = prompt(engine, "1+2="), prompt(engine, "12+34=12+34=12+34=12+34=")
    assert len(long_) > len(short) + 8
    # room for 3 tokens after the long prompt; the short one has len(long) - len(short) + 3 > 8
    engine = _no_eos(HFRolloutEngine(str(tiny_model_dir), seed=0, max_model_len=len(long_) + 3))
    params = SamplingParams(n=2, temperature=1.0, max_tokens=8)
    together = engine.generate([short, long_], params, keys=[11, 12])
    alone = engine.generate([short], params, keys=[11])
    # short: min(8, max_model_len - len(short)) = 8 tokens (it got 3, the long one's room, when
    # the budget was the chunk's); long: min(8, 3) = 3
    assert [len(s.response_ids) for s in together[0]] == [8, 8]
    assert [len(s.response_ids) for s in together[1]] == [3, 3]
    assert all(s.finish_reason == "length" for g in together for s in g)
    # the short prompt's samples do not depend on its batch-mate (keyed sampling)
    assert [s.response_ids for s in together[0]] == [s.response_ids for s in alone[0]]


def test_an_over_long_prompt_fails_only_its_own_task(tiny_model_dir):
    from trinity.common.rollout import PromptTooLong

    questions = ["1+2=", "99+99=99+99=99+99=99+99=99+99=99+99=", "5+6="]
    probe = HFRolloutEngine(str(tiny_model_dir), seed=0)
    lengths = [len(prompt(probe, q)) for q in questions]
    limit = lengths[1]  # the long prompt fills max_model_len: no room for a response
    assert max(lengths[0], lengths[2]) + 6 < limit
    params = SamplingParams(n=3, temperature=1.0, max_tokens=6)

    def client():
        return BatchingClient(
            [InProcess(HFRolloutEngine(str(tiny_model_dir), seed=0, max_model_len=limit))]
        )

    async def task(c, i):
        handle = TaskModelHandle(c, c.engines[0].engine.tokenizer, params, key=500 + i)
        try:
            samples = await handle.chat([{"role": "user", "content": questions[i]}])
        except PromptTooLong as e:
            return str(e)
        return [s.response_ids for s in samples]

    async def together():
        c = client()
        return await asyncio.gather(*(task(c, i) for i in range(3)))

    async def alone(i):
        return await task(client(), i)

    batched = asyncio.run(together())
    assert isinstance(batched[1], str) and f"prompt of {limit} tokens" in batched[1]
    for i in (0, 2):  # served as if the long prompt were not in their batch
        assert batched[i] == asyncio.run(alone(i)), i
        assert len(batched[i]) == 3


def test_a_prompt_over_max_prompt_tokens_is_cut_not_sampled_and_masked():
    from trinity.common.experience import Experience
    from trinity.explorer.model_client import mask_prompt_truncated

    engine = FakeEngine()
    handle = TaskModelHandle(
        BatchingClient([engine]), None, SamplingParams(n=2), key=7, max_prompt_tokens=4
    )

    async def main():
        cut = await handle.generate([10, 11, 12, 13, 14, 15])  # 6 tokens > 4
        whole = await handle.generate([20, 21, 22, 23])  # 4 tokens: sent as is
        return cut, whole

    cut, whole = asyncio.run(main())
    assert [n for n, _ in engine.calls] == [1]  # only the prompt that fits reached the engine
    assert [s.response_ids for s in whole] == [[20, 0], [20, 1]]
    assert len(cut) == 2
    for s in cut:  # the first 4 tokens, the 5th as a one-token response, logprob 0
        assert (s.prompt_ids, s.response_ids, s.logprobs) == ([10, 11, 12, 13], [14], [0.0])
        assert s.finish_reason == "prompt_truncated" and s.info["prompt_tokens"] == 6
    assert handle.truncated_prompts == [[10, 11, 12, 13]]
    exps = [
        Experience(tokens=s.prompt_ids + s.response_ids, prompt_length=4, reward=1.0) for s in cut
    ] + [Experience(tokens=[20, 21, 22, 23, 9, 9], prompt_length=4, reward=1.0)]
    assert mask_prompt_truncated(exps, handle.truncated_prompts) == 2
    assert [e.action_mask.tolist() for e in exps] == [[False], [False], [True, True]]
    assert [bool(e.info.get("prompt_truncated")) for e in exps] == [True, True, False]


def test_an_engine_sharing_its_process_with_the_trainer_never_trims_and_samples_the_same(
    tiny_model_dir,
):
    """`trim_when_idle=False` (cluster.one_process: the trainer reuses what the engine frees):
    no idle-trim thread, and the same samples as an engine that trims."""
    params = SamplingParams(n=2, temperature=1.0, max_tokens=5)
    out = {}
    for trim in (True, False):
        engine = HFRolloutEngine(str(tiny_model_dir), seed=3, trim_when_idle=trim)
        assert (engine.idle_trim is not None) == trim
        out[trim] = [s.response_ids for s in engine.generate([prompt(engine)], params)[0]]
    assert out[True] == out[False]
