"""LLM-as-judge: an auxiliary model scores the policy's responses.

    judge = PointwiseJudge(prompt=POINTWISE_PROMPT, score_range=(0, 10))
    verdict = await judge.score(model.auxiliary("judge"), fields(task, response=text))
    verdict.score        # in [0, 1]: (raw - low) / (high - low); None when it failed
    verdict.error        # why the reply held no score (parse failure), else None

    group = GroupJudge(prompt=GROUP_PROMPT, score_range=(0, 1), min_agreement=0.75)
    verdict = await group.score(model.auxiliary(0), fields(task), responses, order)
    verdict.scores       # per response, the mean of the two orderings' scores, in [0, 1]
    verdict.agreement    # pairwise order agreement of the two scorings (`consistency.py`)
    verdict.consistent   # agreement >= min_agreement

`PointwiseJudge` asks for one score per response (one call each, sent together so they batch).
`GroupJudge` shows the judge every response of a group at once (RULER-style relative scoring)
and asks for a list of scores, twice: in a shuffled order, then in that order reversed. The two
scorings are put back in response order and compared; a judge whose ranking flips with the
order it reads the responses in is contradicting itself, and its verdict on that group should
not be trained on (`judge_workflow.py` excludes such groups).

Prompts are `str.format` templates over the fields of `TEMPLATE_FIELDS`; a judge's reply is read
by `parse.parse_score` / `parse.parse_scores` and nothing else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import string
from dataclasses import dataclass, field
from typing import Any

from trinity.common.rollout import PromptTooLong, SamplingParams
from trinity.judges.consistency import in_response_order, pairwise_agreement
from trinity.judges.parse import Parsed, parse_score, parse_scores

POINTWISE_SYSTEM = "You are a strict and fair judge of answers to questions."
POINTWISE_PROMPT = (
    "Question:\n{question}\n\nResponse:\n{response}\n\n"
    "Rate how well the response answers the question, from {low:g} (useless or wrong) to "
    "{high:g} (complete and correct). Explain briefly, then end with a line "
    '"Score: N".'
)
GROUP_SYSTEM = (
    "You are a fair judge. You compare candidate responses to one question and score each by "
    "how well it answers it."
)
GROUP_PROMPT = (
    "Question:\n{question}\n\n{responses}\n\n"
    "Score each of the {n} responses from {low:g} (useless or wrong) to {high:g} (complete and "
    "correct), comparing them with each other. Keep any reasoning short, then end with the "
    "list of the {n} scores in the order shown, e.g. [s1, s2, ...]."
)
RUBRIC_SYSTEM = (
    "You are an expert evaluator. Rate the overall quality of a response by how well it "
    "satisfies the rubrics, weighing them together."
)
RUBRIC_PROMPT = (
    "<prompt>\n{question}\n</prompt>\n<response>\n{response}\n</response>\n"
    "<rubrics>\n{rubric}\n</rubrics>\n"
    "Rate the response from {low:g} to {high:g}. Answer with a JSON object "
    '{{"rating": N}}.'
)

# what a prompt template may use: the task and what the judge scores
TEMPLATE_FIELDS = {
    "question": "the task's prompt (its last user message)",
    "truth": "the task's reference answer (format.response_key; the task fails without one)",
    "rubric": "the task row's `rubric` (a list of {description, weight}, or text)",
    "row": "the task row, e.g. {row[topic]}",
    "low": "the lowest score",
    "high": "the highest score",
    "response": "the response judged (pointwise judges)",
    "responses": "every response of the group, numbered in the order shown (group judges)",
    "n": "the number of responses (group judges)",
}
SAMPLING_KEYS = frozenset(f.name for f in dataclasses.fields(SamplingParams)) - {"n"} | {
    "stop",
    "seed",
}


class JudgeError(RuntimeError):
    """A judge's reply held no verdict and the failure policy is `fail` (the task fails and is
    tried again, `explorer.max_retry_times`)."""


def template_fields(template: str) -> set[str]:
    """The fields a `str.format` template uses (`{row[x]}` counts as `row`); ValueError for
    broken braces."""
    names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    return {name.split(".")[0].split("[")[0] for name in names}


def template_problems(template: str, required: str, kind: str) -> list[str]:
    """What is wrong with a prompt template: unknown fields, a missing `{required}`, broken
    braces."""
    try:
        heads = template_fields(template)
    except ValueError as e:
        return [f"{kind} template: {e} (write a literal brace as {{{{ or }}}})"]
    problems = []
    unknown = sorted(heads - set(TEMPLATE_FIELDS))
    if "" in heads or any(h.isdigit() for h in heads):
        problems.append(f"{kind} template: positional fields ({{}}, {{0}}) are not supported")
    unknown = [h for h in unknown if h and not h.isdigit()]
    if unknown:
        problems.append(
            f"{kind} template: unknown field(s) {', '.join(unknown)}; it may use "
            + ", ".join(sorted(TEMPLATE_FIELDS))
        )
    if required not in heads:
        problems.append(f"{kind} template must show the judged text: it has no {{{required}}}")
    return problems


def sampling_problems(sampling: dict[str, Any]) -> list[str]:
    """Keys of a judge's sampling arguments that are not sampling arguments (n is fixed to 1)."""
    unknown = sorted(set(sampling) - SAMPLING_KEYS)
    if not unknown:
        return []
    return [f"judge_sampling: unknown key(s) {unknown}; valid: {sorted(SAMPLING_KEYS)}"]


