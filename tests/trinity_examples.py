"""Trinity-RFT's own example configs (tests/data/trinity_examples/, v0.5.2) on a tiny model.

`substitute(name, tmp)` is one example as a new user would run it here: the config as Trinity-RFT
ships it, with every model path a `tiny://` model, every data path a small JSONL generated under
`tmp` with exactly the row keys that config's format, workflow and reward read (arithmetic
problems, so rewards are computable), sizes shrunk to 2 steps of 2 tasks, and GPU-cluster
settings dropped. Every change is recorded (`Substituted.changes`), and docs/examples.md lists
them (`examples_table`, written by scripts/examples_table.py).

`EXPECTED` is what each example does here: "runs", or the feature it is refused for and why
(tests/test_trinity_examples.py checks both, so a regression flips a test).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from trinity_example_rows import set_key, task_row, train_row

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "tests" / "data" / "trinity_examples"
DJ_RECIPE = "examples/grpo_gsm8k_experience_pipeline/dj_scoring_exp.yaml"
RUNS = "runs"

# what each example does here: RUNS, or "refused: <feature> — <reason>"
_ALFWORLD = (
    "refused: ALFWorld — needs the alfworld package's game files, which cannot be downloaded"
)
_MM = "refused: multi-modal data (format.image_key, simple_mm_workflow) — not built yet"
EXPECTED: dict[str, str] = {
    "benchmark/config/alfworld-template.yaml": _ALFWORLD,
    "benchmark/config/countdown-template.yaml": RUNS,
    "benchmark/config/frozenlake-template.yaml": RUNS,
    "benchmark/config/gsm8k-template.yaml": RUNS,
    "benchmark/config/guru_math-template.yaml": RUNS,
    "examples/RAFT_alfworld/RAFT_alfworld_7B.yaml": _ALFWORLD,
    "examples/RAFT_alfworld/RAFT_reflect_alfworld_7B.yaml": _ALFWORLD,
    "examples/agentscope_frozenlake/frozenlake_agent.yaml": RUNS,
    "examples/agentscope_react/gsm8k.yaml": RUNS,
    "examples/agentscope_tool_react/agentscopev0_tool_react_dapo.yaml": RUNS,
    "examples/agentscope_tool_react/agentscopev0_tool_react_gsm8k.yaml": RUNS,
    "examples/agentscope_tool_react/agentscopev1_tool_react_dapo.yaml": RUNS,
    "examples/agentscope_websearch/agentscopev1_websearch_agent.yaml": (
        "refused: agentscope_v1_react_search_workflow — its search tool queries the web "
        "(Tavily or SearXNG through npx MCP servers)"
    ),
    "examples/asymre_gsm8k/gsm8k.yaml": RUNS,
    "examples/asymre_math/math.yaml": RUNS,
    "examples/async_gsm8k/explorer.yaml": RUNS,
    "examples/async_gsm8k/trainer.yaml": RUNS,
    "examples/bench/external_model.yaml": RUNS,
    "examples/bots/bots.yaml": RUNS,
    "examples/bots/random.yaml": RUNS,
    "examples/bots/ref_eval_collect.yaml": RUNS,
    "examples/cispo_gsm8k/gsm8k.yaml": RUNS,
    "examples/dapo_math/dapo.yaml": RUNS,
    "examples/dpo_human_in_the_loop/dpo.yaml": (
        "refused: human_preference_annotation_mapper — needs a Label Studio server for people "
        "to annotate; and a task pipeline in mode train (its output as the DPO buffer)"
    ),
    "examples/dpo_humanlike/dpo.yaml": RUNS,
    "examples/entropy/clipb.yaml": RUNS,
    "examples/entropy/clipv.yaml": RUNS,
    "examples/grpo_alfworld/alfworld.yaml": _ALFWORLD,
    "examples/grpo_alfworld_general_multi_step/alfworld.yaml": _ALFWORLD,
    "examples/grpo_email_search/email_search.yaml": RUNS,
    "examples/grpo_frozen_lake/frozen_lake.yaml": RUNS,
    DJ_RECIPE: "skipped: a Data-Juicer recipe, not a Trinity config (read by the example beside it)",
    "examples/grpo_gsm8k_experience_pipeline/gsm8k.yaml": RUNS,
    "examples/grpo_gsm8k/gsm8k.yaml": RUNS,
    "examples/grpo_gsm8k_ruler/gsm8k_ruler.yaml": RUNS,
    "examples/grpo_gsm8k_task_pipeline/gsm8k.yaml": RUNS,
    "examples/grpo_gsm8k_trainable_ruler/gsm8k_ruler.yaml": RUNS,
    "examples/grpo_lora_gsm8k/gsm8k.yaml": RUNS,
    "examples/grpo_math/math.yaml": (
        "needs: rm_gallery_reward — the rm-gallery package (pip install rm-gallery), not "
        "installed in this Python"
    ),
    "examples/grpo_rubric_as_reward/rubric.yaml": RUNS,
    "examples/grpo_sciworld/sciworld.yaml": (
        "needs: sciworld_workflow — the ScienceWorld simulator (pip install scienceworld, "
        "Java 8+), not installed in this Python"
    ),
    "examples/grpo_toolcall/toolace.yaml": RUNS,
    "examples/grpo_vlm/vlm.yaml": _MM,
    "examples/grpo_webshop/webshop.yaml": (
        "refused: webshop_workflow — needs the WebShop server with its product catalogue"
    ),
    "examples/learn_to_ask/train.yaml": RUNS,
    "examples/mix_chord/mix_chord.yaml": RUNS,
    "examples/mix_chord/mix_chord_toolace.yaml": RUNS,
    "examples/mix_math/mix_math.yaml": RUNS,
    "examples/mix_vlm/mix_vlm.yaml": _MM,
    "examples/opd_gsm8k/opd_gsm8k.yaml": RUNS,
    "examples/opd_gsm8k/opd_gsm8k_jsd.yaml": "refused: the jsd algorithm — not built yet",
    "examples/opmd_gsm8k/opmd_gsm8k.yaml": RUNS,
    "examples/ppo_countdown/countdown.yaml": RUNS,
    "examples/ppo_countdown_exp_replay/countdown.yaml": RUNS,
    "examples/ppo_countdown_megatron/countdown.yaml": RUNS,
    "examples/rec_gsm8k/gsm8k.yaml": RUNS,
    "examples/sft_mot/sft.yaml": RUNS,
    "examples/sppo_gsm8k/gsm8k.yaml": RUNS,
    "examples/tinker/tinker.yaml": "refused: the Tinker training backend (model.tinker) — not built yet",
    "examples/topr_gsm8k/gsm8k.yaml": RUNS,
}

TASKS = 4  # rows per generated taskset: 2 steps of batch 2
EVAL_ROWS = 2


def example_names() -> list[str]:
    """Every example YAML's path under tests/data/trinity_examples/, sorted."""
    return sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml"))


