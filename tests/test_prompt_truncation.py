"""`model.enable_prompt_truncation` end to end: prompts over `max_prompt_tokens` are cut, their
experiences train nothing and are counted, and the rest of the run is untouched."""

from __future__ import annotations

import json

from test_e2e import buffer_counts, grpo_config, run_trinity

from trinity.models import load_tokenizer

SHORT = ["1+2=", "3+4=", "5+1=", "2+2=", "4+3=", "6+1="]
LONG = "Please add the two numbers below and answer with the sum only, nothing else. 7+1="


def test_over_long_prompts_are_cut_masked_and_counted(tmp_path, tiny_model_dir):
    # 8 tasks: positions 1 and 6 are long, so each 4-task step holds exactly one of them
    questions = [SHORT[0], LONG, *SHORT[1:5], LONG, SHORT[5]]
    answers = [str(eval(q.split(". ")[-1].rstrip("="))) for q in questions]
    data = tmp_path / "tasks.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": q, "answer": a}) + "\n"
            for q, a in zip(questions, answers, strict=True)
        )
    )
    tok = load_tokenizer(str(tiny_model_dir))

    def length(q: str) -> int:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        return len(ids)

    cut_to = max(length(q) for q in SHORT)  # every short prompt fits, exactly or with room
    assert length(LONG) > cut_to
    cfg = grpo_config(tmp_path, tiny_model_dir)
    r = run_trinity(
        cfg,
        overrides=[
            "buffer.total_steps=2",
            "buffer.explorer_input.taskset.storage_type=file",
            f"buffer.explorer_input.taskset.path={data}",
            "buffer.explorer_input.taskset.generator_args={}",
            "buffer.explorer_input.eval_tasksets=[]",
            "explorer.eval_interval=0",
            f"model.max_prompt_tokens={cut_to}",
        ],
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [rec for rec in records if "rollout/tasks" in rec]
    assert len(steps) == 2
    for rec in steps:  # one long task per step, repeat_times 4: 4 masked experiences
        assert rec["rollout/prompt_truncated"] == 4.0
        assert rec["rollout/failed_tasks"] == 0.0
        assert "train/loss" in rec
    # every experience, masked or not, was written and trained once
    counts = buffer_counts(cfg)
    assert counts["written"] == counts["trained"] == 2 * 4 * 4 and counts["trained_twice"] == 0
