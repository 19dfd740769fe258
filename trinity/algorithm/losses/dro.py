"""DRO: policy gradient with a quadratic penalty on the log-ratio instead of a clip (verl's `dro`).

algorithm: {policy_loss_fn: dro, policy_loss_fn_args: {dro_beta: 0.1}}
"""

from __future__ import annotations

from torch import Tensor

from trinity.algorithm.aggregation import Aggregator, masked_mean
from trinity.algorithm.inputs import PolicyLossInput
from trinity.algorithm.policy_loss import POLICY_LOSS_FN


@POLICY_LOSS_FN.register("dro")
def dro_policy_loss(
    inp: PolicyLossInput,
    *,
    agg: Aggregator,
    dro_beta: float = 0.1,
) -> tuple[Tensor, dict[str, float]]:
    """Direct Reward Optimisation's token loss: REINFORCE plus a proximal quadratic penalty.

        d_t = logprob_t - old_logprob_t
        ℓ_t = -(A_t · logprob_t - (β/2) · d_t²)
        loss = agg(ℓ, m)

    ∇ℓ_t = -(A_t - β·d_t)·∇log π_t: on-policy (d = 0) it is REINFORCE; as π_θ leaves π_old the
    penalty pulls it back smoothly, where PPO's clip cuts the gradient off. The advantages are
    the caller's (the papers use a soft, value-based baseline; any advantage fn works here).
    With an off-policy correction the penalty is weighted by w_t like the advantage term
    (`PolicyLossInput.weigh`), as verl weighs the whole token loss.

    Papers: "Offline Regularised Reinforcement Learning for Large Language Models Alignment"
    (Richemond et al., arXiv:2405.19107) and its token-level use in "Kimi k1.5: Scaling
    Reinforcement Learning with LLMs" (arXiv:2501.12599); verl's `dro` loss mode.

    Args:
        inp: logprob [B, T] (with grad), old_logprob, advantages, action_mask [B, T] are read.
        agg: the loss aggregator.
        dro_beta: β > 0 (verl requires it set; 0.1 here).
    Returns:
        (loss, {pg_loss, ppo_kl, dro_penalty}): ppo_kl = mean_t -d_t; dro_penalty = mean_t
        (β/2)·d_t² over the masked tokens.
    """
    if dro_beta <= 0:
        raise ValueError(f"dro_beta must be > 0, got {dro_beta}")
    logprob, old_logprob, advantages, action_mask = inp.core()
    d = logprob - old_logprob  # [B, T]
    penalty = 0.5 * dro_beta * d.square()
    loss = agg(-advantages * logprob + inp.weigh(penalty), action_mask)
    return loss, {
        "pg_loss": float(loss.detach()),
        "ppo_kl": masked_mean(-d, action_mask),
        "dro_penalty": masked_mean(penalty, action_mask),
    }
