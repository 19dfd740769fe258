"""The pre-flight pass skips the algorithm's value dry run for a shipped record run as shipped
(`trinity.algorithm.algorithms.shipped_defaults`), so `trinity run` and `trinity validate` need
no torch for such a config.

The skip is sound only if the dry run of every config it covers passes: each shipped record with
its own pieces and arguments, with either KL piece or both set to "none". That whole domain is
run here. Anything else, such as a piece's argument, another piece, another `loss_agg_mode`, an
auxiliary buffer, an alias or a plugin's record, still gets the dry run, and a bad value there
is still a problem.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from trinity.algorithm.algorithms import (
    ALGORITHM,
    PIECES,
    SHIPPED,
    SWITCHABLE_OFF,
    AlgorithmSpec,
    register_algorithm,
    resolve_algorithm,
    shipped_defaults,
    value_problems,
)
from trinity.config.preflight import GPU_DRIVER_NODES, _algorithm_problems
from trinity.config.schema import AlgorithmConfig


def _config(algorithm_type: str, **over) -> SimpleNamespace:
    """An algorithm section with nothing set but `over` (what `load_config` leaves as None)."""
    fields = {p: None for p in PIECES} | {f"{p}_args": None for p in PIECES}
    fields["loss_agg_mode"] = None
    return SimpleNamespace(algorithm_type=algorithm_type, **fields | over)


OFF_VARIANTS = [{}, *({p: "none"} for p in SWITCHABLE_OFF), dict.fromkeys(SWITCHABLE_OFF, "none")]


COVERED = sorted(n for n in SHIPPED if ALGORITHM.get(n).sample_strategy == "default")


@pytest.mark.parametrize("name", COVERED)
@pytest.mark.parametrize("off", OFF_VARIANTS, ids=lambda o: "+".join(o) or "as_shipped")
def test_every_config_the_skip_covers_passes_the_dry_run(name, off):
    cfg = _config(name, **off)
    assert shipped_defaults(cfg)
    assert value_problems(resolve_algorithm(cfg)) == []


def test_a_record_whose_sample_strategy_reads_buffers_gets_the_dry_run():
    """`mix` as shipped fails the dry run without its `sft_dataset` buffer: not skipped."""
    others = sorted(set(SHIPPED) - set(COVERED))
    assert "mix" in others
    for name in others:
        assert not shipped_defaults(_config(name))
    assert value_problems(resolve_algorithm(_config("mix")))  # what the skip would have hidden


@pytest.mark.parametrize(
    "over, auxiliary",
    [
        ({"policy_loss_fn_args": {"clip_range": 0.3}}, ()),
        ({"kl_loss_fn_args": {"kl_coef": 0.0}}, ()),
        ({"policy_loss_fn": "gspo"}, ()),
        ({"advantage_fn": "rloo"}, ()),
        ({"entropy_loss_fn": "none"}, ()),
        ({"kl_loss_fn": "k2"}, ()),
        ({"loss_agg_mode": "seq-mean-token-sum"}, ()),
        ({}, ("expert_data",)),
    ],
)
def test_anything_else_gets_the_dry_run(over, auxiliary):
    assert not shipped_defaults(_config("grpo", **over), auxiliary)


def test_an_alias_and_the_record_s_own_agg_mode_count_as_shipped():
    assert shipped_defaults(_config("grpo_verl"))
    assert shipped_defaults(_config("gspo", loss_agg_mode=ALGORITHM.get("gspo").loss_agg_mode))


def test_a_plugin_record_gets_the_dry_run(monkeypatch):
    name = "test_dry_run_plugin_record"
    # registered for this test only: other tests list the registry's records
    monkeypatch.setattr(ALGORITHM, "_items", dict(ALGORITHM._items))
    register_algorithm(AlgorithmSpec(name=name, advantage_fn="grpo", policy_loss_fn="ppo"))
    assert name in ALGORITHM.names() and name not in SHIPPED
    assert not shipped_defaults(_config(name))


def test_a_bad_value_is_still_found():
    algo = AlgorithmConfig(algorithm_type="ppo", policy_loss_fn_args={"clip_ratio_c": 0.5})
    problems = _algorithm_problems(algo, [])
    assert [p.path for p in problems] == ["algorithm.policy_loss_fn_args"]


PREFLIGHT_IMPORTS = """
import sys
from trinity.config import load_config
from trinity.config.preflight import preflight
report = preflight(load_config(sys.argv[1]))
print(report.problems, file=sys.stderr)
print(len(report.problems), "torch" in sys.modules)
"""


def test_pre_flight_of_a_shipped_record_imports_no_torch(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "model: {model_path: 'tiny://1m'}\n"
        "algorithm: {algorithm_type: grpo, repeat_times: 2, kl_loss_fn: none}\n"
        "cluster: {one_process: true}\n"
        "buffer: {batch_size: 2, total_steps: 1, explorer_input: {taskset: "
        "{storage_type: synthetic, path: arithmetic, generator_args: {num_tasks: 8},"
        " format: {prompt_key: question, response_key: answer}}}}\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", PREFLIGHT_IMPORTS, str(cfg)],
        capture_output=True,
        text=True,
        check=True,
    )
    gpu = any(Path(n).exists() for n in GPU_DRIVER_NODES)
    assert out.stdout.split() == ["0", str(gpu)]
