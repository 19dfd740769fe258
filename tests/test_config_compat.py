"""Trinity-RFT compatibility: the config corpus, deprecated names, key references, verl's
trainer_config and the "best available here" choices."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from trinity.config import (
    ConfigError,
    TrinityConfig,
    dump_config,
    format_batch_table,
    load_config,
    resolve,
    validate_config,
)
from trinity.config.support import not_applicable_notes
from trinity.config.yaml_io import interpolate

CORPUS = sorted((Path(__file__).parent / "data" / "trinity_configs").glob("*.yaml"))
MINIMAL = """
model:
  model_path: m
buffer:
  explorer_input:
    taskset:
      path: data/t
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(path: Path) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return {p.path: p.message for p in info.value.problems}


# --- the corpus --------------------------------------------------------------------------------


def test_corpus_is_there() -> None:
    assert len(CORPUS) >= 6


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_corpus_config_validates(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TRINITY_CHECKPOINT_ROOT_DIR", "TRINITY_MODEL_PATH", "TRINITY_TASKSET_PATH"):
        monkeypatch.delenv(var, raising=False)
    cfg = load_config(path)
    table = format_batch_table(resolve(cfg))
    assert "rollout engine" in table and "trainer strategy" in table


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_corpus_config_dumps_and_loads_again(path: Path, tmp_path: Path) -> None:
    cfg = load_config(path)
    again = load_config(write(tmp_path, dump_config(cfg)))
    assert again.model_dump() == cfg.model_dump()


def test_corpus_references_and_trainer_config_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRINITY_TASKSET_PATH", raising=False)
    cfg = load_config(Path(__file__).parent / "data" / "trinity_configs" / "grpo_gsm8k.yaml")
    inp = cfg.buffer.explorer_input
    assert inp.taskset is not None and inp.eval_tasksets[0].path == inp.taskset.path
    actor = cfg.trainer.trainer_config["actor_rollout_ref"]["actor"]
    assert actor["ppo_max_token_len_per_gpu"] == 16384  # typed, from ${trainer.max_token_len...}
    assert actor["optim"]["lr"] == 1e-6
    # lifted once, at load: every consumer reads the verl values at our keys
    assert cfg.trainer.micro_batch_size_per_gpu == 4
    assert cfg.algorithm.policy_loss_fn_args == {"clip_range_high": 0.28}
    assert cfg.algorithm.entropy_loss_fn_args == {"entropy_coef": 0.001}
    assert cfg.written["trainer"].get("micro_batch_size_per_gpu") is None  # as written


# --- deprecated names --------------------------------------------------------------------------


def test_deprecated_names_are_read_as_current_ones_with_a_note(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            MINIMAL.replace("path: data/t", "path: data/t\n      task_selector: {seed: 3}")
            + "algorithm: {optimizer: {warmup_style: cosine}}\n"
            + "synchronizer: {sync_style: dynamic_by_explorer}\n",
        )
    )
    assert cfg.buffer.explorer_input.taskset is not None
    assert cfg.buffer.explorer_input.taskset.data_selector.seed == 3
    assert cfg.algorithm.optimizer.lr_scheduler_type == "cosine"
    assert cfg.synchronizer.sync_style == "explorer_driven"
    notes = not_applicable_notes(cfg)
    assert sorted(notes) == [
        "algorithm.optimizer.warmup_style: deprecated name, read as 'lr_scheduler_type'",
        "buffer.explorer_input.taskset.task_selector: deprecated name, read as 'data_selector'",
        "synchronizer.sync_style: 'dynamic_by_explorer' is deprecated, read as 'explorer_driven'",
    ]


def test_old_and_new_name_together_is_a_problem(tmp_path: Path) -> None:
    probs = problems_of(
        write(
            tmp_path,
            MINIMAL + "algorithm: {optimizer: {warmup_style: cosine, lr_scheduler_type: linear}}\n",
        )
    )
    assert probs == {
        "algorithm.optimizer.warmup_style": "deprecated name of 'lr_scheduler_type', which is "
        "also set; keep only 'lr_scheduler_type'"
    }


def test_deprecated_name_in_an_override(tmp_path: Path) -> None:
    cfg = load_config(
        write(tmp_path, MINIMAL), ["buffer.explorer_input.taskset.task_selector.seed=9"]
    )
    assert cfg.buffer.explorer_input.taskset is not None
    assert cfg.buffer.explorer_input.taskset.data_selector.seed == 9


