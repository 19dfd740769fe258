"""User plugins (`trinity.common.plugins`): the loader, the CLI's `--plugin-dir`, and the custom
loss tutorial (docs/tutorials/custom_loss.md) executed end to end."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from trinity.common import plugins
from trinity.common.plugins import ENV_VAR, PluginError, env_plugin_dirs, load_plugin_dirs
from trinity.common.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorials" / "custom_loss.md"
TRINITY = [sys.executable, "-m", "trinity.cli"]


@pytest.fixture
def things(monkeypatch) -> Registry:
    """A registry of its own, importable by the test plugins as `plugin_test_registry.THINGS`,
    so no plugin of these tests registers into a registry of the package. `LOG` lists the files
    in the order they ran."""
    module = types.ModuleType("plugin_test_registry")
    module.THINGS = Registry("thing", modules={"lazy": "trinity.not_imported_yet"})
    module.LOG = []
    monkeypatch.setitem(sys.modules, "plugin_test_registry", module)
    monkeypatch.delenv(ENV_VAR, raising=False)
    return module.THINGS


def plugin(directory: Path, name: str, body: str) -> Path:
    """Write `directory/name` with `body` (dedented), creating the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(body))
    return path


def registering(name: str) -> str:
    """A plugin that registers a function under `name` and logs that it ran."""
    return f"""
        import plugin_test_registry as r

        r.LOG.append(__name__)


        @r.THINGS.register({name!r})
        def thing():
            return {name!r}
        """


def log() -> list[str]:
    return sys.modules["plugin_test_registry"].LOG


# --- the loader ---------------------------------------------------------------------------------


def test_two_directories_may_hold_files_of_the_same_name(tmp_path, things):
    plugin(tmp_path / "a", "loss.py", registering("from_a"))
    plugin(tmp_path / "b", "loss.py", registering("from_b"))
    modules = load_plugin_dirs([tmp_path / "a", tmp_path / "b"])
    assert things.get("from_a")() == "from_a" and things.get("from_b")() == "from_b"
    assert len({m.__name__ for m in modules}) == 2
    assert all(m.__name__.startswith("trinity.common.plugins.") for m in modules)


def test_loading_again_imports_nothing_again(tmp_path, things, monkeypatch):
    plugin(tmp_path / "p", "one.py", registering("one"))
    first = load_plugin_dirs([tmp_path / "p"])
    # the same directory, spelled another way, and through the environment
    again = load_plugin_dirs([tmp_path / "p" / ".." / "p", str(tmp_path / "p")])
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "p"))
    plugins.load_env_plugins()
    assert again == first and len(log()) == 1  # a second import would also raise "registered"


def test_files_run_in_name_order_and_import_their_siblings_relatively(tmp_path, things):
    d = tmp_path / "p"
    plugin(d, "_helpers.py", "import plugin_test_registry as r\n\nr.LOG.append('helpers')\nK = 7\n")
    plugin(d, "b.py", "import plugin_test_registry as r\n\nr.LOG.append('b')\n")
    plugin(
        d, "a.py", "import plugin_test_registry as r\n\nfrom . import b\nfrom ._helpers import K\n"
    )
    plugin(d / "sub", "ignored.py", "raise RuntimeError('a subfolder is not loaded')\n")
    modules = load_plugin_dirs([d])
    assert [m.__name__.rsplit(".", 1)[-1] for m in modules] == ["a", "b"]  # `_helpers`: no
    assert modules[0].K == 7
    assert log() == ["b", "helpers"]  # each file ran once; b first because a imported it


def test_a_broken_plugin_is_an_error_naming_the_file_the_line_and_the_exception(tmp_path, things):
    bad = plugin(tmp_path / "p", "bad.py", "x = 1\n\n\ny = x / 0\n")
    with pytest.raises(PluginError, match=rf"plugin {re.escape(str(bad))}, line 4: ZeroDivision"):
        load_plugin_dirs([tmp_path / "p"])
    syntax = plugin(tmp_path / "q", "syntax.py", "def f(:\n")
    with pytest.raises(PluginError, match=rf"{re.escape(str(syntax))}, line 1: SyntaxError"):
        load_plugin_dirs([tmp_path / "q"])
    plugin(tmp_path / "r", "my-loss.py", "")
    with pytest.raises(PluginError, match="'my-loss' is not a Python module name"):
        load_plugin_dirs([tmp_path / "r"])


def test_a_name_registered_twice_is_the_registry_error_naming_the_file(tmp_path, things):
    plugin(tmp_path / "p", "a.py", registering("same"))
    second = plugin(tmp_path / "p", "b.py", registering("same"))
    with pytest.raises(PluginError, match=re.escape(str(second))) as e:
        load_plugin_dirs([tmp_path / "p"])
    assert "thing 'same' is already registered" in str(e.value)
    # a name the registry reserves for a module imported on first use is taken as well
    lazy = plugin(tmp_path / "q", "lazy.py", registering("lazy"))
    with pytest.raises(PluginError, match=re.escape(str(lazy))) as e:
        load_plugin_dirs([tmp_path / "q"])
    assert "'lazy' is already registered (by trinity.not_imported_yet)" in str(e.value)


