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
            def remote(self, prompts, params):
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
