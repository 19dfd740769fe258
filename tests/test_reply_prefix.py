"""`format.reply_prefix`: the reply is forced to start with a text right after the chat
template's generation prompt; its tokens are prompt tokens and the reward sees what follows."""

from __future__ import annotations

import asyncio

import pytest

from tests import chat_templates
from tests.fake_engine import FakeEngine
from trinity.common.rollout import SamplingParams
from trinity.explorer.bridging import split_reply_prefix
from trinity.explorer.model_client import TaskModelHandle
from trinity.tasks.task import Task
from trinity.workflows.math_boxed_workflow import MathBoxedWorkflow
from trinity.workflows.math_workflow import MathWorkflow

USER = "what is the sum"


def _task(prefix: str | None, **kw) -> Task:
    return Task(index=0, raw={}, prompt=USER, truth="5", reply_prefix=prefix, **kw)


def _handle(n: int = 1):
    tok = chat_templates.chatml()
    engine = FakeEngine(tok, split_rate=0.0)
    return TaskModelHandle(engine, tok, SamplingParams(n=n)), engine, tok


def test_prompt_messages_end_with_a_marked_prefix_and_split_back():
    task = _task("<think>")
    msgs = task.prompt_messages()
    assert msgs == [
        {"role": "user", "content": USER},
        {"role": "assistant", "content": "<think>", "prefix": True},
    ]
    assert split_reply_prefix(msgs) == ([{"role": "user", "content": USER}], "<think>")
    # no prefix: the messages as to_messages gives them, and nothing split off
    assert _task(None).prompt_messages() == [{"role": "user", "content": USER}]
    plain = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert split_reply_prefix(plain) == (plain, None)  # an unmarked reply is history
    with pytest.raises(ValueError, match="text content"):
        split_reply_prefix([{"role": "assistant", "content": "", "prefix": True}])


def test_prefix_tokens_end_the_prompt_and_the_reward_sees_the_sampled_text_only():
    handle, engine, tok = _handle(n=2)
    engine.plan = [("5", "stop"), ("the sum is 5", "stop")]
    exps = asyncio.run(MathWorkflow().run(_task("<think>", reward_fn_type="exact_match"), handle))
    ((prompt, _),) = engine.calls
    # the template's text written out by hand, then <think>: an added token, one id
    header = tok.encode(
        f"<|im_start|>user\n{USER}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    think = tok.convert_tokens_to_ids("<think>")
    assert prompt == [*header, think]
    eos = tok.eos_token_id
    first, second = exps
    assert first.prompt_length == len(header) + 1  # the prefix is prompt: never trained
    assert first.tokens.tolist() == [*header, think, *tok.encode("5"), eos]
    assert first.action_mask.tolist() == [True, True]  # "5" and the eos: sampled
    # the reward fn saw "5" (exact match 1), not "<think>5" (exact match 0)
    assert (first.response_text, first.reward) == ("5", 1.0)
    assert (second.response_text, second.reward) == ("the sum is 5", 0.0)


def test_the_prefix_is_what_continue_final_message_renders_for_a_verbatim_template():
    """Trinity-RFT renders [..., assistant prefix] with `continue_final_message` and tokenises the
    text: the same ids as the generation prompt + the prefix's ids on the tiny models' ChatML."""
    from trinity.models.tiny import build_tokenizer

    tok = build_tokenizer()
    engine = FakeEngine(tok, split_rate=0.0)
    handle = TaskModelHandle(engine, tok, SamplingParams(n=1))
    engine.plan = [("7", "stop")]
    task = _task("Okay, let me check.")
    task.messages = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "3+4"}]
    asyncio.run(handle.chat(task.prompt_messages()))
    ((prompt, _),) = engine.calls
    msgs = [*task.to_messages(), {"role": "assistant", "content": "Okay, let me check."}]
    text = tok.apply_chat_template(msgs, tokenize=False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\nOkay, let me check.")
    assert prompt == tok.encode(text, add_special_tokens=False)


def test_a_next_turn_repeating_prefix_and_reply_continues_the_held_tokens():
    handle, engine, _ = _handle()
    engine.plan = [("first plan", "stop")]
    msgs = _task("<think>").prompt_messages()
    asyncio.run(handle.chat(msgs))
    engine.plan = [("final answer", "stop")]
    turn2 = [
        {"role": "user", "content": USER},
        {"role": "assistant", "content": "<think>first plan"},
        {"role": "user", "content": "check again"},
    ]
    asyncio.run(handle.chat(turn2))
    (p1, [s1]), (p2, _) = engine.calls
    assert p2[: len(p1) + len(s1.response_ids)] == p1 + s1.response_ids  # bridged, not re-rendered
    assert handle.ledger.stats.drift == 0 and len(handle.ledger.trajectories) == 1
    (exp,) = handle.extract_experiences(reward=1.0)
    assert exp.prompt_length == len(p1)  # the prefix stays a prompt token


def test_use_base_prompt_ends_with_the_prefix():
    handle, engine, tok = _handle()
    engine.plan = [("5", "stop")]
    task = _task("Answer:", reward_fn_type="exact_match")
    asyncio.run(MathBoxedWorkflow(use_base=True).run(task, handle))
    ((prompt, _),) = engine.calls
    assert tok.decode(prompt).endswith(f"User:\n{USER}\nAssistant:\nAnswer:")


def test_preflight_refuses_a_prefix_for_a_workflow_that_does_not_apply_it(tmp_path):
    from trinity.config.loader import load_config
    from trinity.config.preflight import preflight

    data = tmp_path / "t.jsonl"
    data.write_text('{"prompt": "2+3=", "response": "5"}\n')
    path = tmp_path / "c.yaml"
    path.write_text(
        f"model: {{model_path: 'tiny://1m'}}\nbuffer: {{explorer_input: {{taskset: {{path: '{data}'}}}}}}\n"
    )

    def problems(workflow: str) -> list[str]:
        cfg = load_config(
            path,
            [
                "buffer.explorer_input.taskset.format.reply_prefix=<think>",
                f"buffer.explorer_input.default_workflow_type={workflow}",
                "buffer.explorer_input.default_reward_fn_type=exact_match",
            ],
        )
        return [f"{p.path}: {p.message}" for p in preflight(cfg).problems]

    assert problems("math_workflow") == []
    (found,) = [p for p in problems("math_self_correction_workflow") if "reply_prefix" in p]
    assert "does not apply a reply prefix" in found
