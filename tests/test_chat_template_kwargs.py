"""`enable_thinking` reaches every chat template: rollout prompts and SFT prompts."""

from __future__ import annotations

import asyncio

from trinity.config import TrinityConfig
from trinity.config.resolved import chat_template_kwargs
from trinity.explorer.engine import SamplingParams
from trinity.explorer.model_client import TaskModelHandle
from trinity.models import load_tokenizer
from trinity.tasks.task import Task
from trinity.trainer.sft_data import task_to_sft_experience

# renders a marker only when the template is told enable_thinking = false, as Qwen3's does
TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %} no think{% endif %}"
)


def cfg(**kw) -> TrinityConfig:
    return TrinityConfig.model_validate({"model": {"model_path": "x", **kw.pop("model", {})}, **kw})


def test_rollout_model_setting_overrides_the_model_setting():
    assert chat_template_kwargs(cfg()) == {}
    assert chat_template_kwargs(cfg(model={"enable_thinking": False})) == {"enable_thinking": False}
    both = cfg(
        model={"enable_thinking": False}, explorer={"rollout_model": {"enable_thinking": True}}
    )
    assert chat_template_kwargs(both) == {"enable_thinking": True}


def test_sft_and_rollout_prompts_render_with_enable_thinking(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir, custom_chat_template=TEMPLATE)
    task = Task(index=0, raw={}, prompt="2+3=", truth="5", taskset_name="t")
    plain = task_to_sft_experience(task, tok, None, None)
    off = task_to_sft_experience(task, tok, None, None, {"enable_thinking": False})
    on = task_to_sft_experience(task, tok, None, None, {"enable_thinking": True})
    prompt = lambda e: tok.decode(e.tokens[: e.prompt_length])  # noqa: E731
    assert prompt(plain) == prompt(on) == "2+3="
    assert prompt(off) == "2+3= no think"

    sent: list[list[int]] = []

    class Client:  # records what the handle sends to the engines
        async def generate(self, ids, params, key=None):
            sent.append(ids)
            return []

    handle = TaskModelHandle(Client(), tok, SamplingParams(), {"enable_thinking": False})
    asyncio.run(handle.chat([{"role": "user", "content": "2+3="}]))
    assert [tok.decode(ids) for ids in sent] == ["2+3= no think"]
