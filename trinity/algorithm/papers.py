"""A paper index: each algorithm recipe → its paper and the `algorithm:` config values that follow it.

`config` holds keys of the `algorithm` section (plus `repeat_times`, samples per prompt); values the
paper states are copied, everything else is left at our defaults. `note` says what the paper does
that this package does not. SFT is plain maximum likelihood and has no entry.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Paper(NamedTuple):
    title: str
    arxiv: str | None  # None: not on arXiv
    config: dict[str, Any]
    note: str = ""


PAPERS: dict[str, Paper] = {
    "grpo": Paper(
        "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
        "2402.03300",
        {
            "algorithm_type": "grpo",
            "repeat_times": 64,
            "advantage_fn": "grpo",
            "advantage_fn_args": {"std_normalize": True},
            "policy_loss_fn": "ppo",
            "kl_loss_fn": "k3",
            "kl_loss_fn_args": {"kl_coef": 0.04},
            "loss_agg_mode": "seq-mean-token-mean",
            "optimizer": {"lr": 1e-6},
        },
        "Paper: batch 1024, max length 1024, one policy update per exploration stage. Our default "
        "kl_coef is 0.001 (verl / Trinity-RFT) and loss_agg_mode token-mean.",
    ),
    "dr_grpo": Paper(
        "Understanding R1-Zero-Like Training: A Critical Perspective",
        "2503.20783",
        {
            "algorithm_type": "grpo",
            "advantage_fn_args": {"std_normalize": False},
            "kl_loss_fn": "none",
            "loss_agg_mode": "seq-mean-token-sum-norm",
        },
        "Removes the 1/|o_i| length and 1/std normalisations; the token sum is divided by a "
        "constant generation budget L = model.max_response_tokens (required with this mode).",
    ),
    "dapo": Paper(
        "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
        "2503.14476",
        {
            "algorithm_type": "dapo",
            "repeat_times": 16,
            "policy_loss_fn": "ppo",
            "policy_loss_fn_args": {"clip_range_low": 0.2, "clip_range_high": 0.28},
            "kl_loss_fn": "none",
            "loss_agg_mode": "token-mean",
            "optimizer": {"lr": 1e-6},
        },
        "The record turns on dynamic sampling (algorithm.filter_groups) and the soft overlong "
        "punishment (algorithm.overlong_penalty; the paper's L_cache 4096 of L_max 20480).",
    ),
    "ppo": Paper(
        "Proximal Policy Optimization Algorithms",
        "1707.06347",
        {
            "algorithm_type": "ppo",
            "advantage_fn": "gae",
            "advantage_fn_args": {"gamma": 1.0, "lam": 0.95},
            "policy_loss_fn": "ppo",
            "policy_loss_fn_args": {"clip_range": 0.2},
        },
        "A separate value model with its own optimizer (trainer.critic); the paper's shared "
        "trunk with a value coefficient is not built. KL: the record's k2 loss at 0.001.",
    ),
    "rloo": Paper(
        "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback "
        "in LLMs",
        "2402.14740",
        {"algorithm_type": "rloo", "repeat_times": 4, "advantage_fn": "rloo"},
        "The paper takes one on-policy step per batch (ratio = 1, so PPO clipping is inactive) and "
        "puts the KL in the reward (kl_penalty_fn: k1).",
    ),
    "reinforce": Paper(
        "Simple Statistical Gradient-Following Algorithms for Connectionist Reinforcement Learning "
        "(Williams, Machine Learning 8, 1992)",
        None,
        {"algorithm_type": "reinforce", "advantage_fn_args": {"baseline": "none"}},
        "baseline: batch_mean is the simplest variance-reducing baseline the paper allows.",
    ),
    "gspo": Paper(
        "Group Sequence Policy Optimization",
        "2507.18071",
        {
            "algorithm_type": "gspo",
            "policy_loss_fn": "gspo",
            "policy_loss_fn_args": {"clip_range_low": 3e-4, "clip_range_high": 4e-4},
            "loss_agg_mode": "seq-mean-token-mean",
        },
        "Clip ranges from the paper's experiments, which split each batch into 4 mini-batches "
        "(trainer.ppo_mini_batch_size): only then does the ratio leave 1. The KL term is the "
        "gspo record's (Trinity-RFT's k2 at kl_coef 0.001).",
    ),
    "cispo": Paper(
        "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
        "2506.13585",
        {
            "algorithm_type": "cispo",
            "policy_loss_fn": "cispo",
            "policy_loss_fn_args": {"clip_range_low": 1.0, "clip_range_high": 0.28},
            "loss_agg_mode": "token-mean",
        },
        "The paper states no numeric eps_high; 0.28 is Trinity-RFT's default (DAPO's clip-higher "
        "value). eps_low 1.0 is the paper's 'no lower bound'.",
    ),
    "sapo": Paper(
        "Soft Adaptive Policy Optimization",
        "2511.20347",
        {
            "algorithm_type": "sapo",
            "policy_loss_fn": "sapo",
            "policy_loss_fn_args": {"tau_pos": 1.0, "tau_neg": 1.05},
            "loss_agg_mode": "seq-mean-token-mean",
        },
        "Temperatures are Trinity-RFT's defaults (tau_neg > tau_pos, as the paper prescribes).",
    ),
    "reinforceplusplus": Paper(
        "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
        "2501.03262",
        {
            "algorithm_type": "reinforceplusplus",
            "repeat_times": 1,
            "kl_penalty_fn": "k1",
            "kl_penalty_fn_args": {"kl_coef": 0.01},
            "policy_loss_fn_args": {"clip_range": 0.2},
        },
        "Token-level k1 KL penalty in the reward, returns whitened over the batch's tokens.",
    ),
    "opmd": Paper(
        "Kimi k1.5: Scaling Reinforcement Learning with LLMs",
        "2501.12599",
        {
            "algorithm_type": "opmd",
            "advantage_fn_args": {"opmd_baseline": "logavgexp", "tau": 1.0},
            "policy_loss_fn_args": {"tau": 1.0},
        },
        "The tau-soft (log-mean-exp) baseline is the paper's optimal value; Trinity-RFT's record "
        "defaults to the group mean.",
    ),
    "topr": Paper(
        "Tapered Off-Policy REINFORCE: Stable and efficient reinforcement learning for LLMs",
        "2503.14286",
        {"algorithm_type": "topr", "advantage_fn": "reinforce", "policy_loss_fn": "topr"},
        "The record keeps Trinity-RFT's k2 KL loss at kl_coef 0.001; the paper uses none.",
    ),
    "gpg": Paper(
        "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
        "2504.02546",
        {"algorithm_type": "gpg", "advantage_fn": "gpg", "policy_loss_fn": "reinforce"},
        "alpha counts the rows with a nonzero centred reward (the paper), not verl's nonzero raw "
        "rewards.",
    ),
    "gmpo": Paper(
        "GMPO: Geometric-Mean Policy Optimization",
        "2507.20673",
        {
            "algorithm_type": "grpo",
            "policy_loss_fn": "geo_mean",
            "policy_loss_fn_args": {"clip_range": 0.4},
        },
    ),
    "passk": Paper(
        "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large "
        "Reasoning Models",
        "2508.10751",
        {"algorithm_type": "grpo", "advantage_fn": "passk", "advantage_fn_args": {"k": 4}},
        "Analytic advantages for 0/1 rewards (reward > threshold counts as right).",
    ),
    "raft": Paper(
        "RAFT: Reward rAnked FineTuning for Generative Foundation Model Alignment",
        "2304.06767",
        {"algorithm_type": "raft", "sample_strategy": "best_of_group"},
        "One best sample per task; sample_strategy_args {min_reward: ...} drops tasks whose best "
        "is below it.",
    ),
    "dpo": Paper(
        "Direct Preference Optimization: Your Language Model is Secretly a Reward Model",
        "2305.18290",
        {"algorithm_type": "dpo", "policy_loss_fn_args": {"beta": 0.1}},
        "mode: train on buffer.trainer_input.experience_buffer rows with chosen/rejected columns.",
    ),
    "ipo": Paper(
        "A General Theoretical Paradigm to Understand Learning from Human Preferences",
        "2310.12036",
        {"algorithm_type": "dpo", "policy_loss_fn_args": {"beta": 0.1, "loss_type": "ipo"}},
    ),
    "sppo": Paper(
        "A general class of surrogate functions for stable and efficient reinforcement learning",
        "2108.05828",
        {"algorithm_type": "sppo", "policy_loss_fn_args": {"epsilon": 0.3}},
    ),
    "opo": Paper(
        "On-Policy RL with Optimal Reward Baseline",
        "2505.23585",
        {"algorithm_type": "grpo", "advantage_fn": "opo", "kl_loss_fn": "none"},
        "Exactly on-policy: one optimizer update per train batch (leave "
        "trainer.ppo_mini_batch_size unset, one epoch), so PPO's ratio is 1 and its loss is the "
        "policy gradient; no KL (kl_loss_fn none) and no entropy bonus (entropy_coef 0, the "
        "default). verl's adv_estimator opo.",
    ),
    "inference_time_passk": Paper(
        "Optimizing Language Models for Inference Time Objectives using Reinforcement Learning",
        "2503.19595",
        {
            "algorithm_type": "grpo",
            "advantage_fn": "grpo_passk",
            "advantage_fn_args": {"std_normalize": True},
        },
        "verl's grpo_passk, the k = n case: only each group's best response learns, by its "
        "margin over the runner-up (divided by the group's std, verl's default). The paper's "
        "general k and its variance-reduced estimators are not built; for 0/1 rewards and any k "
        "see PAPERS['passk'] (arXiv:2508.10751).",
    ),
    "kl_cov": Paper(
        "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
        "2505.22617",
        {
            "algorithm_type": "grpo",
            "policy_loss_fn": "kl_cov",
            "policy_loss_fn_args": {"kl_cov_ratio": 2e-3, "ppo_kl_coef": 1.0},
            "kl_loss_fn": "none",
        },
        "k = 2e-3 is the paper's value for Qwen2.5-7B (2e-4 for 32B, verl's default). The paper "
        "trains on DAPO's recipe (clip-higher, dynamic sampling, token-mean); the top-k "
        "covariance is taken per micro-batch, as in verl.",
    ),
    "clip_cov": Paper(
        "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
        "2505.22617",
        {
            "algorithm_type": "grpo",
            "policy_loss_fn": "clip_cov",
            "policy_loss_fn_args": {
                "clip_cov_ratio": 2e-4,
                "clip_cov_lb": 1.0,
                "clip_cov_ub": 5.0,
            },
            "kl_loss_fn": "none",
        },
        "The random draw of the cut tokens is seeded by policy_loss_fn_args.seed and the step.",
    ),
    "dppo_tv": Paper(
        "Rethinking the Trust Region in LLM Reinforcement Learning",
        "2602.04879",
        {
            "algorithm_type": "grpo",
            "advantage_fn_args": {"std_normalize": False},
            "policy_loss_fn": "dppo_tv",
            "policy_loss_fn_args": {"clip_range": 0.15, "clip_ratio_c": None, "anchor": "rollout"},
            "kl_loss_fn": "none",
            "loss_agg_mode": "seq-mean-token-sum-norm",
        },
        "The paper's recipe (verl's example): Dr. GRPO advantages and aggregation, the trust "
        "region anchored on the engine's logprobs (verl's bypass mode), no weight truncation. "
        "The Top-K divergence approximation is not built.",
    ),
    "dppo_kl": Paper(
        "Rethinking the Trust Region in LLM Reinforcement Learning",
        "2602.04879",
        {
            "algorithm_type": "grpo",
            "advantage_fn_args": {"std_normalize": False},
            "policy_loss_fn": "dppo_kl",
            "policy_loss_fn_args": {"clip_range": 0.05, "clip_ratio_c": None, "anchor": "rollout"},
            "kl_loss_fn": "none",
            "loss_agg_mode": "seq-mean-token-sum-norm",
        },
        "As dppo_tv, with the binary KL bounded by 0.05.",
    ),
    "dro": Paper(
        "Offline Regularised Reinforcement Learning for Large Language Models Alignment",
        "2405.19107",
        {
            "algorithm_type": "grpo",
            "policy_loss_fn": "dro",
            "policy_loss_fn_args": {"dro_beta": 0.1},
            "kl_loss_fn": "none",
        },
        "verl's dro loss mode: the token-level proximal form -(A log pi - beta/2 (log pi - log "
        "pi_old)^2) that Kimi k1.5 (arXiv:2501.12599) trains with; the paper's offline, "
        "value-based DRO with a learned V is not built (the advantages here are the "
        "advantage fn's). beta has no published default; 0.1 is ours.",
    ),
    "decoupled_ppo": Paper(
        "Batch size-invariance for policy optimization",
        "2110.13799",
        {
            "algorithm_type": "grpo",
            "rollout_correction": {"rollout_is": "token", "rollout_is_threshold": 2.0},
        },
        "PPO's clip on pi/pi_old times the truncated weight pi_old/mu against the engine's "
        "logprobs (AReaL, arXiv:2505.24298, for asynchronous RL).",
    ),
    "rec": Paper(
        "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm: Demystifying Some Myths "
        "About GRPO and Its Friends",
        "2509.24203",
        {
            "algorithm_type": "rec",
            "policy_loss_fn_args": {
                "clip_mode": "one-side",
                "weight": "none",
                "epsilon_low": 0.2,
                "epsilon_high": 0.2,
            },
            "advantage_fn_args": {"std_normalize": False},
            "kl_loss_fn_args": {"kl_coef": 0.0},
        },
        "REC-OneSide-NoIS, as Trinity-RFT's rec_gsm8k example; the paper's other variants are "
        "other clip_mode / weight / regularizer values (REC-TwoSide, REC-Ring, REP's additive "
        "regularizers, RED's drop: balance and weight: advantage).",
    ),
    "clipb": Paper(
        "On the Entropy Dynamics in Reinforcement Fine-Tuning of Large Language Models",
        "2602.03392",
        {
            "algorithm_type": "grpo",
            "advantage_fn": "clipb",
            "advantage_fn_args": {"mu": 2.5},
            "repeat_times": 16,
            "kl_loss_fn_args": {"kl_coef": 0.0},
        },
        "Clip_B as Trinity-RFT's entropy example. Clip_V is advantage_fn: clipv with "
        "{mu: 8.5} and repeat_times 8. The token statistics (entropy, NEC) are the trainer's "
        "own here, where Trinity-RFT patches verl's actor for them.",
    ),
}