def test_bad_value_of_a_renamed_key_is_reported_under_the_current_name(tmp_path: Path) -> None:
    probs = problems_of(write(tmp_path, MINIMAL + "algorithm: {optimizer: {warmup_style: cos}}\n"))
    assert "'cos' is not allowed" in probs["algorithm.optimizer.lr_scheduler_type"]


# --- references to other keys ------------------------------------------------------------------


def test_references_are_typed_chained_and_embedded() -> None:
    data = {
        "a": {"n": 4, "m": "${a.n}", "text": "n=${a.n}", "rel": "${.n}"},
        "b": {"list": [1, {"x": "${a.m}"}], "y": "${b.list[1].x}", "tree": "${a}"},
    }
    out, problems = interpolate(data)
    assert problems == []
    assert out["a"]["m"] == 4 and out["a"]["text"] == "n=4" and out["a"]["rel"] == 4
    assert out["b"]["list"][1]["x"] == 4 and out["b"]["y"] == 4
    assert out["b"]["tree"] == {"n": 4, "m": 4, "text": "n=4", "rel": 4}
    assert data["a"]["m"] == "${a.n}"  # not modified


def test_reference_cycles_and_missing_targets_are_problems() -> None:
    data = {
        "a": "${b}",
        "b": "${c.d}",
        "c": {"d": "${a}"},
        "e": "${nowhere.x}",
        "f": {"g": "${f}"},
        "h": "${oops",
        "i": "${nope:a}",
        "j": "${oc.select:nowhere,7}",
    }
    out, problems = interpolate(data)
    by_path = {p.path: p.message for p in problems}
    # every bad one at once, each at its key path; a fine one (j) is still resolved
    assert set(by_path) == {"a", "b", "c.d", "e", "f.g", "h", "i"}
    assert "Recursive interpolation detected" in by_path["a"]
    assert "key 'nowhere.x' not found" in by_path["e"]
    assert "parent node" in by_path["f.g"]
    assert by_path["h"].startswith("cannot resolve '${oops'")
    assert "Unsupported interpolation type nope" in by_path["i"]
    assert out["h"] == "${oops"  # left as written
    assert out["j"] == 7  # oc.select falls back to its default for a missing key


def test_reference_problem_in_a_file_has_its_key_path(tmp_path: Path) -> None:
    probs = problems_of(write(tmp_path, MINIMAL + "trainer: {total_steps: '${buffer.nope}'}\n"))
    assert set(probs) == {"trainer.total_steps"}
    assert "buffer.nope" in probs["trainer.total_steps"]


# --- trainer_config ----------------------------------------------------------------------------


def test_trainer_config_disagreement_and_bad_values_are_problems(tmp_path: Path) -> None:
    text = MINIMAL + textwrap.dedent(
        """
        trainer:
          micro_batch_size_per_gpu: 2
          trainer_config:
            actor_rollout_ref:
              actor:
                ppo_micro_batch_size_per_gpu: 4
                ppo_epochs: 0
                clip_ratio: 0.2
        algorithm:
          policy_loss_fn_args: {clip_range: 0.2}
        """
    )
    probs = problems_of(write(tmp_path, text))
    key = "trainer.trainer_config.actor_rollout_ref.actor."
    assert set(probs) == {key + "ppo_micro_batch_size_per_gpu", key + "ppo_epochs"}
    assert (
        "disagrees with trainer.micro_batch_size_per_gpu (4 vs 2)"
        in probs[key + "ppo_micro_batch_size_per_gpu"]
    )
    assert "invalid for trainer.ppo_epochs" in probs[key + "ppo_epochs"]


def test_trainer_config_fills_unset_keys_only() -> None:
    base = {"model": {"model_path": "m"}, "buffer": {"explorer_input": {"taskset": {"path": "t"}}}}
    cfg = validate_config(
        {
            **base,
            "trainer": {
                "ppo_epochs": 2,
                "trainer_config": {
                    "actor_rollout_ref": {
                        "actor": {
                            "ppo_epochs": 2,
                            "ppo_mini_batch_size": 16,
                            "use_dynamic_bsz": False,
                            "optim": {"warmup_style": "cosine", "lr": 3e-6},
                        }
                    }
                },
            },
        }
    )
    r = resolve(cfg)
    assert (r.ppo_epochs, r.ppo_mini_batch_size, r.use_dynamic_bsz) == (2, 16, False)
    assert cfg.algorithm.optimizer.lr_scheduler_type == "cosine"
    assert cfg.algorithm.optimizer.lr == 3e-6
    assert validate_config(base).trainer == TrinityConfig().trainer


