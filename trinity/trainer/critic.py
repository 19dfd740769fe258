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
from trinity.trainer.parallel import Ranks, idle_rows
from trinity.trainer.sequence_parallel import gather_slices, slice_states, use_sequence_parallel
from trinity.trainer.sharding import (
    build_sharded,
    full_state,
    load_full_state,
    restore_optimizer,
    save_optimizer,
    scalar,
)

CRITIC_WEIGHTS = "critic/model.safetensors"  # a subfolder: the policy's loader reads *.safetensors
CRITIC_OPTIMIZER = "critic/optimizer"  # a sharded critic's optimizer state (DCP)


class ValueModel(torch.nn.Module):
    """A causal LM's trunk and a scalar head: [B, T] token ids -> V [B, R] at response positions.
    `sp`: this rank's sequence-parallel group (`trinity.trainer.sequence_parallel`: the trunk
    runs on this rank's slice of each sequence, the values are summed over the group)."""

    def __init__(self, path: str, dtype: Any, device: str, sp: Ranks | None = None) -> None:
        super().__init__()
        lm = load_model(path, dtype=dtype, device=device)
        self.sp = sp
        if sp is not None:
            use_sequence_parallel(lm, sp)
        self.trunk = lm.get_decoder() if hasattr(lm, "get_decoder") else lm.base_model
        hidden = lm.config.hidden_size
        param = next(self.trunk.parameters())
        self.head = torch.nn.Linear(hidden, 1, device=param.device, dtype=param.dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, batch: Batch) -> torch.Tensor:
        if self.sp is not None:  # this slice's states [N, H]; the group's values summed
            hidden, (rows, cols), h = slice_states(
                self.trunk, batch.input_ids, batch.response_pos, batch.valid_mask, self.sp
            )
            values = torch.zeros(batch.valid_mask.shape, device=h.device)  # [B, R]
            values = values.index_put((rows, cols), self.head(h).squeeze(-1).float())
            return gather_slices(hidden, self.sp, values)[0]
        hidden = self.trunk(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
        ).last_hidden_state  # [B, T, H]
        rows = torch.arange(hidden.shape[0], device=hidden.device)[:, None]
        at = hidden[rows, batch.response_pos]  # [B, R, H]
        values = self.head(at).squeeze(-1).float()  # [B, R]
        return values * batch.valid_mask


class Critic:
    """The value model with its own optimizer (`trainer.critic`)."""

    def __init__(
        self, config: Any, path: str, device: str, ranks: Ranks | None = None, sharded: bool = False
    ) -> None:
        """`ranks`, `sharded`: as the policy's (`Trainer`): every rank loads the value model and
        keeps its shards (its forward is a whole pass: it is its own FSDP root)."""
        self.config = config
        ccfg = config.trainer.critic
        self.ranks, self.sharded = ranks or Ranks(), sharded

        sp = self.ranks if self.ranks.sp > 1 else None

        def load() -> ValueModel:
            return ValueModel(path, config.trainer.dtype, device, sp)

        self.model = (
            build_sharded(load, self.ranks, device, root=lambda m: m) if sharded else load()
        )
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
    def values(self, batch: Batch, mbs: list[torch.Tensor | None]) -> torch.Tensor:
        """V [B, R] of every row, no grad: this rank's micro-batches `mbs` (None: an idle one),
        summed with the other ranks' rows."""
        out = torch.zeros_like(batch.rollout_logprobs)
        for idx in mbs:
            v = self.model(batch.select(idx) if idx is not None else idle_rows(batch))
            if idx is not None:
                out[idx, : v.shape[1]] = v
        return self.ranks.all_sum(out)

    def update(
        self,
        batch: Batch,
        mbs: list[torch.Tensor | None],
        loss_agg_mode: str,
        clip_grad: float | None,
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
            mb = batch.select(idx) if idx is not None else idle_rows(batch)
            assert mb.values is not None and mb.returns is not None
            loss, m = clipped_value_loss(
                self.model(mb), mb.values, mb.returns, mb.response_mask, agg=agg,
                cliprange_value=self.cliprange,
            )  # fmt: skip
            loss.backward()
            if idx is None:  # an idle micro-batch: the ranks' collectives, no term
                continue
            share = float(mb.response_mask.sum()) / n_tok
            for k, v in m.items():
                sums[f"critic/{k}"] = sums.get(f"critic/{k}", 0.0) + v * (
                    1.0 if k == "vf_loss" else share
                )
        sums = self.ranks.sum_metrics(sums)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), clip_grad or float("inf")
        )
        self.optimizer.step()
        self.scheduler.step()
        sums["critic/grad_norm"] = scalar(grad_norm)
        sums["critic/lr"] = self.scheduler.get_last_lr()[0]
        return sums

    # -- checkpoints -------------------------------------------------------------------------

    def save(self, folder: Path) -> dict[str, Any]:
        """Weights into `folder/critic/model.safetensors`; returns the state to keep in the
        trainer state. Sharded (every rank calls it): rank 0 writes the gathered weights and
        each rank its optimizer shards (`critic/optimizer`, DCP)."""
        assert self.optimizer is not None and self.scheduler is not None
        if self.sharded:
            weights = full_state(self.model)
            save_optimizer(self.model, self.optimizer, folder, CRITIC_OPTIMIZER)
            optimizer = None
        else:
            weights = self.model.state_dict()
            optimizer = self.optimizer.state_dict()
        if self.ranks.rank == 0:
            state = {k: v.detach().contiguous() for k, v in weights.items()}
            (folder / CRITIC_WEIGHTS).parent.mkdir(exist_ok=True)
            save_file(state, str(folder / CRITIC_WEIGHTS))
        return {"critic_optimizer": optimizer, "critic_scheduler": self.scheduler.state_dict()}

    def load(self, folder: Path, state: dict[str, Any]) -> None:
        """What `save` wrote, at this world size whatever the saving one was."""
        assert self.optimizer is not None and self.scheduler is not None
        if self.sharded:
            lead = self.ranks.rank == 0
            load_full_state(self.model, load_file(str(folder / CRITIC_WEIGHTS)) if lead else {})
        else:
            self.model.load_state_dict(load_file(str(folder / CRITIC_WEIGHTS)))
        saved = state.get("critic_optimizer")  # by one process; ranks write it with DCP
        restore_optimizer(self.model, self.optimizer, folder, CRITIC_OPTIMIZER, saved, self.sharded)
        self.scheduler.load_state_dict(state["critic_scheduler"])
