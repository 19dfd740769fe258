"""Auxiliary models served to workflows (`explorer/auxiliary.py`): found by position or name,
sampled through their own engines with keys derived from the try, reachable through the real
`openai` client on an endpoint of their own, and never recorded into the policy's trajectories.
The explorer's wiring (engines, shares, endpoints) runs end to end in tests/test_judge_run.py."""

from __future__ import annotations

import asyncio

import pytest
from test_endpoint import on_a_loop_thread

from trinity.common.rollout import PromptTooLong, SamplingParams
from trinity.config import TrinityConfig
from trinity.endpoint.app import build_app
from trinity.endpoint.server import EndpointServer, WorkflowSessions
from trinity.explorer.auxiliary import (
    AuxiliaryModels,
    auxiliary_engines,
    auxiliary_limits,
    auxiliary_model,
    served_auxiliary,
)
from trinity.explorer.engine import HFRolloutEngine
from trinity.explorer.in_process import InProcess
from trinity.explorer.model_client import BatchingClient, TaskModelHandle
from trinity.workflows.base import SyncAuxiliaryHandle, SyncModelHandle

USER = [{"role": "user", "content": "1+2="}]


def config(**explorer) -> TrinityConfig:
    return TrinityConfig.model_validate(
        {"model": {"model_path": "m", "max_response_tokens": 6}, "explorer": explorer}
    )


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    """A policy engine and a judge engine (the same tiny weights, engines of their own)."""
    policy = HFRolloutEngine(str(tiny_model_dir), seed=0, num_threads=1)
    judge = HFRolloutEngine(str(tiny_model_dir), seed=5, num_threads=1)
    return policy, judge


def served(cfg: TrinityConfig, judge_engine) -> AuxiliaryModels:
    models = [
        auxiliary_model(cfg, i, BatchingClient([InProcess(judge_engine)]), judge_engine.tokenizer)
        for i in served_auxiliary(cfg)
    ]
    return AuxiliaryModels(models, list(cfg.explorer.auxiliary_models), "the trainer's teacher")


def policy_handle(engines, models, key=3, session=None) -> TaskModelHandle:
    policy, _ = engines
    return TaskModelHandle(
        BatchingClient([InProcess(policy)]),
        policy.tokenizer,
        SamplingParams(n=1, max_tokens=6),
        key=key,
        auxiliary=(models, models.handles(key, session)),
    )


def test_found_by_position_or_name_and_unknown_ones_are_named(engines) -> None:
    cfg = config(auxiliary_models=[{"model_path": "a"}, {"name": "judge", "model_path": "b"}])
    handle = policy_handle(engines, served(cfg, engines[1]))
    assert handle.auxiliary(1) is handle.auxiliary("judge")
    assert handle.auxiliary(0).model_path == "a" and handle.auxiliary(0).name is None
    with pytest.raises(LookupError, match=r"no auxiliary model 'grader'; served: 0, 1 \('judge'\)"):
        handle.auxiliary("grader")
    with pytest.raises(LookupError, match=r"no auxiliary_models\[2\]"):
        handle.auxiliary(2)
    with pytest.raises(TypeError):
        handle.auxiliary(True)
    # a session opened from the handle reaches the same models
    assert handle.session().auxiliary("judge") is handle.auxiliary("judge")
    bare = TaskModelHandle(handle._client, handle.tokenizer, SamplingParams())
    with pytest.raises(LookupError, match=r"set explorer\.auxiliary_models"):
        bare.auxiliary(0)


def test_the_teacher_of_on_policy_distill_is_not_served() -> None:
    aux = [{"model_path": "teacher", "engine_num": 2}, {"model_path": "judge", "engine_num": 3}]
    cfg = config(auxiliary_models=aux)
    assert served_auxiliary(cfg) == [0, 1] and auxiliary_engines(cfg) == 5
    distill = cfg.model_copy(
        update={
            "algorithm": cfg.algorithm.model_copy(update={"algorithm_type": "on_policy_distill"})
        }
    )
    assert served_auxiliary(distill) == [1] and auxiliary_engines(distill) == 3
    models = AuxiliaryModels([], list(distill.explorer.auxiliary_models), "the trainer's teacher")
    with pytest.raises(LookupError, match=r"auxiliary_models\[0\] is not served.*teacher"):
        models.find(0)


def test_limits_and_defaults_fall_back_to_the_model_s(engines) -> None:
    cfg = TrinityConfig.model_validate(
        {
            "model": {"model_path": "m", "max_model_len": 512, "max_response_tokens": 32,
                      "temperature": 0.7, "enable_thinking": False},
            "explorer": {"auxiliary_models": [
                {"model_path": "a", "max_prompt_tokens": 400},
                {"model_path": "b", "max_model_len": 4096, "enable_thinking": True},
            ]},
        }
    )  # fmt: skip
    assert auxiliary_limits(cfg, 0) == (512, 400, 32)
    assert auxiliary_limits(cfg, 1) == (4096, None, 32)
    models = served(cfg, engines[1])
    a, b = models.find(0), models.find(1)
    assert a.defaults == SamplingParams(n=1, temperature=0.7, max_tokens=32)
    assert a.template_kwargs == {"enable_thinking": False}
    assert b.template_kwargs == {"enable_thinking": True}


