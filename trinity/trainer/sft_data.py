"""Offline experiences from a dataset (`mode: train`): SFT rows, or DPO preference pairs.

    buffer.trainer_input.experience_buffer:
      {name: sft_data, storage_type: file, path: data/sft.jsonl,
       format: {prompt_key: question, response_key: answer}}

Each row becomes one experience: the chat-templated prompt (not trained) followed by the response
and the end-of-turn token (trained), exactly the token layout a rollout produces. Rows in
`messages` form train the last assistant message given the ones before it.

    algorithm_type: dpo  +  format: {prompt_key: question, chosen_key: chosen, rejected_key: rejected}

A preference row becomes two experiences with the same prompt, its chosen then its rejected
reply (`algorithm.AlgorithmSpec.pairwise`): adjacent rows in every train batch.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

from trinity.common.experience import EID, Experience, ExperienceKind
from trinity.config.resolved import chat_template_kwargs
from trinity.tasks import Task, load_taskset, make_selector


def _encode(
    tokenizer: Any,
    prompt_msgs: list[dict[str, Any]],
    response: str,
    max_prompt_tokens: int | None,
    max_response_tokens: int | None,
    chat_template_kwargs: dict[str, Any] | None,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], list[int], bool]:
    """(prompt ids, response ids + end-of-turn token, truncated) of one prompt/reply pair; the
    row's `tools` are rendered into the prompt as a rollout's chat call renders them."""
    prompt_ids = list(
        tokenizer.apply_chat_template(
            prompt_msgs,
            tools=tools,
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
    return prompt_ids, response_ids, truncated


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
    prompt_ids, response_ids, truncated = _encode(
        tokenizer, prompt_msgs, response, max_prompt_tokens, max_response_tokens,
        chat_template_kwargs, task.tools,
    )  # fmt: skip
    return Experience(
        tokens=torch.tensor(prompt_ids + response_ids),
        prompt_length=len(prompt_ids),
        eid=EID(task=task.index),
        truncated=truncated,
        kind=ExperienceKind.SFT,
        response_text=response,
    )


def task_to_pair_experiences(
    task: Task,
    tokenizer: Any,
    max_prompt_tokens: int | None,
    max_response_tokens: int | None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[Experience]:
    """[chosen, rejected] experiences of a preference row: the same prompt, each reply (and the
    end-of-turn token) trained; `EID.run` 0 and 1 mark which is which."""
    if task.pair is None:
        raise ValueError(f"row {task.index} of {task.taskset_name!r} has no preference pair")
    out = []
    for run, response in enumerate(task.pair):
        prompt_ids, response_ids, truncated = _encode(
            tokenizer, task.to_messages(), response, max_prompt_tokens, max_response_tokens,
            chat_template_kwargs, task.tools,
        )  # fmt: skip
        out.append(
            Experience(
                tokens=torch.tensor(prompt_ids + response_ids),
                prompt_length=len(prompt_ids),
                eid=EID(task=task.index, run=run),
                truncated=truncated,
                kind=ExperienceKind.DPO,
                response_text=response,
            )
        )
    return out


def _one_experience(task: Task, *args: Any) -> list[Experience]:
    return [task_to_sft_experience(task, *args)]


class DatasetSource:
    """Serves train batches of offline experiences for `total_epochs` passes over the dataset:
    one SFT experience per row, or (`pairwise`, DPO) a [chosen, rejected] pair per row, a batch
    being `batch_size` rows (2 × batch_size experiences for pairs, each pair adjacent)."""

    def __init__(
        self, config: Any, tokenizer: Any, pairwise: bool = False, storage: Any = None
    ) -> None:
        """`storage`: the dataset to read; None = `buffer.trainer_input.experience_buffer`."""
        storage = storage or config.buffer.trainer_input.experience_buffer
        tasks = load_taskset(
            storage,
            is_eval=False,
            default_seed=config.seed,
            require_response=not pairwise,
            require_pair=pairwise,
        )
        m = config.model
        template_kwargs = chat_template_kwargs(config)
        to_rows = task_to_pair_experiences if pairwise else _one_experience
        self.rows = [
            to_rows(t, tokenizer, m.max_prompt_tokens, m.max_response_tokens, template_kwargs)
            for t in tasks
        ]
        self.batch_size = config.buffer.train_batch_size or config.buffer.batch_size
        epochs = storage.total_epochs or config.buffer.total_epochs
        self._iter: Iterator[list[Any]] = make_selector(storage.data_selector, config.seed).batches(
            self.rows, self.batch_size, epochs
        )

    def __len__(self) -> int:
        return len(self.rows)

    def skip(self, batches: int) -> None:
        """Pass over the first `batches` batches (a resumed run trained on them already)."""
        for _ in range(batches):
            next(self._iter, None)

    def read(self, n: int) -> list[Experience] | None:
        """The next batch, or None when the epochs are done (`n` is fixed by the config)."""
        batch = next(self._iter, None)
        return None if batch is None else [e for row in batch for e in row]


class AuxiliaryReader:
    """An auxiliary SFT buffer (`buffer.trainer_input.auxiliary_buffers.<name>`) read n rows at
    a time, cycling over the rows in its selector's order, epoch after epoch; what
    `sample_strategy: mix` draws expert rows from. A resumed run starts its cycle anew."""

    def __init__(self, config: Any, storage: Any, tokenizer: Any) -> None:
        self.rows = DatasetSource(config, tokenizer, storage=storage).rows
        if not self.rows:
            raise ValueError(f"auxiliary buffer {storage.name!r} has no rows")
        self._selector = make_selector(storage.data_selector, config.seed)
        self._stream = self._cycle()

    def _cycle(self) -> Iterator[list[Experience]]:
        while True:
            for batch in self._selector.batches(self.rows, 1, 1):
                yield from batch

    def __call__(self, n: int) -> list[Experience]:
        """The next `n` rows' experiences (fresh copies: a strategy may mark them)."""
        out = []
        for _ in range(n):
            for e in next(self._stream):
                out.append(copy.copy(e))
                out[-1].info = dict(e.info)
        return out


def auxiliary_readers(config: Any, tokenizer: Any) -> dict[str, AuxiliaryReader]:
    """A reader per `buffer.trainer_input.auxiliary_buffers` entry, by name."""
    buffers = config.buffer.trainer_input.auxiliary_buffers or {}
    return {name: AuxiliaryReader(config, s, tokenizer) for name, s in buffers.items()}