@dataclass
class Substituted:
    """One example rewritten for a tiny run: the config file, the environment its ${oc.env:...}
    and workflows read, and every change made, in words."""

    path: Path
    config: dict
    env: dict[str, str] = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)


def substitute(name: str, tmp: Path) -> Substituted:
    """Example `name` on a tiny model and generated data under `tmp`, written to tmp/config.yaml.

    Steps: 1. models, 2. sizes and cluster, 3. data (each storage's rows per its format,
    workflow and reward), 4. the example's own special cases, 5. write it.
    """
    cfg = yaml.safe_load((EXAMPLES / name).read_text())
    tmp.mkdir(parents=True, exist_ok=True)
    sub = Substituted(tmp / "config.yaml", cfg, env=_env(tmp))
    # 1.
    cfg["checkpoint_root_dir"] = str(tmp / "ckpt")
    sub.changes.append("checkpoint_root_dir → a temporary folder")
    _models(cfg, sub)
    # 2.
    _sizes(cfg, sub)
    # 3.
    _data(cfg, tmp, sub)
    # 4.
    for fix in SPECIAL.get(name, ()):
        fix(cfg, tmp, sub)
    # 5.
    sub.path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return sub


def _env(tmp: Path) -> dict[str, str]:
    """The variables Trinity-RFT's examples read through ${oc.env:...}, pointed here."""
    return {
        "TRINITY_CHECKPOINT_ROOT_DIR": str(tmp / "ckpt"),
        "TRINITY_MODEL_PATH": "tiny://1m?seed=0",
        "TRINITY_AUX_MODEL_PATH": "tiny://1m?seed=1",
        "TRINITY_TASKSET_PATH": str(tmp / "data" / "taskset.jsonl"),
        "TRINITY_SFT_DATASET_PATH": str(tmp / "data" / "sft.jsonl"),
        "TRINITY_BUFFER_PATH": str(tmp / "buffer"),
        "TRINITY_GROUP": "examples",
        "TRINITY_NAME": "example",
        "TMPDIR": str(tmp),
    }


