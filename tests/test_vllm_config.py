"""`engine_type: vllm` in the config: accepted where vLLM is installed, refused with the fix where
it is not, its knobs acted upon in a vLLM pool and noted as not applicable elsewhere, and the
layouts and sync methods it cannot serve refused by name. (Runs without vLLM: only the config.)"""

from __future__ import annotations

import pytest

from trinity.common.rollout import pool_kwargs
from trinity.config import TrinityConfig, check_config, engine_schema
from trinity.config.support import not_applicable_notes, not_built_problems


def _cfg(**over: dict) -> TrinityConfig:
    base = {"model": {"model_path": "m"}, "buffer": {"explorer_input": {"taskset": {"path": "t"}}}}
    return TrinityConfig.model_validate({**base, **over})


def _vllm(**rollout: object) -> dict:
    return {"explorer": {"rollout_model": {"engine_type": "vllm", **rollout}}}


def _problems(cfg: TrinityConfig) -> dict[str, str]:
    return {p.path: p.message for p in check_config(cfg) + not_built_problems(cfg)}


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_schema, "vllm_installed", lambda: True)


def test_vllm_is_accepted_where_it_is_installed(installed: None) -> None:
    assert _problems(_cfg(**_vllm())) == {}


def test_without_vllm_the_engine_type_is_refused_naming_the_fix(monkeypatch) -> None:
    monkeypatch.setattr(engine_schema, "vllm_installed", lambda: False)
    (msg,) = _problems(_cfg(**_vllm())).values()
    assert "vLLM is not installed" in msg
    assert "scripts/setup.sh vllm" in msg and "pip install 'trinity[vllm]'" in msg
    aux = {"explorer": {"auxiliary_models": [{"model_path": "j", "engine_type": "vllm"}]}}
    assert list(_problems(_cfg(**aux))) == ["explorer.auxiliary_models[0].engine_type"]
    assert _problems(_cfg()) == {}  # the transformers engine needs nothing


def test_vllm_knobs_act_in_a_vllm_pool_and_are_noted_in_a_transformers_one(installed) -> None:
    knobs = {"gpu_memory_utilization": 0.5, "enforce_eager": False, "enable_prefix_caching": True}
    hf = not_applicable_notes(_cfg(explorer={"rollout_model": knobs}))
    assert sorted(n.split(":")[0] for n in hf) == [
        f"explorer.rollout_model.{k}" for k in sorted(knobs)
    ]
    assert not_applicable_notes(_cfg(**_vllm(**knobs))) == []
    # per pool: an auxiliary vLLM pool acts on its own knobs beside a transformers rollout pool
    aux = [{"model_path": "j", "engine_type": "vllm", "enforce_eager": False}]
    notes = not_applicable_notes(_cfg(explorer={"auxiliary_models": aux}))
    assert notes == []
    # a knob no vLLM release we run reads is noted even there
    (note,) = not_applicable_notes(_cfg(**_vllm(use_v1=False)))
    assert note.startswith("explorer.rollout_model.use_v1: not applicable here (vLLM")


def test_engine_classes_get_the_pool_keys_they_name() -> None:
    class Plain:
        pass

    class WithKnobs:
        pool_keys = ("enforce_eager", "gpu_memory_utilization")

    pool = _cfg(**_vllm(gpu_memory_utilization=0.3)).explorer.rollout_model
    assert pool_kwargs(Plain, pool) == {}
    assert pool_kwargs(WithKnobs, pool) == {"enforce_eager": True, "gpu_memory_utilization": 0.3}


@pytest.mark.parametrize(
    ("over", "rollout", "path", "says"),
    [
        ({"synchronizer": {"sync_method": "shared"}}, {}, "synchronizer.sync_method", "own layout"),
        ({"cluster": {"one_process": True}}, {}, "cluster.one_process", "process of its own"),
        (
            {},
            {"in_explorer_process": True},
            "explorer.rollout_model.in_explorer_process",
            "not on a thread of the explorer",
        ),
    ],
)
def test_what_the_vllm_engine_cannot_serve_is_refused_by_name(
    installed, over, rollout, path, says
) -> None:
    problems = _problems(_cfg(**_vllm(**rollout), **over))
    assert path in problems and says in problems[path]
    ours = _problems(_cfg(explorer={"rollout_model": rollout}, **over))
    assert says not in ours.get(path, "")  # not said of our engine
