"""The critic of PPO: a value model, its optimizer and its update.

A separate model: the policy's architecture loaded from `model.critic_model_path` (empty: the
policy's start model), its LM head replaced by a linear value head initialised to 0 (so the
first values are 0 and GAE starts as Monte-Carlo returns). V(s_t) for response token t is read
at the position that predicts it, the state before the token, as the policy's logprob.

    algorithm: {algorithm_type: ppo}
    trainer: {critic: {optimizer: {lr: 1.0e-5}, cliprange_value: 0.5, warmup_steps: 0}}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from trinity.algorithm.aggregation import Aggregator
from trinity.algorithm.value_loss import clipped_value_loss
from trinity.models import load_model
from trinity.trainer.batch import Batch
from trinity.trainer.optim import build_optimizer

CRITIC_WEIGHTS = "critic/model.safetensors"  # a subfolder: the policy's loader reads *.safetensors


class ValueModel(torch.nn.Module):
    """A causal LM's trunk and a scalar head: [B, T] token ids -> V [B, R] at response positions."""

    def __init__(self, path: str, dtype: Any, device: str) -> None:
        super().__init__()
        lm = load_model(path, dtype=dtype, device=device)
        self.trunk = lm.get_decoder() if hasattr(lm, "get_decoder") else lm.base_model
        hidden = lm.config.hidden_size
        param = next(self.trunk.parameters())
        self.head = torch.nn.Linear(hidden, 1, device=param.device, dtype=param.dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, batch: Batch) -> torch.Tensor:
        hidden = self.trunk(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
        ).last_hidden_state  # [B, T, H]
        rows = torch.arange(hidden.shape[0], device=hidden.device)[:, None]
        at = hidden[rows, batch.response_pos]  # [B, R, H]
        values = self.head(at).squeeze(-1).float()  # [B, R]
        return values * batch.valid_mask


class Critic:
    """The value model with its own optimizer (`trainer.critic`)."""

    def __init__(self, config: Any, path: str, device: str) -> None:
        self.config = config
        ccfg = config.trainer.critic
        self.model = ValueModel(path, config.trainer.dtype, device)
        self.model.train()
        self.cliprange = ccfg.cliprange_value
        self.warmup_steps = ccfg.warmup_steps
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None

    def plan(self, total_steps: int | None) -> None:
        opt = self.config.trainer.critic.optimizer
        total = None if total_steps is None else max(total_steps, 1)
        self.optimizer, self.scheduler = build_optimizer(
            self.model, opt, total, self.config.seed + 1
        )

    @torch.no_grad()
    def values(self, batch: Batch, mbs: list[torch.Tensor]) -> torch.Tensor:
        """V [B, R] of every row, in micro-batches, no grad."""
        out = torch.zeros_like(batch.rollout_logprobs)
        for idx in mbs:
            mb = batch.select(idx)
            v = self.model(mb)
            out[idx, : v.shape[1]] = v
        return out

    def update(
        self, batch: Batch, mbs: list[torch.Tensor], loss_agg_mode: str, clip_grad: float | None
    ) -> dict[str, float]:
        """One optimizer step on the clipped value loss toward `batch.returns`."""
        assert self.optimizer is not None and self.scheduler is not None, "plan() first"
        assert batch.values is not None and batch.returns is not None
        agg = Aggregator(
            loss_agg_mode,
            num_tokens=float(batch.response_mask.sum()),
            num_seqs=float(batch.num_seqs()),
            norm_length=float(batch.response_mask.shape[1]),
        )
        self.optimizer.zero_grad(set_to_none=True)
        n_tok = max(float(batch.response_mask.sum()), 1.0)
        sums: dict[str, float] = {}
        for idx in mbs:
            mb = batch.select(idx)
            assert mb.values is not None and mb.returns is not None
            loss, m = clipped_value_loss(
                self.model(mb), mb.values, mb.returns, mb.response_mask, agg=agg,
                cliprange_value=self.cliprange,
            )  # fmt: skip
            loss.backward()
            share = float(mb.response_mask.sum()) / n_tok
            for k, v in m.items():
                sums[f"critic/{k}"] = sums.get(f"critic/{k}", 0.0) + v * (
                    1.0 if k == "vf_loss" else share
                )
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), clip_grad or float("inf")
        )
        self.optimizer.step()
        self.scheduler.step()
        sums["critic/grad_norm"] = float(grad_norm)
        sums["critic/lr"] = self.scheduler.get_last_lr()[0]
        return sums

    # -- checkpoints -------------------------------------------------------------------------

    def save(self, folder: Path) -> dict[str, Any]:
        """Weights into `folder/critic/model.safetensors`; returns the optimizer state to keep."""
        state = {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}
        (folder / CRITIC_WEIGHTS).parent.mkdir(exist_ok=True)
        save_file(state, str(folder / CRITIC_WEIGHTS))
        assert self.optimizer is not None and self.scheduler is not None
        return {
            "critic_optimizer": self.optimizer.state_dict(),
            "critic_scheduler": self.scheduler.state_dict(),
        }

    def load(self, folder: Path, state: dict[str, Any]) -> None:
        self.model.load_state_dict(load_file(str(folder / CRITIC_WEIGHTS)))
        assert self.optimizer is not None and self.scheduler is not None
        self.optimizer.load_state_dict(state["critic_optimizer"])
        self.scheduler.load_state_dict(state["critic_scheduler"])