def test_a_missing_directory_is_an_error_naming_it(tmp_path, things):
    with pytest.raises(PluginError, match=rf"{re.escape(str(tmp_path / 'nope'))} does not exist"):
        load_plugin_dirs([tmp_path / "nope"])
    plugin(tmp_path, "file.py", "")
    with pytest.raises(PluginError, match="is not a directory"):
        load_plugin_dirs([tmp_path / "file.py"])


def test_the_environment_variable_is_a_path_list(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    sep = os.pathsep
    assert env_plugin_dirs({ENV_VAR: f"{a}{sep}{sep} {sep}{b}{sep}{a}"}) == [a, b]  # no repeats
    monkeypatch.chdir(tmp_path)
    assert env_plugin_dirs({ENV_VAR: "rel"}) == [tmp_path.resolve() / "rel"]  # made absolute
    assert env_plugin_dirs({ENV_VAR: ""}) == env_plugin_dirs({}) == []


def test_a_registry_miss_loads_the_directories_the_environment_names(tmp_path, things, monkeypatch):
    plugin(tmp_path / "p", "x.py", registering("x"))
    plugin(tmp_path / "q", "y.py", registering("y"))
    assert "x" not in things
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "p"))  # as an actor's runtime_env sets it
    assert things.get("x")() == "x"
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "q"))
    assert "y" in things  # `in` loads them too
    assert len(log()) == 2


def test_the_driver_names_every_plugin_directory_for_the_actors(tmp_path, things, monkeypatch):
    plugin(tmp_path / "flag", "f.py", registering("f"))
    plugin(tmp_path / "env", "e.py", registering("e"))
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    assert plugins.use_plugin_dirs([tmp_path / "flag"]) == [tmp_path / "flag", tmp_path / "env"]
    assert "f" in things and "e" in things
    expected = f"{tmp_path / 'flag'}{os.pathsep}{tmp_path / 'env'}"
    assert os.environ[ENV_VAR] == expected and plugins.plugin_env() == {ENV_VAR: expected}


def test_init_ray_gives_the_plugin_directories_to_the_job(tmp_path, monkeypatch):
    from trinity.launcher import run as launcher

    calls = []
    monkeypatch.setenv("RAY_DEDUP_LOGS", "0")  # init_ray sets it
    monkeypatch.setattr(launcher.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(launcher.ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    launcher.init_ray("local")
    assert calls[-1]["runtime_env"] == {"env_vars": {ENV_VAR: str(tmp_path)}}
    monkeypatch.delenv(ENV_VAR)
    launcher.init_ray("local")
    assert "runtime_env" not in calls[-1]  # no plugins: the job's environment is left alone


def test_a_plugin_class_unpickles_in_a_process_that_loaded_nothing(tmp_path, monkeypatch):
    # Ray pickles a registered class (an engine, a storage) by reference into its actor
    monkeypatch.delenv(ENV_VAR, raising=False)
    plugin(tmp_path / "p", "eng.py", "class Engine:\n    kind = 'mine'\n")
    (module,) = load_plugin_dirs([tmp_path / "p"])
    data = pickle.dumps(module.Engine)
    code = "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read()).kind)"
    env = {**os.environ, ENV_VAR: str(tmp_path / "p")}
    r = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, env=env)
    assert r.returncode == 0 and r.stdout.decode().strip() == "mine", r.stderr.decode()[-2000:]


# --- the CLI ------------------------------------------------------------------------------------


def tutorial_blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", TUTORIAL.read_text(), re.S | re.M)


def tutorial_plugin_dir(tmp_path: Path) -> Path:
    """The tutorial's one Python block as `my_plugins/awr.py`."""
    (code,) = tutorial_blocks("python")
    return plugin(tmp_path / "my_plugins", "awr.py", code).parent


def tutorial_algorithm() -> dict:
    """The tutorial's `algorithm:` lines."""
    (block,) = tutorial_blocks("yaml")
    return yaml.safe_load(block)["algorithm"]


def test_validate_takes_the_plugin_s_loss_and_refuses_it_without_the_plugin(tmp_path):
    cfg = tmp_path / "x.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"model_path": "tiny://1m?seed=0"},
                "algorithm": tutorial_algorithm(),
                "buffer": {
                    "batch_size": 4,
                    "explorer_input": {
                        "taskset": {
                            "storage_type": "synthetic",
                            "path": "arithmetic",
                            "format": {"prompt_key": "question", "response_key": "answer"},
                        }
                    },
                },
            }
        )
    )
    plugin_dir = tutorial_plugin_dir(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}

    def validate(*args: str, **extra: str) -> subprocess.CompletedProcess:
        cmd = [*TRINITY, "validate", "--config", str(cfg), *args]
        run_env = {**env, **extra}
        return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=run_env)

    for ok in (validate("--plugin-dir", "my_plugins"), validate(**{ENV_VAR: str(plugin_dir)})):
        assert ok.returncode == 0, ok.stderr
        assert f"plugins: {plugin_dir}" in ok.stderr
    missing = validate()
    assert missing.returncode == 2, missing.stdout
    assert "algorithm.policy_loss_fn" in missing.stderr and "'awr'" in missing.stderr
    assert "Traceback" not in missing.stderr
    refused = validate(
        "--plugin-dir", "my_plugins", "--set", "algorithm.policy_loss_fn_args.beta=0"
    )
    assert refused.returncode == 2 and "beta and max_weight must be > 0" in refused.stderr