def _models(cfg: dict, sub: Substituted) -> None:
    """Every model path a tiny model (the policy seed 0, the others 1, 2, ...)."""
    model = cfg.setdefault("model", {})
    model["model_path"] = "tiny://1m?seed=0"
    sub.changes.append("model.model_path → tiny://1m?seed=0")
    if "critic_model_path" in model:
        model["critic_model_path"] = "tiny://1m?seed=0"
        sub.changes.append("model.critic_model_path → tiny://1m?seed=0")
    for key in ("max_response_tokens", "max_model_len", "max_prompt_tokens"):
        model.pop(key, None)
    model["max_response_tokens"] = 8
    sub.changes.append("model: max_response_tokens 8 (max_model_len, max_prompt_tokens dropped)")
    explorer = cfg.get("explorer") or {}
    for i, aux in enumerate(explorer.get("auxiliary_models") or []):
        aux["model_path"] = f"tiny://1m?seed={i + 1}"
        aux.update(engine_num=1, tensor_parallel_size=1)
        for key in ("max_response_tokens", "max_model_len", "max_prompt_tokens"):
            aux.pop(key, None)
        sub.changes.append(f"explorer.auxiliary_models[{i}] → tiny://1m?seed={i + 1}, 1 engine")
        _engine(aux, f"explorer.auxiliary_models[{i}]", sub)


def _engine(engine: dict, at: str, sub: Substituted) -> None:
    """vLLM → our transformers engine; tensor parallelism off (one CPU)."""
    if engine.get("engine_type", "").startswith("vllm"):
        engine["engine_type"] = "transformers"
        sub.changes.append(f"{at}.engine_type vllm → transformers (no vLLM in this Python)")
    if engine.get("tensor_parallel_size", 1) != 1:
        sub.changes.append(f"{at}.tensor_parallel_size {engine['tensor_parallel_size']} → 1")
        engine["tensor_parallel_size"] = 1


def _sizes(cfg: dict, sub: Substituted) -> None:
    """2 steps of 2 tasks x 2 samples, no cluster, no GPU-only settings, a local monitor."""
    if cfg.pop("cluster", None) is not None:
        sub.changes.append("cluster dropped (one CPU machine)")
    algo = cfg.get("algorithm") or {}
    if algo.get("repeat_times", 1) > 2:
        algo["repeat_times"] = 2
        sub.changes.append("algorithm.repeat_times → 2")
    buf = cfg.setdefault("buffer", {})
    buf.update(batch_size=2, total_steps=2, total_epochs=1)
    if buf.pop("train_batch_size", None) is not None:
        sub.changes.append("buffer.train_batch_size dropped (derived: 2 tasks x 2 samples)")
    sub.changes.append("buffer: batch_size 2, total_steps 2, total_epochs 1")
    ex = cfg.setdefault("explorer", {})
    ex.update(eval_on_startup=False, eval_interval=2)
    if ex.get("runner_per_model", 0) > 4:
        ex["runner_per_model"] = 4
    ro = ex.setdefault("rollout_model", {})
    if ro.get("engine_num", 1) != 1:
        ro["engine_num"] = 1
        sub.changes.append("explorer.rollout_model.engine_num → 1")
    _engine(ro, "explorer.rollout_model", sub)
    tr = cfg.setdefault("trainer", {})
    tr.update(save_interval=0, use_dynamic_bsz=False)
    if "total_steps" in tr:
        tr["total_steps"] = 2
    sub.changes.append("trainer: save_interval 0, no dynamic batch size")
    if tr.get("ulysses_sequence_parallel_size", 1) != 1:
        tr["ulysses_sequence_parallel_size"] = 1
        sub.changes.append("trainer.ulysses_sequence_parallel_size → 1")
    mon = cfg.get("monitor") or {}
    if mon.get("monitor_type", "jsonl") != "jsonl":
        sub.changes.append(f"monitor.monitor_type {mon['monitor_type']} → jsonl")
        mon["monitor_type"] = "jsonl"


