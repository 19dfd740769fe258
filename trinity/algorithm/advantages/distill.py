"""On-policy distillation: a per-token reverse-KL advantage against a teacher.

algorithm: {algorithm_type: on_policy_distill}   # teacher: explorer.auxiliary_models[0]
"""

from __future__ import annotations

from torch import Tensor

from trinity.algorithm.advantage import ADVANTAGE_FN
from trinity.algorithm.inputs import AdvantageInput


@ADVANTAGE_FN.register("on_policy_distill")
def on_policy_distill_advantage(
    inp: AdvantageInput, *, kl_coef: float = 1.0
) -> tuple[Tensor, Tensor]:
    """A_t = β · (log π_teacher(y_t) - log π_student(y_t)) on the student's own samples.

    Maximising E[Σ_t A_t] with the policy gradient minimises the per-token reverse KL
    KL(π_student ‖ π_teacher) on the student's distribution: each sampled token is pushed up
    where the teacher likes it more than the student does. The teacher's logprobs come in
    `inp.ref_logprob` (the trainer's reference model), the student's in `inp.logprob` (π_old,
    or the engine's logprobs). Outcome rewards are ignored. Returns = advantages.

    The `on_policy_distill` record loads the teacher from `explorer.auxiliary_models[0]` as the
    trainer's reference model (Trinity-RFT serves it to the workflow instead; the logprobs of
    the same tokens are the same), which must share the student's tokenizer.

    Reference: Thinking Machines, "On-Policy Distillation" (blog post, 2025); Agarwal et al.,
    "On-Policy Distillation of Language Models" (arXiv:2306.13649).

    Args:
        inp: ref_logprob [N, T] (teacher), logprob [N, T] (student), response_mask are read.
        kl_coef: β.
    Returns:
        (advantages [N, T], returns [N, T]), 0 off the mask.
    """
    teacher = inp.require("ref_logprob", "on_policy_distill")
    student = inp.require("logprob", "on_policy_distill")
    adv = kl_coef * (teacher - student) * inp.response_mask
    return adv, adv.clone()
