"""LLM judges: an auxiliary model scores the policy's responses (`judge.py`), its replies are
read by strict parsers (`parse.py`), and a group judge's self-consistency is measured by
scoring the group in two orders (`consistency.py`). The workflows that use them are in
`trinity/workflows/judge_workflow.py` (`judge_workflow`, `group_judge_workflow`, ...)."""

from trinity.judges.consistency import in_response_order, pairwise_agreement, shuffled_order
from trinity.judges.judge import (
    GroupJudge,
    GroupVerdict,
    JudgeError,
    PointwiseJudge,
    Verdict,
)
from trinity.judges.parse import Parsed, parse_score, parse_scores

__all__ = [
    "GroupJudge",
    "GroupVerdict",
    "JudgeError",
    "Parsed",
    "PointwiseJudge",
    "Verdict",
    "in_response_order",
    "pairwise_agreement",
    "parse_score",
    "parse_scores",
    "shuffled_order",
]