def _data(cfg: dict, tmp: Path, sub: Substituted) -> None:
    """Each file storage pointed at rows generated for it; the eval sets cut to the first."""
    data = tmp / "data"
    data.mkdir(exist_ok=True)
    buf = cfg["buffer"]
    ei = buf.get("explorer_input") or {}
    wf, rf = ei.get("default_workflow_type"), ei.get("default_reward_fn_type")
    evals = ei.get("eval_tasksets") or []
    if len(evals) > 1:
        ei["eval_tasksets"] = evals[:1]
        sub.changes.append(f"eval_tasksets: the first of {len(evals)} kept")
    tasksets = [("taskset", ei.get("taskset"), TASKS)]
    tasksets += [(f"tasksets[{i}]", t, TASKS) for i, t in enumerate(ei.get("tasksets") or [])]
    tasksets += [
        (f"eval_tasksets[{i}]", t, EVAL_ROWS) for i, t in enumerate(ei.get("eval_tasksets") or [])
    ]
    for at, ts, n in tasksets:
        if not ts or ts.get("storage_type", "file") != "file":
            continue
        w = ts.get("default_workflow_type") or wf
        r = ts.get("default_reward_fn_type") or rf
        rows = [task_row(ts.get("format") or {}, w, r, i) for i in range(n)]
        for key in (ts.get("data_selector") or {}).get("feature_keys") or []:
            for i, row in enumerate(rows):  # a curriculum's offline column: a pass rate
                set_key(row, key, round((i + 1) / (n + 1), 3))
        _point(
            ts,
            data / f"{at.replace('[', '').replace(']', '')}.jsonl",
            rows,
            f"buffer.explorer_input.{at}",
            sub,
        )
    ti = buf.get("trainer_input") or {}
    exp = ti.get("experience_buffer")
    if exp and exp.get("storage_type") == "file":
        rows = [train_row(exp.get("format") or {}, i) for i in range(TASKS * 2)]
        _point(exp, data / "experience.jsonl", rows, "trainer_input.experience_buffer", sub)
    elif exp and exp.get("storage_type") == "queue" and exp.get("path"):
        exp.pop("path")
        sub.changes.append("trainer_input.experience_buffer: queue path (sqlite) dropped")
    for key, aux in (ti.get("auxiliary_buffers") or {}).items():
        rows = [train_row(aux.get("format") or {}, i) for i in range(TASKS * 2)]
        _point(aux, data / f"aux_{key}.jsonl", rows, f"auxiliary_buffers.{key}", sub)


def _point(storage: dict, path: Path, rows: list[dict], at: str, sub: Substituted) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    storage["path"] = str(path)
    for key in ("split", "subset_name"):
        storage.pop(key, None)
    keys = sorted({k for r in rows for k in r})
    sub.changes.append(f"{at} → {len(rows)} generated rows with keys {', '.join(keys)}")


def _emails(cfg: dict, tmp: Path, sub: Substituted) -> None:
    """email_search: a small SQLite inbox (Trinity-RFT's layout) at $DEFAULT_EMAIL_DB_PATH."""
    from trinity.workflows.email_db import Email, create_email_db

    emails = [
        Email(
            message_id=f"<{i}@x>",
            date=f"2001-05-{10 + i:02d} 10:00:00",
            subject=f"sum {i}",
            from_address="ann@x",
            to_addresses=["jeff@x"],
            cc_addresses=[],
            bcc_addresses=[],
            body=f"The sum in email {i} is {2 * i + 3}.",
            file_name=f"ann/{i}",
        )
        for i in range(TASKS)
    ]
    db = create_email_db(tmp / "emails.db", emails)
    sub.env["DEFAULT_EMAIL_DB_PATH"] = str(db)
    sub.changes.append(f"DEFAULT_EMAIL_DB_PATH → a generated inbox of {TASKS} emails")


