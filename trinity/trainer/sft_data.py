"""SFT experiences from a dataset (`mode: train`, `algorithm_type: sft`).

    buffer.trainer_input.experience_buffer:
      {name: sft_data, storage_type: file, path: data/sft.jsonl,
       format: {prompt_key: question, response_key: answer}}

Each row becomes one experience: the chat-templated prompt (not trained) followed by the response
and the end-of-turn token (trained), exactly the token layout a rollout produces. Rows in
`messages` form train the last assistant message given the ones before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from trinity.common.experience import EID, Experience, ExperienceKind
from trinity.config.resolved import chat_template_kwargs
from trinity.tasks import Task, load_taskset, make_selector


def task_to_sft_experience(
    task: Task,
    tokenizer: Any,
    max_prompt_tokens: int | None,
    max_response_tokens: int | None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> Experience:
    messages = task.to_messages()
    if task.truth is not None:
        prompt_msgs, response = messages, task.truth
    elif messages and messages[-1]["role"] == "assistant":
        prompt_msgs, response = messages[:-1], messages[-1]["content"]
    else:
        raise ValueError(
            f"SFT row {task.index} of {task.taskset_name!r} has no response: set "
            "format.response_key, or end its messages with an assistant turn"
        )
    prompt_ids = list(
        tokenizer.apply_chat_template(
            prompt_msgs,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            **(chat_template_kwargs or {}),
        )
    )
    response_ids = [*tokenizer.encode(response, add_special_tokens=False), tokenizer.eos_token_id]
    if max_prompt_tokens is not None:
        prompt_ids = prompt_ids[-max_prompt_tokens:]
    truncated = max_response_tokens is not None and len(response_ids) > max_response_tokens
    if truncated:
        response_ids = response_ids[:max_response_tokens]
    return Experience(
        tokens=torch.tensor(prompt_ids + response_ids),
        prompt_length=len(prompt_ids),
        eid=EID(task=task.index),
        truncated=truncated,
        kind=ExperienceKind.SFT,
        response_text=response,
    )


class DatasetSource:
    """Serves train batches of SFT experiences for `total_epochs` passes over the dataset."""

    def __init__(self, config: Any, tokenizer: Any) -> None:
        storage = config.buffer.trainer_input.experience_buffer
        tasks = load_taskset(
            storage, is_eval=False, default_seed=config.seed, require_response=True
        )
        m = config.model
        template_kwargs = chat_template_kwargs(config)
        self.experiences = [
            task_to_sft_experience(
                t, tokenizer, m.max_prompt_tokens, m.max_response_tokens, template_kwargs
            )
            for t in tasks
        ]
        self.batch_size = config.buffer.train_batch_size or config.buffer.batch_size
        epochs = storage.total_epochs or config.buffer.total_epochs
        self._iter: Iterator[list[Any]] = make_selector(storage.data_selector, config.seed).batches(
            self.experiences, self.batch_size, epochs
        )

    def __len__(self) -> int:
        return len(self.experiences)

    def skip(self, batches: int) -> None:
        """Pass over the first `batches` batches (a resumed run trained on them already)."""
        for _ in range(batches):
            next(self._iter, None)

    def read(self, n: int) -> list[Experience] | None:
        """The next batch, or None when the epochs are done (`n` is fixed by the config)."""
        return next(self._iter, None)
