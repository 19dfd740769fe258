"""Policy losses beyond PPO and SFT, one module each, registered in `POLICY_LOSS_FN` by name.

Each keeps the kind's one signature (`trinity.algorithm.policy_loss`) and is imported on first
use through the registry's `modules` map, so a config names them like any other piece:
``policy_loss_fn: gspo``.
"""