def _task_pipeline(cfg: dict, tmp: Path, sub: Substituted) -> None:
    """The task pipeline reads generated raw rows; its LLM filter's model is served (tiny)."""
    tp = cfg["data_processor"]["task_pipeline"]
    fmt = {"prompt_key": "question", "response_key": "answer"}
    rows = [task_row(fmt, None, None, i) for i in range(TASKS)]
    raw = tmp / "data" / "raw.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tp["inputs"] = [str(raw)]
    tp["num_process"] = 1
    sub.changes.append(f"data_processor.task_pipeline.inputs → {TASKS} generated rows")
    for op in tp.get("operators") or []:
        name = (op.get("args") or {}).get("api_or_hf_model")
        if name:
            aux = cfg["explorer"].setdefault("auxiliary_models", [])
            aux.append({"name": name, "model_path": f"tiny://1m?seed={len(aux) + 1}"})
            op["args"]["keep_unscored"] = True
            sub.changes.append(
                f"explorer.auxiliary_models: {name} served (tiny); keep_unscored (a random "
                "judge gives no score)"
            )
    ts = cfg["buffer"]["explorer_input"]["taskset"]
    ts["path"] = "./outputs/task_pipeline_output/"  # as shipped: the pipeline's output is read
    sub.changes.append("taskset: no rows generated (the pipeline writes the explorer's taskset)")


def _dj_recipe(cfg: dict, tmp: Path, sub: Substituted) -> None:
    """The Data-Juicer recipe beside the example, its LLM filter keeping unscored rows."""
    recipe = yaml.safe_load((EXAMPLES / DJ_RECIPE).read_text())
    for op in recipe.get("process") or []:
        for args in op.values():
            if isinstance(args, dict) and "api_or_hf_model" in args:
                args["keep_unscored"] = True
    for op in recipe.get("process") or []:
        for args in op.values():
            name = isinstance(args, dict) and args.get("api_or_hf_model")
            if name:
                aux = cfg.setdefault("explorer", {}).setdefault("auxiliary_models", [])
                aux.append({"name": name, "model_path": f"tiny://1m?seed={len(aux) + 1}"})
                sub.changes.append(f"explorer.auxiliary_models: {name} served (tiny)")
    path = tmp / "dj_scoring_exp.yaml"
    path.write_text(yaml.safe_dump(recipe))
    for op in cfg["data_processor"]["experience_pipeline"]["operators"]:
        if op["name"] == "data_juicer":
            op["args"]["config_path"] = str(path)
    sub.changes.append("the recipe dj_scoring_exp.yaml read from beside it (keep_unscored)")


def _dpo_inputs(cfg: dict, tmp: Path, sub: Substituted) -> None:
    """dpo_human_in_the_loop: the pipeline's raw input generated (prompt, answer1, answer2)."""
    tp = cfg["data_processor"]["task_pipeline"]
    rows = [
        {"prompt": f"What is {i + 1} + {i + 2}?", "answer1": str(2 * i + 3), "answer2": "0"}
        for i in range(TASKS)
    ]
    raw = tmp / "data" / "raw.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tp["inputs"] = [str(raw)]
    sub.changes.append(f"data_processor.task_pipeline.inputs → {TASKS} generated rows")