def test_calls_are_keyed_by_the_try_and_never_recorded(engines) -> None:
    cfg = config(auxiliary_models=[{"name": "judge", "model_path": "j"}])

    async def main():
        handle = policy_handle(engines, served(cfg, engines[1]))
        [own] = await handle.chat(USER)
        judge = handle.auxiliary("judge")
        a = await judge.chat(USER, temperature=1.0, max_tokens=6)
        b = await judge.generate("1+2=", temperature=1.0, max_tokens=6)
        again = policy_handle(engines, served(cfg, engines[1])).auxiliary("judge")
        a2 = await again.chat(USER, temperature=1.0, max_tokens=6)  # same try key: same draw
        other = policy_handle(engines, served(cfg, engines[1]), key=4).auxiliary(0)
        c = await other.chat(USER, temperature=1.0, max_tokens=6)
        return handle, own, a, b, a2, c

    handle, own, a, b, a2, c = asyncio.run(main())
    assert a[0].response_ids == a2[0].response_ids
    assert a[0].response_ids != c[0].response_ids  # another try samples anew
    assert "call_id" not in a[0].info and "call_id" not in b[0].info  # no ledger record
    # only the policy's one call is recorded and extracted
    assert handle.ledger_stats().calls == 1
    [exp] = handle.extract_experiences(reward=1.0)
    assert exp.tokens.tolist() == own.prompt_ids + own.response_ids


def test_a_prompt_over_max_prompt_tokens_is_refused_not_cut(engines) -> None:
    cfg = config(auxiliary_models=[{"model_path": "j", "max_prompt_tokens": 4}])
    handle = policy_handle(engines, served(cfg, engines[1]))
    with pytest.raises(PromptTooLong, match="refuse a prompt rather than cut it"):
        asyncio.run(handle.auxiliary(0).chat(USER))


def test_openai_clients_reach_the_model_on_its_endpoint(engines) -> None:
    """As in the explorer: the auxiliary model's endpoint serves the running try's handle
    under its session, so the client and `chat` with one seed give the same reply; a model
    without enable_openai_api has no client."""
    cfg = config(
        auxiliary_models=[
            {"name": "judge", "model_path": "tiny-judge", "enable_openai_api": True},
            {"model_path": "plain"},
        ]
    )

    async def main() -> None:
        models = served(cfg, engines[1])
        judge_model = models.find("judge")
        judge_model.sessions = WorkflowSessions(
            "tiny-judge", len(judge_model.tokenizer), 6, judge_model.client
        )
        server = EndpointServer(build_app(judge_model.sessions))
        judge_model.url = await server.start()
        try:
            handle = policy_handle(engines, models, session="try-1")
            judge = handle.auxiliary("judge")
            judge_model.sessions.sessions["try-1"] = judge
            client = judge.async_openai_client()
            assert client.model_path == "tiny-judge"
            r = await client.chat.completions.create(
                model=client.model_path, messages=USER, seed=5, max_tokens=6
            )
            [direct] = await judge.chat(USER, seed=5, max_tokens=6)
            assert r.choices[0].message.content == judge.decode(direct.response_ids)
            with pytest.raises(RuntimeError, match=r"auxiliary_models\[1\].enable_openai_api"):
                handle.auxiliary(1).openai_client()
            # a blocking workflow's view: the same calls from a worker thread
            sync = SyncModelHandle(handle, asyncio.get_running_loop()).auxiliary("judge")
            assert isinstance(sync, SyncAuxiliaryHandle) and sync.model_path == "tiny-judge"
            [threaded] = await asyncio.to_thread(sync.chat, USER, seed=5, max_tokens=6)
            assert threaded.response_ids == direct.response_ids

            def blocking() -> str:
                oai = sync.openai_client()
                out = oai.chat.completions.create(
                    model=oai.model_path, messages=USER, seed=5, max_tokens=6
                )
                return out.choices[0].message.content

            assert await asyncio.to_thread(blocking) == r.choices[0].message.content
            # on the loop's own thread, the blocking client of an auxiliary model is refused at
            # once too (it would hold the loop serving it until its timeout)
            with pytest.raises(RuntimeError, match="async_openai_client"):
                judge.openai_client(timeout=600).chat.completions.create(
                    model="tiny-judge", messages=USER, max_tokens=6
                )
            assert handle.ledger_stats().calls == 0  # none of it is the policy's
        finally:
            await server.stop()

    on_a_loop_thread(main)