def test_validate_exits_2_naming_a_broken_plugin(tmp_path):
    cfg = tmp_path / "x.yaml"
    cfg.write_text("model: {model_path: 'tiny://1m?seed=0'}\n")
    bad = plugin(tmp_path / "p", "broken.py", "import no_such_module_here\n")
    cmd = [*TRINITY, "validate", "--config", str(cfg), "--plugin-dir", str(bad.parent)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2
    assert f"plugin {bad}, line 1: ModuleNotFoundError" in r.stderr
    assert "Traceback" not in r.stderr


# --- the tutorial, end to end -------------------------------------------------------------------


@contextlib.contextmanager
def ray_head(env: dict[str, str]) -> Iterator[str]:
    """`ray start --head` in a process of its own with `env` (a Ray temp folder of its own, so no
    other run joins it); yields its address."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="rp", dir="/tmp"))  # short: Ray's socket paths
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
         f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
         "--disable-usage-stats"],
        env={**env, "RAY_TMPDIR": str(ray_tmp)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "ray start --head did not come up"
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:  # SIGTERM waits ~30 s for a graceful stop; its workers exit once the raylet is gone
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=60)
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.slow  # a whole run of the tutorial (about 25 s on 2 cores)
def test_the_custom_loss_tutorial_trains_with_its_plugin(tmp_path, tiny_model_dir):
    """The tutorial's plugin file and config lines, two GRPO steps on the tiny model, on a cluster
    started by `ray start` without the plugin (its workers never see the driver's environment):
    the loss's metrics arrive from the trainer actor for every train step."""
    plugin_dir = tutorial_plugin_dir(tmp_path)
    task = {
        "storage_type": "synthetic",
        "path": "arithmetic",
        "generator_args": {"digits": 1, "num_tasks": 40, "seed": 0},
        "format": {"prompt_key": "question", "response_key": "answer"},
    }
    config = {
        "project": "tutorial",
        "name": "awr",
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": str(tiny_model_dir), "max_response_tokens": 4},
        "algorithm": {**tutorial_algorithm(), "repeat_times": 4},
        "buffer": {
            "batch_size": 4,
            "total_steps": 2,
            "explorer_input": {"taskset": task, "default_reward_fn_type": "arithmetic_reward"},
            "trainer_input": {"experience_buffer": {"name": "exp", "storage_type": "queue"}},
        },
        "explorer": {"runner_per_model": 16},
        "trainer": {"micro_batch_size_per_gpu": 16, "use_dynamic_bsz": False, "save_interval": 0},
        "monitor": {"monitor_type": "jsonl"},
    }
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    # the cluster's token, given to head and driver alike (Ray's token auth is on by default)
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    with ray_head(env) as address:
        config["cluster"] = {"ray_address": address}
        cfg = tmp_path / "x.yaml"
        cfg.write_text(yaml.safe_dump(config))
        r = subprocess.run(
            [*TRINITY, "run", "--config", str(cfg), "--plugin-dir", "my_plugins"],
            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240,
        )  # fmt: skip
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert f"plugins: {plugin_dir}" in r.stderr
    lines = (tmp_path / "ckpt" / "tutorial" / "awr" / "metrics.jsonl").read_text().splitlines()
    trained = [rec for rec in map(json.loads, lines) if "train/loss" in rec]
    assert [rec["step"] for rec in trained] == [1, 2]
    for rec in trained:
        assert math.isfinite(rec["train/loss"])
        assert 0 < rec["train/awr_weight_mean"] <= 20.0
        assert 0 <= rec["train/awr_weight_clipfrac"] <= 1


def test_a_refused_name_says_why_and_cannot_be_registered():
    reg: Registry = Registry("thing")
    reg.refuse("far", "needs a server we cannot reach")
    with pytest.raises(KeyError, match="thing 'far' is not built here: needs a server"):
        reg.get("far")
    assert (
        "far" not in reg
        and reg.names() == []
        and reg.refused() == {"far": "needs a server we cannot reach"}
    )
    with pytest.raises(KeyError, match="already registered"):
        reg.register("far")(object())
    with pytest.raises(KeyError, match="already registered"):
        reg.refuse("far", "twice")
    assert reg.refusal("far") == "needs a server we cannot reach" and reg.refusal("x") is None
