"""Tests of trinity.config: loading, error reports, interpolation, overrides, stages, resolve()."""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path

import pytest

from trinity.config import (
    ConfigError,
    Problem,
    StageConfig,
    TrinityConfig,
    dump_config,
    format_batch_table,
    load_config,
    resolve,
    stage_configs,
    validate_config,
)

MINIMAL = """
model:
  model_path: Qwen/Qwen2.5-0.5B-Instruct
buffer:
  explorer_input:
    taskset:
      path: data/gsm8k
"""


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    """Write dedented YAML into tmp_path and return its path."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(path: Path, overrides: tuple[str, ...] = ()) -> dict[str, Problem]:
    """Load a config that must fail; return its problems keyed by path."""
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return {p.path: p for p in info.value.problems}


# --- loading and defaults --------------------------------------------------------------------


def test_minimal_config_loads_with_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, MINIMAL))
    assert cfg.model.model_path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert cfg.buffer.explorer_input.taskset is not None
    assert cfg.buffer.explorer_input.taskset.path == "data/gsm8k"
    assert cfg.buffer.explorer_input.taskset.format.prompt_key == "prompt"
    assert cfg.mode == "both"
    assert cfg.algorithm.algorithm_type == "grpo"
    assert cfg.algorithm.optimizer.betas == (0.9, 0.999)
    assert cfg.synchronizer.sync_method is None  # unset: the best available here
    assert resolve(cfg).sync_method == "memory"
    assert cfg.trainer.micro_batch_size_per_gpu == 8
    assert cfg.stages == [] and cfg.stage_name == ""


def test_default_constructible() -> None:
    cfg = TrinityConfig()
    assert cfg.buffer.batch_size == 1 and cfg.monitor.monitor_type == "tensorboard"


def test_yaml_scalars_follow_omegaconf(tmp_path: Path) -> None:
    # OmegaConf's loader, as Trinity-RFT's: `1e-6` is a float (PyYAML alone reads a string) and
    # YAML 1.1 booleans hold (`on` is True); a quoted "no" stays text.
    path = write(
        tmp_path,
        MINIMAL
        + """
name: "no"
algorithm:
  optimizer: {lr: 1e-6}
  advantage_fn_args: {eps: 1e-6, flag: on, date: 2024-01-02}
""",
    )
    cfg = load_config(path)
    assert cfg.name == "no"
    assert cfg.algorithm.optimizer.lr == 1e-6
    # no timestamps either: a date stays text
    assert cfg.algorithm.advantage_fn_args == {"eps": 1e-6, "flag": True, "date": "2024-01-02"}
    # an unquoted `no` is the boolean false, which is not a run name
    probs = problems_of(write(tmp_path, MINIMAL + "name: no\n", name="b.yaml"))
    assert probs["name"].message == "expected a string, got False (bool)"


def test_every_field_has_a_description() -> None:
    import pydantic

    import trinity.config as tc
    from trinity.config.base import ConfigSection, field_description

    def sections(cls: type) -> list[type]:
        return [cls, *(c for sub in cls.__subclasses__() for c in sections(sub))]

    exported = [c for c in vars(tc).values() if isinstance(c, type)]
    classes = {
        *sections(ConfigSection),
        *(c for c in exported if issubclass(c, pydantic.BaseModel)),
    }
    assert len(classes) > 30
    missing = [
        f"{cls.__name__}.{name}"
        for cls in classes
        for name in cls.model_fields
        if not field_description(cls, name)
    ]
    assert missing == []


def test_a_field_description_is_its_docstring_or_its_field_description() -> None:
    from trinity.config import OptimizerConfig, StageConfig
    from trinity.config.base import field_description

    assert field_description(StageConfig, "stage_name") == "Name of the stage (required)."
    assert field_description(OptimizerConfig, "lr") == "Peak learning rate."


def test_stage_fields_mirror_top_level_fields() -> None:
    top = set(TrinityConfig.model_fields) - {"stages"}
    assert set(StageConfig.model_fields) == top


# --- error reports ---------------------------------------------------------------------------


def test_unknown_keys_at_several_depths(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
projet: demo
model: {model_path: m}
algorithm:
  repeat_time: 8
  optimizer: {lrr: 1.0e-6}
buffer:
  explorer_input:
    taskset:
      path: data/gsm8k
    eval_tasksets:
      - path: data/test
        format: {prompt_kye: question}
  trainer_input:
    auxiliary_buffers:
      sft: {path: data/sft, capacty: 10}
""",
    )
    probs = problems_of(path)
    expected = {
        "projet": "project",
        "algorithm.repeat_time": "repeat_times",
        "algorithm.optimizer.lrr": "lr",
        "buffer.explorer_input.eval_tasksets[0].format.prompt_kye": "prompt_key",
        "buffer.trainer_input.auxiliary_buffers.sft.capacty": "capacity",
    }
    assert set(probs) == set(expected)
    for key, suggestion in expected.items():
        assert probs[key].message == "unknown key"
        assert probs[key].did_you_mean == suggestion