def format_rubric(rubric: Any) -> str:
    """A task row's rubric as text: one line per {description, weight} item, or as written."""
    if rubric is None:
        return "No rubric is given."
    if isinstance(rubric, list):
        lines = []
        for i, item in enumerate(rubric, 1):
            if isinstance(item, dict):
                weight = f" (weight {item['weight']})" if "weight" in item else ""
                lines.append(f"{i}.{weight} {item.get('description', item)}")
            else:
                lines.append(f"{i}. {item}")
        return "\n".join(lines)
    return str(rubric)


def number_responses(responses: list[str], order: list[int]) -> str:
    """The responses in the order shown, numbered from 1."""
    return "\n\n".join(f"Response {p + 1}:\n{responses[i]}" for p, i in enumerate(order))


@dataclass(frozen=True)
class Verdict:
    """A pointwise judgment: `score` in [0, 1] (None on failure), the raw score, the reply."""

    score: float | None
    raw: float | None
    text: str
    error: str | None = None


@dataclass(frozen=True)
class GroupVerdict:
    """A group judgment (see the module doc). On failure `error` says why and the scores are
    None."""

    scores: list[float] | None  # per response: mean of the two scorings, in [0, 1]
    first: list[float] | None  # per response, in [0, 1], from the first order
    second: list[float] | None  # per response, in [0, 1], from the reversed order
    agreement: float | None
    consistent: bool
    orders: tuple[list[int], list[int]]
    texts: tuple[str, str]
    error: str | None = None


@dataclass(frozen=True)
class _Judge:
    system_prompt: str | None = None
    prompt: str = ""
    score_range: tuple[float, float] = (0.0, 1.0)
    sampling: dict[str, Any] = field(default_factory=lambda: {"temperature": 0.0})

    def messages(self, fields: dict[str, Any]) -> list[dict[str, Any]]:
        low, high = self.score_range
        user = self.prompt.format(**{**fields, "low": low, "high": high})
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": user}]

    def normalise(self, x: float) -> float:
        low, high = self.score_range
        return (x - low) / (high - low)

    async def _ask(self, judge: Any, fields: dict[str, Any]) -> Parsed | str:
        """The judge's reply, or a failed `Parsed` when its prompt is over the judge's limit
        (a judgment that could not be made, handled as a reply without a verdict)."""
        try:
            [sample] = await judge.chat(self.messages(fields), n=1, **self.sampling)
        except PromptTooLong as e:
            return Parsed(error=f"the judge's prompt is too long: {e}")
        return judge.decode(sample.response_ids)


@dataclass(frozen=True)
class PointwiseJudge(_Judge):
    prompt: str = POINTWISE_PROMPT
    system_prompt: str | None = POINTWISE_SYSTEM
    score_range: tuple[float, float] = (0.0, 10.0)

    async def score(self, judge: Any, fields: dict[str, Any]) -> Verdict:
        """Ask `judge` (an `AuxiliaryModelHandle`) for one score of `fields["response"]`."""
        text = await self._ask(judge, fields)
        if isinstance(text, Parsed):
            return Verdict(None, None, "", text.error)
        parsed = parse_score(text, *self.score_range)
        if not parsed.ok:
            return Verdict(None, None, text, parsed.error)
        return Verdict(self.normalise(parsed.value), parsed.value, text)


@dataclass(frozen=True)
class GroupJudge(_Judge):
    prompt: str = GROUP_PROMPT
    system_prompt: str | None = GROUP_SYSTEM
    score_range: tuple[float, float] = (0.0, 1.0)
    min_agreement: float = 0.75

    async def score(
        self, judge: Any, fields: dict[str, Any], responses: list[str], order: list[int]
    ) -> GroupVerdict:
        """Score `responses` shown in `order` and in `order` reversed (two calls, sent
        together); compare the two scorings (module doc)."""
        n = len(responses)
        if sorted(order) != list(range(n)):
            raise ValueError(f"order {order} is not a permutation of {n} responses")
        orders = (list(order), list(order)[::-1])
        replies = await asyncio.gather(
            *(
                self._ask(judge, {**fields, "responses": number_responses(responses, o), "n": n})
                for o in orders
            )
        )
        texts = [r if isinstance(r, str) else "" for r in replies]
        pair = (texts[0], texts[1])
        parsed = [
            r if isinstance(r, Parsed) else parse_scores(r, n, *self.score_range) for r in replies
        ]
        failed = [
            f"{which} order: {p.error}"
            for which, p in zip(("first", "second"), parsed, strict=True)
            if not p.ok
        ]
        if failed:
            return GroupVerdict(None, None, None, None, False, orders, pair, "; ".join(failed))
        first, second = (
            [self.normalise(x) for x in in_response_order(p.value, o)]
            for p, o in zip(parsed, orders, strict=True)
        )
        agreement = pairwise_agreement(first, second)
        scores = [(a + b) / 2 for a, b in zip(first, second, strict=True)]
        return GroupVerdict(
            scores, first, second, agreement, agreement >= self.min_agreement, orders, pair
        )
