"""`explorer.env_vars`: set where workflows run (the explorer's process), not in the trainer's."""

from __future__ import annotations

import json
import os
import textwrap
import types

import pytest

from trinity.common.plugins import ENV_VAR
from trinity.explorer import workflow_env


def _cfg(env: dict[str, str]) -> types.SimpleNamespace:
    return types.SimpleNamespace(explorer=types.SimpleNamespace(env_vars=env))


def test_actor_options_carry_the_variables_and_the_plugin_directories(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert workflow_env.actor_options(_cfg({})) == {}  # no runtime_env of its own: Ray's default
    assert workflow_env.actor_options(_cfg({"A": "1"})) == {"runtime_env": {"env_vars": {"A": "1"}}}
    monkeypatch.setenv(ENV_VAR, "/p")  # a run with plugins names them in the job's runtime_env
    opts = workflow_env.actor_options(_cfg({"A": "1"}))
    assert opts == {"runtime_env": {"env_vars": {ENV_VAR: "/p", "A": "1"}}}


def test_apply_sets_them_in_this_process(monkeypatch):
    monkeypatch.delenv("TRINITY_ENV_PROBE", raising=False)
    workflow_env.apply(_cfg({"TRINITY_ENV_PROBE": "here"}))
    assert os.environ["TRINITY_ENV_PROBE"] == "here"
    monkeypatch.delenv("TRINITY_ENV_PROBE")


def test_validate_notes_what_the_one_process_layout_does(tmp_path):
    from trinity.config.loader import load_config
    from trinity.config.preflight import preflight

    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {model_path: 'tiny://1m'}\n"
        "buffer: {explorer_input: {taskset: {storage_type: synthetic, path: arithmetic,"
        " format: {prompt_key: question, response_key: answer}}}}\n"
        "explorer: {env_vars: {TMPDIR: /tmp}}\n"
    )
    notes = preflight(load_config(path)).notes
    assert workflow_env.ONE_PROCESS_NOTE in notes
    split = preflight(load_config(path, ["cluster.one_process=false"])).notes
    assert workflow_env.ONE_PROCESS_NOTE not in split
    assert not preflight(load_config(path, ["cluster.one_process=false"])).problems


PROBE = textwrap.dedent('''
    import os

    from trinity.workflows import WORKFLOW
    from trinity.workflows.math_workflow import MathWorkflow


    @WORKFLOW.register("env_probe_workflow")
    class EnvProbe(MathWorkflow):
        """math_workflow, each experience saying whether the workflow saw the variable."""

        async def run(self, task, model):
            exps = await super().run(task, model)
            seen = float(os.environ.get("TRINITY_ENV_PROBE") == "for-workflows")
            # the environment the process started with (Linux): set by Ray's runtime_env
            with open("/proc/self/environ", "rb") as f:
                initial = b"TRINITY_ENV_PROBE=for-workflows" in f.read().split(b"\\0")
            for e in exps:
                e.metrics["env_probe"] = seen
                e.metrics["env_probe_at_start"] = float(initial)
            return exps
''')


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="reads /proc (Linux)")
@pytest.mark.parametrize("one_process", ["true", "false"])
def test_a_workflow_sees_the_variables_in_both_layouts(tmp_path, tiny_model_dir, one_process):
    """The explorer as an actor of its own (runtime_env) and as an object of the one process."""
    from test_e2e import grpo_config, run_trinity

    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "probe.py").write_text(PROBE)
    extra = "explorer: {env_vars: {TRINITY_ENV_PROBE: for-workflows}}\n"
    cfg = grpo_config(tmp_path, tiny_model_dir)
    cfg.write_text(
        cfg.read_text().replace("explorer: {eval_interval: 2, runner_per_model: 16}\n", extra)
    )
    r = run_trinity(
        cfg,
        env_extra={ENV_VAR: str(plugins), "TRINITY_ENV_PROBE": ""},
        overrides=[
            "buffer.total_steps=1",
            "buffer.explorer_input.default_workflow_type=env_probe_workflow",
            f"cluster.one_process={one_process}",
        ],
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = (tmp_path / "ckpt" / "e2e" / "grpo" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]

    def values(key: str) -> list[float]:
        return [v for rec in records for k, v in rec.items() if k.endswith(key)]

    assert values("env_probe_mean") and set(values("env_probe_mean")) == {1.0}
    # an explorer of its own starts with them (its runtime_env: read by anything at import);
    # the one process gets them when the explorer is built (the note validate prints)
    at_start = 1.0 if one_process == "false" else 0.0
    assert values("env_probe_at_start_mean") and set(values("env_probe_at_start_mean")) == {
        at_start
    }