def test_key_in_the_wrong_section_suggests_its_place(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "optimizer: {lr: 1.0e-6}\nmodel_path: m\n")
    probs = problems_of(path, ("algorithm.betas=[0.9, 0.95]",))
    assert probs["optimizer"].did_you_mean == "algorithm.optimizer"
    assert probs["algorithm.betas"].did_you_mean == "algorithm.optimizer.betas"
    assert probs["model_path"].did_you_mean == "model.model_path"  # shallowest match wins


def test_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "algorithm: {repeat_times: many}\n")
    (prob,) = problems_of(path).values()
    assert prob.path == "algorithm.repeat_times"
    assert "expected an integer" in prob.message and "'many'" in prob.message


def test_bad_enum_lists_allowed_values(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "synchronizer: {sync_method: nccll}\n")
    (prob,) = problems_of(path).values()
    assert prob.path == "synchronizer.sync_method"
    for allowed in ("'checkpoint'", "'memory'", "'nccl'"):
        assert allowed in prob.message
    assert prob.did_you_mean == "nccl"


def test_bad_monitor_type_in_list(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "monitor: {monitor_type: [jsonl, tensorbord]}\n")
    (prob,) = problems_of(path).values()
    assert prob.path == "monitor.monitor_type"
    assert "'tensorbord'" in prob.message and "'wandb'" in prob.message
    assert prob.did_you_mean == "tensorboard"


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        mode: explor
        algorithm: {repeat_time: 8}
        model: {model_path: m, top_p: 1.5, temperature: -1}
        buffer:
          batch_size: 0
          explorer_input: {taskset: {path: d}}
        synchronizer: {sync_interval: 0, sync_offset: -1}
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    assert err.source == str(path)
    assert {p.path for p in err.problems} == {
        "mode",
        "algorithm.repeat_time",
        "model.top_p",
        "model.temperature",
        "buffer.batch_size",
        "synchronizer.sync_interval",
        "synchronizer.sync_offset",
    }
    text = str(err)
    lines = text.splitlines()
    assert lines[0] == f"{path}: 7 problems"
    assert "  algorithm.repeat_time: unknown key (did you mean 'repeat_times'?)" in lines
    assert len(lines) == 8


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_invalid_yaml_reports_line(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  model_path: m\n  top_p: [1\nbuffer: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert str(path) in text and "line 4" in text


def test_top_level_must_be_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="empty"):
        load_config(write(tmp_path, "", name="empty.yaml"))


def test_duplicate_keys_are_errors(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "seed: 1\nseed: 2\n")
    with pytest.raises(ConfigError, match="'seed' is written twice"):
        load_config(path)


def test_config_error_pickles() -> None:
    err = ConfigError([Problem("a.b", "unknown key", "c")], "x.yaml")
    again = pickle.loads(pickle.dumps(err))
    assert again.problems == err.problems and str(again) == str(err)
    assert str(err) == "x.yaml: 1 problem\n  a.b: unknown key (did you mean 'c'?)"


# --- cross-field checks ----------------------------------------------------------------------


def test_cross_field_checks(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        mode: train
        algorithm:
          policy_loss_fn_args: {clip_range_low: 0.2, clip_range_high: -0.1}
        model: {max_model_len: 100, max_prompt_tokens: 60, max_response_tokens: 50}
        buffer: {total_steps: 10}
        trainer: {total_steps: 20}
        """,
    )
    probs = problems_of(path)
    assert set(probs) == {
        "model.model_path",
        "model.max_model_len",
        "buffer.trainer_input.experience_buffer",
        "algorithm.policy_loss_fn_args.clip_range_high",
        "trainer.total_steps",
    }
    assert "60 + 50 = 110" in probs["model.max_model_len"].message


def test_a_malformed_call_penalty_needs_policy_penalize(tmp_path: Path) -> None:
    text = "model: {model_path: m}\nexplorer: {malformed_tool_calls: {%s}}\n"
    probs = problems_of(write(tmp_path, text % "policy: mask, penalty: -0.5"))
    assert "policy is 'mask'" in probs["explorer.malformed_tool_calls.penalty"].message
    probs = problems_of(write(tmp_path, text % "policy: penalize, penalty: -0.5", "ok.yaml"))
    assert not any(p.startswith("explorer.") for p in probs)  # the run's other gaps only


def test_explore_needs_taskset_with_path(tmp_path: Path) -> None:
    probs = problems_of(write(tmp_path, "mode: explore\nmodel: {model_path: m}\n"))
    assert list(probs) == ["buffer.explorer_input.taskset"]
    path = write(
        tmp_path,
        """
        model: {model_path: m}
        buffer:
          explorer_input:
            taskset: {storage_type: synthetic}
            eval_tasksets: [{name: e}]
        """,
    )
    assert set(problems_of(path)) == {
        "buffer.explorer_input.taskset.path",
        "buffer.explorer_input.eval_tasksets[0].path",
    }


def test_no_knock_on_problems(tmp_path: Path) -> None:
    # A typo inside the taskset must not also claim that the taskset is missing.
    path = write(
        tmp_path,
        """
        model: {model_path: m, top_p: 0}
        buffer:
          explorer_input:
            taskset: {pth: data}
        """,
    )
    assert set(problems_of(path)) == {
        "model.top_p",
        "buffer.explorer_input.taskset.pth",
    }


# --- interpolation ---------------------------------------------------------------------------


def test_env_interpolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRINITY_TEST_MODEL", "my/model")
    monkeypatch.delenv("TRINITY_TEST_N", raising=False)
    monkeypatch.delenv("TRINITY_TEST_ROOT", raising=False)
    path = write(
        tmp_path,
        """
        checkpoint_root_dir: ${oc.env:TRINITY_TEST_ROOT,/tmp/ck}/runs
        model: {model_path: "${oc.env:TRINITY_TEST_MODEL}"}
        algorithm:
          repeat_times: ${oc.env:TRINITY_TEST_N,4}
          advantage_fn_args: {n: "${oc.env:TRINITY_TEST_N,4}", s: "${oc.env:TRINITY_TEST_N,'4'}"}
        buffer:
          explorer_input: {taskset: {path: data}}
        """,
    )
    cfg = load_config(path)
    assert cfg.model.model_path == "my/model"
    assert cfg.checkpoint_root_dir == "/tmp/ck/runs"
    assert cfg.algorithm.repeat_times == 4
    # oc.env gives text, as in OmegaConf: a typed field converts it, a free mapping keeps it
    assert cfg.algorithm.advantage_fn_args == {"n": "4", "s": "4"}


def test_env_interpolation_missing_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRINITY_TEST_UNSET", raising=False)
    path = write(
        tmp_path,
        MINIMAL + "algorithm: {repeat_times: '${oc.env:TRINITY_TEST_UNSET}'}\ngroup: ${foo.bar}\n",
    )
    probs = problems_of(path)
    assert set(probs) == {"algorithm.repeat_times", "group"}
    assert (
        "Environment variable 'TRINITY_TEST_UNSET' not found"
        in probs["algorithm.repeat_times"].message
    )
    assert "key 'foo.bar' not found" in probs["group"].message  # a reference to a missing key


# --- overrides -------------------------------------------------------------------------------


def test_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        MINIMAL
        + """
    eval_tasksets:
      - {name: a, path: data/a}
      - {name: b, path: data/b}
""",
    )
    cfg = load_config(
        path,
        [
            "algorithm.optimizer.lr=2e-6",
            "algorithm.repeat_times=8",
            "buffer.explorer_input.eval_tasksets.1.path=data/c",
            "trainer.use_dynamic_bsz=false",
            "trainer.max_token_len_per_gpu=null",
            "algorithm.kl_loss_fn_args.kl_coef=0.01",
            "name=",
        ],
    )
    assert cfg.algorithm.optimizer.lr == 2e-6
    assert cfg.algorithm.repeat_times == 8
    assert [t.path for t in cfg.buffer.explorer_input.eval_tasksets] == ["data/a", "data/c"]
    assert cfg.trainer.use_dynamic_bsz is False
    assert cfg.algorithm.kl_loss_fn_args == {"kl_coef": 0.01}
    assert cfg.name == ""


def test_bad_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    probs = problems_of(
        path,
        (
            "algorithm.repeat_time=8",
            "buffer.explorer_input.eval_tasksets.0.path=x",
            "buffer.batch_size.x=1",
            "no_equals_sign",
        ),
    )
    assert probs["algorithm.repeat_time"].did_you_mean == "repeat_times"
    assert "override" in probs["algorithm.repeat_time"].message
    assert "index out of range" in probs["buffer.explorer_input.eval_tasksets[0]"].message
    assert "single value" in probs["buffer.batch_size"].message
    assert "key.path=value" in probs[""].message
    assert len(probs) == 4


# --- no mutation, resolve() ------------------------------------------------------------------


def test_loaded_config_holds_user_values(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "algorithm: {repeat_times: 8}\n")
    cfg = load_config(path)
    assert cfg.buffer.train_batch_size == 0  # as written (default); resolve() derives it
    assert cfg.trainer.max_token_len_per_gpu is None
    assert cfg.model_dump(exclude_unset=True) == {
        "model": {"model_path": "Qwen/Qwen2.5-0.5B-Instruct"},
        "buffer": {"explorer_input": {"taskset": {"path": "data/gsm8k"}}},
        "algorithm": {"repeat_times": 8},
    }
    assert resolve(cfg).train_batch_size == 8  # 1 task × 8 samples


def test_resolve_fixed_micro_batches() -> None:
    cfg = validate_config(
        {
            "checkpoint_root_dir": "/ck/",
            "project": "p",
            "name": "n",
            "model": {"model_path": "m"},
            "algorithm": {"repeat_times": 8},
            "buffer": {"batch_size": 16, "explorer_input": {"taskset": {"path": "d"}}},
            "trainer": {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": 12},
            "synchronizer": {"sync_interval": 2, "sync_offset": 1, "sync_method": "nccl"},
        }
    )
    r = resolve(cfg)
    assert r.run_dir == "/ck/p/n"
    assert r.tasks_per_step == 16
    assert r.samples_per_task == 8
    assert r.experiences_per_explore_step == 128  # 16 tasks × 8 samples
    assert r.train_batch_size == 128 and r.train_batch_size_derived
    assert r.micro_batch_size == 12
    assert r.grad_accum_steps == 11  # ceil(128 / 12) = ceil(10.67)
    assert r.total_steps is None
    assert (r.sync_interval, r.sync_offset, r.sync_method) == (2, 1, "nccl")
    assert (r.mode, r.algorithm_type) == ("both", "grpo")


def test_nccl_alias_and_split_modes_fall_back_to_checkpoint() -> None:
    base = {
        "model": {"model_path": "m"},
        "buffer": {
            "explorer_input": {"taskset": {"path": "d"}},
            "trainer_input": {"experience_buffer": {"name": "e", "storage_type": "queue"}},
        },
    }
    online = validate_config({**base, "synchronizer": {"sync_method": "online"}})
    assert resolve(online).sync_method == "nccl"  # Trinity-RFT's old name
    for mode in ("train", "explore"):
        cfg = validate_config({**base, "mode": mode, "synchronizer": {"sync_method": "nccl"}})
        r = resolve(cfg)
        assert r.sync_method == "checkpoint" and "mode both" in r.sync_method_source


def test_resolve_explicit_train_batch_and_dynamic_bsz() -> None:
    cfg = TrinityConfig.model_validate(
        {
            "algorithm": {"repeat_times": 4},
            "buffer": {"batch_size": 8, "train_batch_size": 20, "total_steps": 30},
            "trainer": {"max_token_len_per_gpu": 4096},
        }
    )
    r = resolve(cfg)
    assert r.experiences_per_explore_step == 32  # 8 × 4
    assert r.train_batch_size == 20 and not r.train_batch_size_derived
    assert r.grad_accum_steps is None  # dynamic: packed by tokens
    assert r.max_token_len_per_micro_batch == 4096
    assert (r.total_steps, r.total_steps_source) == (30, "buffer.total_steps")
    assert r.run_dir == "./checkpoints/trinity/run"


def test_batch_table_says_units() -> None:
    cfg = TrinityConfig.model_validate(
        {
            "algorithm": {"repeat_times": 8},
            "buffer": {"batch_size": 16},
            "trainer": {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": 4},
        }
    )
    table = format_batch_table(resolve(cfg))
    lines = table.splitlines()
    assert any(
        line.startswith("tasks per explore step") and line.endswith("16  (buffer.batch_size)")
        for line in lines
    )
    for words in ("samples per task", "experiences per train step", "experiences per micro-batch"):
        assert words in table
    assert "ceil(128 / 4)" in table
    dynamic = format_batch_table(resolve(TrinityConfig()))
    assert "tokens per micro-batch" in dynamic and "dynamic" in dynamic


# --- stages ----------------------------------------------------------------------------------

STAGED = (
    MINIMAL
    + """
algorithm: {algorithm_type: grpo, repeat_times: 4}
stages:
  - stage_name: sft_warmup
    algorithm: {algorithm_type: sft}
  - stage_name: rl
    algorithm: {algorithm_type: gspo}
    trainer: {save_interval: 10}
"""
)


def test_stage_merge(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, STAGED))
    first, second = stage_configs(cfg)
    assert (first.stage_name, second.stage_name) == ("sft_warmup", "rl")
    assert second.algorithm.algorithm_type == "gspo"
    assert second.algorithm.repeat_times == 4  # kept from the base by the deep merge
    assert second.model.model_path == cfg.model.model_path
    assert second.trainer.save_interval == 10 and first.trainer.save_interval is None
    assert second.name == cfg.name and second.stages == []
    assert cfg.algorithm.algorithm_type == "grpo"  # base unchanged
    assert stage_configs(first) == [first]


def test_bad_key_inside_stage(tmp_path: Path) -> None:
    text = STAGED.replace(
        "trainer: {save_interval: 10}", "trainer: {save_intervall: 10}\n    foo: 1"
    )
    probs = problems_of(write(tmp_path, text))
    assert set(probs) == {"stages[1].trainer.save_intervall", "stages[1].foo"}
    assert probs["stages[1].trainer.save_intervall"].did_you_mean == "save_interval"


def test_base_problem_not_repeated_per_stage(tmp_path: Path) -> None:
    text = STAGED.replace("repeat_times: 4", "repeat_time: 4").replace(
        "- stage_name: rl\n", "- stage_name: rl\n    mode: train\n"
    )
    probs = problems_of(write(tmp_path, text))
    assert set(probs) == {
        "algorithm.repeat_time",
        "stages[1].buffer.trainer_input.experience_buffer",
    }


def test_stage_needs_unique_name(tmp_path: Path) -> None:
    text = STAGED.replace("stage_name: rl", "stage_name: sft_warmup")
    probs = problems_of(write(tmp_path, text))
    assert set(probs) == {"stages[0].stage_name", "stages[1].stage_name"}


def test_stage_override_via_command_line(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, STAGED), ["stages.0.algorithm.repeat_times=2"])
    assert [c.algorithm.repeat_times for c in stage_configs(cfg)] == [2, 4]
    # list items also as error reports print them
    same = load_config(write(tmp_path, STAGED), ["stages[0].algorithm.repeat_times=2"])
    assert same == cfg


# --- dump ------------------------------------------------------------------------------------


def test_dump_round_trips(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, STAGED))
    text = dump_config(cfg)
    assert "micro_batch_size_per_gpu: 8" in text and "stage_name: rl" in text
    again = load_config(write(tmp_path, text, name="dumped.yaml"))
    assert again.model_dump() == cfg.model_dump()
    assert [c.algorithm.algorithm_type for c in stage_configs(again)] == ["sft", "gspo"]


def test_save_interval_defaults_to_a_tenth_of_the_run() -> None:
    base = {"model": {"model_path": "m"}, "buffer": {"explorer_input": {"taskset": {"path": "t"}}}}

    def resolved(buffer: dict, trainer: dict | None = None):
        data = {**base, "buffer": {**base["buffer"], **buffer}, "trainer": trainer or {}}
        return resolve(validate_config(data))

    # ceil(40 / 10) = 4; ceil(35 / 10) = ceil(3.5) = 4; ceil(5 / 10) = 1
    assert resolved({"total_steps": 40}).save_interval == 4
    assert resolved({"total_steps": 35}).save_interval == 4
    assert resolved({"total_steps": 5}).save_interval == 1
    # steps planned at run time: derived there from the planned count, ceil(95 / 10) = 10
    auto = resolved({})
    assert auto.save_interval is None and auto.save_interval_for(95) == 10
    # explicit values win; 0 = only at the end (Trinity-RFT's meaning)
    assert resolved({"total_steps": 40}, {"save_interval": 3}).save_interval_for(40) == 3
    end = resolved({"total_steps": 40}, {"save_interval": 0})
    assert end.save_interval_for(40) == 0
    table = format_batch_table(resolved({"total_steps": 40}))
    assert "train steps per checkpoint" in table and "ceil(40 / 10)" in table
    assert "end only" in format_batch_table(end)
    # no step budget (mode train reading a queue until its writers close it): every 10 steps
    queue = {"experience_buffer": {"storage_type": "queue"}}
    data = {"mode": "train", "model": {"model_path": "m"}, "buffer": {"trainer_input": queue}}
    open_run = resolve(validate_config(data))
    assert open_run.total_steps is None and open_run.save_interval == 10
    assert open_run.save_interval_for(None) == 10