def test_verl_critic_lr_fills_the_critic_default() -> None:
    # trainer.critic.optimizer.lr has a default (1e-5) the user did not write: the verl value
    # is lifted into it, not refused as a disagreement
    cfg = validate_config(
        {
            "model": {"model_path": "m"},
            "buffer": {"explorer_input": {"taskset": {"path": "t"}}},
            "trainer": {"trainer_config": {"critic": {"optim": {"lr": 2e-5}}}},
        }
    )
    assert cfg.trainer.critic.optimizer.lr == 2e-5


# --- best available here -----------------------------------------------------------------------


def test_unset_choices_resolve_to_the_best_available_and_say_why() -> None:
    r = resolve(TrinityConfig())
    assert (r.engine_type, r.sync_method, r.trainer_strategy) == ("transformers", "memory", "torch")
    table = format_batch_table(r)
    assert "weight sync method" in table and "unset: trainer and explorer share" in table
    assert "rollout engine" in table and "transformers serves rollouts everywhere" in table
    cfg = TrinityConfig.model_validate({"synchronizer": {"sync_method": "checkpoint"}})
    r = resolve(cfg)
    assert (r.sync_method, r.sync_method_source) == ("checkpoint", "synchronizer.sync_method")


# --- the verl keys are lifted once, at load ----------------------------------------------------


def test_verl_keys_are_lifted_at_load_for_every_consumer(tmp_path: Path) -> None:
    text = MINIMAL + textwrap.dedent(
        """
        trainer:
          trainer_config:
            trainer: {save_freq: 7}
            actor_rollout_ref: {actor: {ppo_micro_batch_size_per_gpu: 2}}
        """
    )
    cfg = load_config(write(tmp_path, text))
    # the runner reads cfg.trainer.save_interval; the trainer cfg.trainer.micro_batch_size_per_gpu
    assert cfg.trainer.save_interval == 7
    assert cfg.trainer.micro_batch_size_per_gpu == 2
    assert resolve(cfg).save_interval == 7
    assert "save_interval: 7" in dump_config(cfg)


def test_cross_field_checks_see_the_verl_values(tmp_path: Path) -> None:
    text = MINIMAL + textwrap.dedent(
        """
        trainer:
          trainer_config:
            actor_rollout_ref: {actor: {loss_agg_mode: seq-mean-token-sum-norm}}
        """
    )
    probs = problems_of(write(tmp_path, text))
    assert "seq-mean-token-sum-norm" in probs["model.max_response_tokens"]
    fixed = text.replace("model_path: m", "model_path: m\n  max_response_tokens: 64")
    assert load_config(write(tmp_path, fixed)).algorithm.loss_agg_mode == "seq-mean-token-sum-norm"


def test_a_stage_may_change_a_verl_value_of_the_base(tmp_path: Path) -> None:
    text = MINIMAL + textwrap.dedent(
        """
        trainer:
          trainer_config: {actor_rollout_ref: {actor: {ppo_micro_batch_size_per_gpu: 4}}}
        stages:
          - stage_name: a
          - stage_name: b
            trainer:
              trainer_config: {actor_rollout_ref: {actor: {ppo_micro_batch_size_per_gpu: 2}}}
        """
    )
    from trinity.config import stage_configs

    stages = stage_configs(load_config(write(tmp_path, text)))
    assert [s.trainer.micro_batch_size_per_gpu for s in stages] == [4, 2]


def test_an_external_model_bench_resolves_to_the_external_engine() -> None:
    # Trinity-RFT's external-model bench as written: its keys, the endpoint from the environment
    path = Path(__file__).parent / "data" / "trinity_configs" / "bench_external_model.yaml"
    cfg = load_config(path)
    ext = cfg.model.external_model
    assert (ext.enable, ext.model_name) == (True, "qwen3-max")
    assert (ext.base_url_env, ext.api_key_env) == ("OPENAI_BASE_URL", "OPENAI_API_KEY")
    r = resolve(cfg)
    assert r.engine_type == "external" and r.engine_type_source.startswith("model.external_model")