def _external(cfg: dict, tmp: Path, sub: Substituted) -> None:
    """bench/external_model: the endpoint is `trinity serve` of a tiny model (the walker
    starts it); the fast check reads only the URL."""
    cfg["model"]["external_model"]["model_name"] = "tiny://1m?seed=0"
    sub.env.setdefault("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing: the walker serves
    sub.env.setdefault("OPENAI_API_KEY", "sk-example")
    sub.changes.append(
        "model.external_model.model_name and OPENAI_BASE_URL → `trinity serve` of the tiny "
        "model (the walker starts it; validate probes the endpoint)"
    )


def _bots_log(cfg: dict, tmp: Path, sub: Substituted) -> None:
    """bots_ref_eval_collect: its per-task log under tmp, not ./bots_ref_eval_log.jsonl."""
    log = str(tmp / "bots_ref_eval_log.jsonl")
    cfg["explorer"].setdefault("env_vars", {})["BOTS_REF_EVAL_LOG_FILE"] = log
    sub.changes.append("explorer.env_vars: BOTS_REF_EVAL_LOG_FILE → a temporary file")


SPECIAL: dict[str, tuple] = {
    "examples/bots/ref_eval_collect.yaml": (_bots_log,),
    "examples/grpo_email_search/email_search.yaml": (_emails,),
    "examples/grpo_gsm8k_task_pipeline/gsm8k.yaml": (_task_pipeline,),
    "examples/grpo_gsm8k_experience_pipeline/gsm8k.yaml": (_dj_recipe,),
    "examples/dpo_human_in_the_loop/dpo.yaml": (_dpo_inputs,),
    "examples/bench/external_model.yaml": (_external,),
}


def problems_of(sub: Substituted) -> list[str]:
    """`trinity validate`'s problems of a substituted example ("path: message"), as a user
    sees them; the caller sets `sub.env` first."""
    from trinity.config import ConfigError, load_config
    from trinity.config.preflight import preflight

    try:
        cfg = load_config(sub.path)
    except ConfigError as e:
        found = list(e.problems)
        if e.partial is not None:
            found += preflight(e.partial, skip=e.removed).problems
    else:
        found = preflight(cfg).problems
    return [f"{p.path}: {p.message}" for p in found]


ENDPOINT_UNREACHABLE = "model.external_model: cannot reach the endpoint"
NEEDS_SERVER = {"examples/bench/external_model.yaml"}  # validate probes the endpoint


RUN_NOTES = {
    "examples/bench/external_model.yaml": "runs here (a bench of `trinity serve` of a tiny model)",
    "examples/async_gsm8k/explorer.yaml": "runs here (2 steps, with trainer.yaml: one run)",
    "examples/async_gsm8k/trainer.yaml": "runs here (2 steps, with explorer.yaml: one run)",
}


def examples_table(tmp: Path) -> str:
    """docs/examples.md: every example, what it does here, and the walker's substitutions
    (those common to all once above the table); `tmp` holds the generated files."""
    names = [n for n in example_names() if n != DJ_RECIPE]
    changes = {n: substitute(n, tmp / str(i)).changes for i, n in enumerate(names)}
    common = [c for c in changes[names[0]] if all(c in cs for cs in changes.values())]
    runs = sum(EXPECTED[n] == RUNS for n in names)
    refused = sum(EXPECTED[n].startswith("refused:") for n in names)
    lines = [
        "# Trinity-RFT's examples here",
        "",
        "<!-- generated by scripts/examples_table.py from tests/trinity_examples.py; "
        "tests/test_trinity_examples.py checks it -->",
        "",
        "Trinity-RFT v0.5.2 ships 59 example configs (`examples/`, `benchmark/config/`) and one",
        "Data-Juicer recipe; they are copied unchanged in tests/data/trinity_examples/. Pointed at",
        f"a tiny model and small generated data, {runs} validate and run 2 steps here",
        f"(`pytest -m slow tests/test_trinity_examples.py`); {refused} are refused by name for a",
        f"feature not built here, and {len(names) - runs - refused} need a package this Python",
        "lacks (the feature is built; `validate` names the package to install).",
        "",
        "Every example gets: " + "; ".join(common) + ". Beyond that:",
        "",
        "| example | here | substitutions |",
        "|---|---|---|",
    ]
    for n in example_names():
        if n == DJ_RECIPE:
            lines.append(f"| `{n}` | {EXPECTED[n]} | |")
            continue
        here = RUN_NOTES.get(n, "runs here (2 steps on a tiny model)")
        here = here if EXPECTED[n] == RUNS else EXPECTED[n]
        extra = "; ".join(c for c in changes[n] if c not in common)
        lines.append(f"| `{n}` | {here} | {extra.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
