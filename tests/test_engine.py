"""Rollout engine and request batcher: logprobs are the policy's, stops at eos, weights update."""

import asyncio

import torch

from trinity.explorer.engine import HFRolloutEngine, SamplingParams
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


class FakeEngine:
    """Stands in for a Ray actor handle: records the batches it is sent."""

    def __init__(self):
        self.calls = []
        outer = self

        class Method:
            def remote(self, prompts, params, keys=None):
                outer.calls.append((len(prompts), params))
                fut = asyncio.get_running_loop().create_future()
                fut.set_result([[f"{p[0]}-{i}" for i in range(params.n)] for p in prompts])
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

    out = asyncio.run(main())
    # every request got its own answers back, in order
    assert out[0] == ["0-0", "0-1", "0-2", "0-3"] and out[7] == ["7-0"]
    # 6 train prompts split 3/3 over two engines in one call each; 2 greedy prompts 1/1
    sizes = sorted((n, p.temperature) for e in engines for n, p in e.calls)
    assert sizes == [(1, 0.0), (1, 0.0), (3, 1.0), (3, 1.0)]


class LocalActor:
    """An engine behind a Ray-handle-shaped facade: `engine.method.remote(...)` runs it now."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        method = getattr(self._engine, name)

        class Remote:
            @staticmethod
            def remote(*args):
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(method(*args))
                return fut

        return Remote()


def test_keyed_tasks_sample_the_same_whatever_the_batching_and_engine_count(tiny_model_dir):
    params = SamplingParams(n=4, temperature=1.0, max_tokens=6)
    questions = ["1+2=", "3+4=", "5+6=", "7+8=", "12+34="]

    def engines(k):
        return [LocalActor(HFRolloutEngine(str(tiny_model_dir), seed=10 * i)) for i in range(k)]

    async def task(client, tok, i):
        handle = TaskModelHandle(client, tok, params, key=1000 + i)
        first = await handle.chat([{"role": "user", "content": questions[i]}])
        # a workflow's 2nd call, made as soon as its 1st is answered, while the batch's other
        # shards may still run (it used to wait forever: no batch was gathering)
        second = await handle.generate(first[0].response_ids[:2] or [5])
        return [s.response_ids for s in first + second]

    async def together(k):  # every task at once: one batch per turn, sharded over k engines
        client = BatchingClient(engines(k))
        tok = client.engines[0]._engine.tokenizer
        return await asyncio.gather(*(task(client, tok, i) for i in range(len(questions))))

    async def one_by_one():  # each task alone in its batches
        client = BatchingClient(engines(1))
        tok = client.engines[0]._engine.tokenizer
        return [await task(client, tok, i) for i in reversed(range(len(questions)))][::-1]

    batched, sharded, alone = (
        asyncio.run(together(1)),
        asyncio.run(together(2)),
        asyncio.run(one_by_one()),
    )
    assert batched == sharded == alone
    assert len({tuple(map(tuple, r)) for r in batched}) == len(questions)
