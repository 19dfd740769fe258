"""A fake rollout client for ledger tests: it emits scripted replies as NON-canonical token splits.

`TaskModelHandle` talks to it as to `BatchingClient` (`generate(ids, params, key)`,
`model_version`). Before each call the test queues the texts the "model" will write
(`plan`, or `plans` for several calls in flight); the engine tokenises each one, then re-splits some tokens into two (" numbers" as
" num" + "bers": ids a tokenizer would never produce for that text), appends the eos token for
finish reason "stop" (none for "length"), and draws a logprob per token. Every call is kept in
`calls` as (prompt ids it received, the samples it returned) for the test to compare against.

`FakeJudgeEngine` plays an auxiliary judge model: its reply is a function of the responses its
prompt shows, in the order shown (tests/test_judges.py).
"""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

from trinity.common.rollout import Sample, SamplingParams


class FakeEngine:
    def __init__(self, tokenizer: Any, seed: int = 0, split_rate: float = 0.3) -> None:
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)
        self.split_rate = split_rate
        self.model_version = 0
        self.plan: list[tuple[str, str]] = []  # (text, finish reason) per sample of the next call
        self.plans: list[list[tuple[str, str]]] = []  # plans of later calls, taken in call order
        self.calls: list[tuple[list[int], list[Sample]]] = []
        self.non_canonical = 0  # completions whose ids differ from the tokenizer's for the text

    def tokens(self, text: str) -> list[int]:
        """`text` as ids, some tokens split in two (each half tokenised on its own)."""
        tok = self.tokenizer
        out: list[int] = []
        for i in tok.encode(text, add_special_tokens=False):
            piece = tok.decode([i])
            added = tok.convert_ids_to_tokens(i) in tok.get_added_vocab()
            if (
                len(piece) >= 2
                and piece.isascii()
                and not added
                and self.rng.random() < self.split_rate
            ):
                cut = self.rng.randint(1, len(piece) - 1)
                out += tok.encode(piece[:cut], add_special_tokens=False)
                out += tok.encode(piece[cut:], add_special_tokens=False)
            else:
                out.append(i)
        return out

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, key: int | None = None
    ) -> list[Sample]:
        await asyncio.sleep(0)  # answer later, as an engine does: concurrent calls interleave
        if not self.plan and self.plans:
            self.plan = self.plans.pop(0)
        if len(self.plan) != params.n:
            raise AssertionError(f"{len(self.plan)} replies planned for n={params.n}")
        samples = []
        for text, finish in self.plan:
            ids = self.tokens(text)
            if ids != self.tokenizer.encode(text, add_special_tokens=False):
                self.non_canonical += 1
            if finish == "stop":
                ids.append(self.tokenizer.eos_token_id)
            samples.append(
                Sample(
                    prompt_ids=list(prompt_ids),
                    response_ids=ids,
                    logprobs=[-round(self.rng.uniform(0.01, 5.0), 4) for _ in ids],
                    finish_reason=finish,
                    model_version=self.model_version,
                )
            )
        self.plan = []
        self.calls.append((list(prompt_ids), samples))
        return samples


class FakeJudgeEngine:
    """A scripted judge behind the same client shape (`generate(ids, params, key)`): it reads
    the responses its prompt shows, in the order shown (`Response k:` blocks of a group judge's
    prompt, or the one `Response:` of a pointwise judge's; each response one line), and replies
    `reply(shown)`. Every call is kept in `calls` as (the responses shown, the reply)."""

    def __init__(self, tokenizer: Any, reply: Any) -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self.model_version = 0
        self.calls: list[tuple[list[str], str]] = []
        self.prompts: list[str] = []  # each call's prompt, decoded

    @staticmethod
    def shown(prompt: str) -> list[str]:
        numbered = re.findall(r"Response (\d+):\n([^\n]*)", prompt)
        if numbered:
            assert [int(k) for k, _ in numbered] == list(range(1, len(numbered) + 1))
            return [text for _, text in numbered]
        return re.findall(r"Response:\n([^\n]*)", prompt)

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, key: int | None = None
    ) -> list[Sample]:
        await asyncio.sleep(0)
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=True)
        self.prompts.append(prompt)
        shown = self.shown(prompt)
        text = self.reply(shown)
        self.calls.append((shown, text))
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        return [
            Sample(list(prompt_ids), list(ids), [-0.1] * len(ids), "stop", self.model_version)
            for _ in range(params.n)
        ]
