"""A crashed rollout engine is restarted by Ray and given back the weights it held.

Real Ray actors of the transformers engine; a crash is `ray.kill(..., no_restart=False)`, which
kills the actor's process the way an OOM kill or a segfault would and lets Ray restart it.
"""

from __future__ import annotations

import asyncio
import math
import time

import pytest
import ray
import torch
from ray.exceptions import ActorUnavailableError

from trinity.common.rollout import SamplingParams
from trinity.explorer.engine import HFRolloutEngine
from trinity.explorer.model_client import BatchingClient, EngineLost
from trinity.sync.method import sync_method


@pytest.fixture(scope="module")  # one instance for both tests: their actors never meet
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="engine-restart")
    yield
    ray.shutdown()


async def _killed_and_back(engine, timeout: float = 60.0) -> None:
    """Kill `engine`'s process and wait until Ray has started a new one (which holds the
    random-init weights, version 0): `ray.kill` returns before the process is gone, so a call
    made at once can still reach the old one."""
    ray.kill(engine, no_restart=False)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await engine.weights_version.remote() == 0:
                return
        except ActorUnavailableError:
            pass  # restarting
        assert time.monotonic() < deadline, "Ray did not restart the killed engine"
        await asyncio.sleep(0.2)


def _zero_weights(model_dir) -> dict[str, torch.Tensor]:
    engine = HFRolloutEngine(str(model_dir), seed=0, num_threads=1)
    return {k: torch.zeros_like(v) for k, v in engine.model.state_dict().items()}


@pytest.mark.long  # an engine actor killed and restarted (about 30 s on 2 cores)
def test_a_crashed_engine_comes_back_with_the_weights_it_held(tiny_model_dir, ray_local, tmp_path):
    zeros = _zero_weights(tiny_model_dir)
    engine_cls = ray.remote(HFRolloutEngine).options(num_cpus=0, max_restarts=2)
    engines = [engine_cls.remote(str(tiny_model_dir), seed=i, num_threads=1) for i in range(2)]
    client = BatchingClient(engines, restart_timeout=120)
    sample = SamplingParams(n=2, temperature=1.0, max_tokens=3)
    # all-zero weights make every next-token distribution uniform: logprob -log(vocab) each,
    # which the random-init weights a restarted engine starts from never give
    vocab = zeros["model.embed_tokens.weight"].shape[0]
    uniform = -math.log(vocab)

    async def both_engines() -> list:
        # two prompts in one turn of the loop: one shard for each engine
        return await asyncio.gather(
            client.generate([5, 6, 7], sample), client.generate([8], sample)
        )

    async def main() -> None:
        await client.update_weights("memory", sync_method("memory").send(zeros, 7, tmp_path), 7)
        await _killed_and_back(engines[1])  # a crash between calls: Ray restarts it silently
        for samples in await both_engines():
            for s in samples:
                assert s.model_version == 7
                assert s.logprobs == pytest.approx([uniform] * len(s.logprobs), abs=1e-5)
        assert client.restarts == 1
        assert await engines[1].weights_version.remote() == 7
        # a crash during a call: the call is sent again once the engine is back
        pending = asyncio.ensure_future(both_engines())
        await asyncio.sleep(0)  # the batch is on its way to both engines
        ray.kill(engines[0], no_restart=False)
        for samples in await pending:
            assert all(s.model_version == 7 for s in samples)
        assert await client.logprobs([5, 6, 7]) == pytest.approx([uniform] * 2, abs=1e-5)
        assert client.restarts == 2
        # a crash between calls, then a weight load: counted, and the new weights replace the lost
        await _killed_and_back(engines[1])
        await client.update_weights("memory", sync_method("memory").send(zeros, 8, tmp_path), 8)
        assert client.restarts == 3
        assert [await e.weights_version.remote() for e in engines] == [8, 8]

    asyncio.run(main())


def test_an_engine_ray_does_not_restart_ends_the_call_with_engine_lost(tiny_model_dir, ray_local):
    engine = (
        ray.remote(HFRolloutEngine)
        .options(num_cpus=0, max_restarts=0)
        .remote(str(tiny_model_dir), seed=0, num_threads=1)
    )
    client = BatchingClient([engine], restart_timeout=30)
    sample = SamplingParams(n=1, temperature=1.0, max_tokens=2)

    async def main() -> None:
        assert len(await client.generate([5, 6], sample)) == 1
        ray.kill(engine, no_restart=True)  # dead for good, as when max_restarts are used up
        with pytest.raises(EngineLost, match="rollout engine 0 crashed and Ray did not restart"):
            await client.generate([5, 6], sample)
        assert client.restarts == 0

    asyncio.run(main())
