"""The train step: sample → old/ref logprobs → advantages → losses → optimizer step.

One PyTorch model on one device (`trainer.trainer_strategy: torch`), or one rank of several
(`fsdp2`: the model's parameters sharded over the ranks, each rank forwarding its own rows;
`trinity.trainer.parallel` and `sharding`; with `ulysses_sequence_parallel_size` > 1 each rank
takes a slice of its rows' sequences, `trinity.trainer.sequence_parallel`). Gradient accumulation is exact: every micro-batch's
loss is aggregated with the counts of the WHOLE train batch (`Aggregator`), so summing
micro-batch gradients, over micro-batches and over ranks, equals one big batch's gradient for
every `loss_agg_mode`.

Old logprobs: with one optimizer update per train step (`ppo_epochs: 1`, one mini-batch) the
weights that would "recompute" them are the weights being trained, so the detached logprobs of the
same forward pass ARE the recomputed old logprobs (ratio = 1, gradient of the clipped surrogate
intact) and a second forward pass is skipped. With `ppo_epochs > 1` or several mini-batches they
are recomputed in a no-grad pass before the first update, as in PPO.
"""

from __future__ import annotations

import gc
import os
import time
import weakref
from pathlib import Path
from typing import Any

import torch

from trinity.algorithm import Aggregator, resolve_algorithm
from trinity.algorithm.algorithms import record_flag
from trinity.algorithm.correction import mismatch_metrics, rollout_correction
from trinity.algorithm.entropy import entropy_term_has_gradient
from trinity.algorithm.inputs import AdvantageInput, PolicyLossInput, last_token_rewards
from trinity.algorithm.kl_controller import AdaptiveKLController
from trinity.algorithm.sample_strategy import SampleContext
from trinity.algorithm.shaping import overlong_penalty
from trinity.common import heartbeat
from trinity.common.experience import Experience
from trinity.common.memory import GB, IdleTrim, PeakRss, release_free_heap, set_mmap_threshold
from trinity.common.timer import Timers
from trinity.config.resolved import resolve
from trinity.models import load_model, load_tokenizer, offload, resolve_model_path
from trinity.models.loading import build_empty_model, distinct_tensors, load_weights
from trinity.trainer import lora
from trinity.trainer.batch import Batch, collate, scatter_rows
from trinity.trainer.checkpoint import (
    OPTIMIZER,
    TRAINER_STATE,
    begin_checkpoint,
    save_hf_checkpoint,
    save_weights,
    seal_checkpoint,
    temp_folder,
)
from trinity.trainer.critic import Critic
from trinity.trainer.logprobs import response_logprobs, response_token_stats
from trinity.trainer.optim import build_optimizer
from trinity.trainer.parallel import Ranks, idle_rows
from trinity.trainer.replayed_rows import clip_copies_to_behaviour
from trinity.trainer.sequence_parallel import use_sequence_parallel
from trinity.trainer.sft_data import auxiliary_readers
from trinity.trainer.sharding import (
    PassRoot,
    build_sharded,
    full_state,
    load_full_state,
    restore_optimizer,
    save_optimizer,
    scalar,
)

# seconds without a step before the trainer trims its heap: far above the gap between steps
# whose batches are ready (milliseconds), below an on-policy run's rollout phase (seconds)
TRIM_AFTER_IDLE_S = 0.5

# metrics computed through the Aggregator (global counts), so micro-batch values sum to the total
ADDITIVE_METRICS = frozenset(
    {"loss", "pg_loss", "sft_loss", "kl_loss", "entropy", "dpo_loss"}
    | {"chosen_reward", "rejected_reward", "reward_margin", "reward_accuracy"}  # per-pair means
)


class Trainer:
    def __init__(
        self,
        config: Any,
        model_path: str,
        total_steps: int | None,
        num_threads: int | None = None,
        ranks: Ranks | None = None,
    ) -> None:
        """`num_threads`: torch threads (the launcher's resource plan); None =
        `trainer.num_threads`, else every core. `total_steps`: the lr schedule's horizon; None:
        not known yet, `plan` it before the first step (the runner loads the model while the
        run is still planning its steps). `ranks`: this process's place among the trainer's
        ranks (`trainer_strategy: fsdp2`; its process group joined already); None: one
        process, nothing sharded."""
        tcfg = config.trainer
        # Ray sets OMP_NUM_THREADS to the CPUs an actor reserves: choose explicitly
        torch.set_num_threads(num_threads or tcfg.num_threads or os.cpu_count() or 1)
        if tcfg.malloc_mmap_threshold_mb is not None:  # before the model's tensors exist
            set_mmap_threshold(tcfg.malloc_mmap_threshold_mb * 1024**2)
        torch.manual_seed(config.seed)
        self.config = config
        # unset: trim, unless the engines share this process (they reuse the freed heap)
        release = tcfg.release_heap_after_step
        self.release_heap = not config.cluster.one_process if release is None else release
        # the trim once the trainer idles between steps, not after each (common.memory)
        self.idle_trim = IdleTrim(TRIM_AFTER_IDLE_S) if self.release_heap else None
        if self.idle_trim is not None:  # its thread ends with the trainer
            weakref.finalize(self, self.idle_trim.close)
        self.algo = resolve_algorithm(config.algorithm)
        # an entropy term of coefficient 0 only reports the entropy: no autograd through it
        self.entropy_grad = entropy_term_has_gradient(
            self.algo.entropy_loss_fn, self.algo.entropy_loss_fn_args
        )
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.sharded = ranks is not None
        self.ranks = ranks or Ranks()
        # this rank's sequence-parallel group, where sequences are split (None: not split)
        self.sp = self.ranks if self.ranks.sp > 1 else None
        path = resolve_model_path(model_path)
        self.tokenizer = load_tokenizer(
            path, custom_chat_template=config.model.custom_chat_template
        )
        # model.lora_configs: only an adapter trains and syncs; the base is frozen (trainer/lora.py)
        self.lora = lora.lora_settings(config)
        # the policy as one pass (`sharding.PassRoot`: the FSDP root when sharded); self.model
        # is the transformers model inside it (with LoRA, the peft model around it)
        self.policy = self._load(path, adapter=self.lora)
        self.model = self.policy.module
        # the shared-prefix pass runs each decoder layer twice in one forward, which FSDP2's
        # per-layer gather and free does not support in backward: one pass per row when sharded
        self.share_prefix = tcfg.share_prompt_prefix and not self.sharded
        self.model.train()
        self.model.config.use_cache = False
        if tcfg.enable_gradient_checkpointing:  # decoder layers recompute in backward
            enable_checkpointing(self.model)
        # with LoRA: bytes a full-weights sync would move (`sync/full_bytes`)
        self.full_sync_nbytes = lora.full_nbytes(self.model) if self.lora is not None else None
        self.peak_rss = PeakRss()  # this process's peak RSS per train step
        # buffer.trainer_input.auxiliary_buffers: readers a sample strategy may draw from
        self.auxiliary = auxiliary_readers(config, self.tokenizer)
        r = resolve(config)  # a full step's rollouts and expert rows (sample_strategy mix)
        self.planned_rows = (r.train_batch_size, r.expert_rows) if r.expert_rows else None
        self.critic: Critic | None = None
        if self.algo.spec.use_critic:
            critic_path = resolve_model_path(config.model.critic_model_path or model_path)
            self.critic = Critic(config, critic_path, self.device, self.ranks, self.sharded)
        self.ref_model = None
        # with LoRA the reference is the base: the policy with its adapter off (no second copy)
        self.ref_is_base = (
            self.lora is not None
            and self.algo.use_reference
            and not self.algo.spec.teacher_from_auxiliary
        )
        if self.algo.use_reference and not self.ref_is_base:
            ref_path = path
            if self.algo.spec.teacher_from_auxiliary:  # on-policy distillation's teacher
                ref_path = resolve_model_path(config.explorer.auxiliary_models[0].model_path)
                check_same_vocabulary(self.tokenizer, load_tokenizer(ref_path), ref_path)
            self.ref_model = self._load(ref_path)
            self.ref_model.requires_grad_(False)
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else self.tokenizer.eos_token_id
        )
        opt = config.algorithm.optimizer
        self.clip_grad = tcfg.grad_clip if tcfg.grad_clip is not None else opt.clip_grad
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if total_steps is not None:
            self.plan(total_steps)
        self.step = 0
        self.ppo_epochs = tcfg.ppo_epochs
        self.unit = 2 if self.algo.spec.pairwise else 1  # rows that stay in one micro-batch
        self.mini_batch_size = tcfg.ppo_mini_batch_size
        # Dr. GRPO's horizon L: fixed for the whole run, never the longest response of a batch
        horizon = config.model.max_response_tokens
        if self.algo.loss_agg_mode == "seq-mean-token-sum-norm" and horizon is None:
            raise ValueError(
                "loss_agg_mode 'seq-mean-token-sum-norm' needs model.max_response_tokens "
                "(its fixed horizon L, in tokens)"
            )
        self.norm_length = float(horizon) if horizon is not None else None
        # the KL reward penalty's coefficient, adapted per step (algorithm.kl_ctrl)
        self.kl_ctrl: AdaptiveKLController | None = None
        kc = config.algorithm.kl_ctrl
        if kc.type == "adaptive":
            if self.algo.spec.kl_penalty_fn == "none":
                raise ValueError("algorithm.kl_ctrl type 'adaptive' needs a kl_penalty_fn")
            init = self.algo.kl_penalty_fn_args.get("kl_coef", 0.001)
            self.kl_ctrl = AdaptiveKLController(init, kc.target_kl, kc.horizon)
        # DAPO's soft overlong punishment: (L_max, L_cache, factor), or None when off
        self.overlong: tuple[int, int, float] | None = None
        if record_flag(config.algorithm, "overlong_penalty"):
            ocfg = config.algorithm.overlong_penalty
            if horizon is None:
                raise ValueError(
                    "algorithm.overlong_penalty needs model.max_response_tokens (L_max)"
                )
            self.overlong = (horizon, ocfg.buffer_len or max(1, horizon // 5), ocfg.penalty_factor)

    def _load(self, path: str, adapter: Any = None) -> PassRoot:
        """The model at `path` (with a fresh LoRA `adapter`, `trainer.lora.wrap`) as a
        `PassRoot`: sharded over the ranks (rank 0 reads it, the others build it empty and
        receive their shards), or whole in this process."""
        dtype = self.config.trainer.dtype

        def load() -> Any:
            model = load_model(path, dtype=dtype, device=self.device)
            if self.sp is not None:  # attention over the group's slices
                use_sequence_parallel(model, self.sp)
            return model if adapter is None else lora.wrap(model, adapter)

        if not self.sharded:
            return PassRoot(load())

        def empty() -> Any:
            model = build_empty_model(path, dtype=dtype, device=self.device)
            if self.sp is not None:
                use_sequence_parallel(model, self.sp)
            return model if adapter is None else lora.wrap(model, adapter)

        return build_sharded(load, self.ranks, self.device, build_meta=empty)

    def plan(self, total_steps: int | None) -> None:
        """Build the optimizer and its lr schedule over `total_steps` train steps (None: no
        budget, a constant schedule)."""
        opt = self.config.algorithm.optimizer
        total = None if total_steps is None else max(total_steps, 1)
        self.optimizer, self.scheduler = build_optimizer(self.model, opt, total, self.config.seed)
        if self.critic is not None:
            self.critic.plan(total_steps)

    def release_training_state(self) -> None:
        """Training is over (the last step is checkpointed): drop the optimizers (policy and
        critic; their state is in the checkpoint) and the gradients, and hand the freed heap back.
        The weights stay: the final evaluation's engines load or, with `sync_method: shared`,
        map them. For the SmolLM2 example that is AdamW's two moments (1.08 GB in float32, 0.54
        in bf16) less beside the engines while they evaluate."""
        self.optimizer = self.scheduler = None
        if self.idle_trim is not None:  # no more steps: this trim is the last
            self.idle_trim.close()
        self.model.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.critic.optimizer = self.critic.scheduler = None
            self.critic.model.zero_grad(set_to_none=True)
        gc.collect()
        release_free_heap()

    def place(self, on_device: bool) -> int:
        """Colocation (`common.turns`): the policy, reference, critic and the optimizers' state
        on the device (`on_device`, the trainer's turn) or in host memory (the engines' turn);
        returns the bytes moved (0 on a CPU-only machine, where both are host memory)."""
        critic = self.critic
        modules = [self.policy, self.ref_model, critic.model if critic else None]
        optimizers = [self.optimizer, critic.optimizer if critic else None]
        return offload.to_device(modules, optimizers, self.device if on_device else "cpu")

    def _planned(self) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        if self.optimizer is None or self.scheduler is None:
            raise RuntimeError("Trainer.plan(total_steps) must come before training or resuming")
        return self.optimizer, self.scheduler

    # -- the step ----------------------------------------------------------------------------

    def train_step(self, experiences: list[Experience]) -> dict[str, float]:
        """One train step on one train batch (`_train_step`); its freed transients go back to
        the OS once the trainer idles after it (`trainer.release_heap_after_step`)."""
        if self.idle_trim is None:
            return self._train_step(experiences)
        with self.idle_trim.busy():
            return self._train_step(experiences)

    def _train_step(self, experiences: list[Experience]) -> dict[str, float]:
        """One train step on one train batch.

        1. sample strategy picks/reorders the experiences, which are collated  # [B, T]
        2. reference logprobs (KL) and, when several updates follow, old logprobs  # [B, R]
        3. advantages from rewards and groups (after KL reward shaping, if any)  # [B, R]
        4. per mini-batch: micro-batch forward, losses, backward; clip; optimizer step; then one
           lr-scheduler step (the schedule counts train steps, see `trinity.trainer.optim`)
        """
        timers, metrics = Timers(), {}
        t_start = time.perf_counter()
        self.peak_rss.reset()
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        a = self.algo
        tcfg = self.config.trainer
        # 1. sample and collate
        ctx = SampleContext(
            step=self.step + 1, auxiliary=self.auxiliary, planned_rows=self.planned_rows
        )
        experiences = a.sample_strategy(experiences, ctx, **a.sample_strategy_args)
        batch = collate(experiences, self.pad_id)
        # this rank's micro-batches (all of them in one process; None: an idle one)
        mbs = self.ranks.micro_batches(
            batch, tcfg.micro_batch_size_per_gpu, self._token_budget(), self.unit
        )
        correction = self.config.algorithm.rollout_correction
        # decoupled PPO: a correction weighs by π_old/μ, so π_old is known before the update
        recompute_old = (
            self.ppo_epochs > 1
            or (self.mini_batch_size is not None and self.mini_batch_size < len(batch))
            or correction.enabled
            or batch.replayed is not None  # a copy's π_old is its μ (replayed_rows)
        )
        # 2. reference and old logprobs, no grad
        with torch.no_grad():
            if self.ref_model is not None:
                with timers("ref"):
                    batch.ref_logprobs = self._logprobs_no_grad(self.ref_model, batch, mbs)
            elif self.ref_is_base:
                with timers("ref"), lora.reference_weights(self.model):
                    batch.ref_logprobs = self._logprobs_no_grad(self.policy, batch, mbs)
            if recompute_old:
                with timers("old_logprob"):
                    batch.old_logprobs = self._logprobs_no_grad(self.policy, batch, mbs)
                if batch.replayed is not None:
                    metrics.update(clip_copies_to_behaviour(batch, batch.response_mask))
            if self.critic is not None:
                with timers("values"):
                    batch.values = self.critic.values(batch, mbs)
            if getattr(a.advantage_fn, "token_stats", False):
                with timers("token_stats"):
                    self._token_stats(batch, mbs)
        # 3. advantages
        with timers("advantage"):
            if batch.advantages is None and a.advantage_fn is not None:
                if self.overlong is not None:
                    lengths = batch.valid_mask.sum(dim=1)
                    penalty = overlong_penalty(lengths, *self.overlong)
                    batch.rewards = batch.rewards + penalty
                    metrics["train/overlong_penalty_mean"] = float(penalty.mean())
                usual = batch if not batch.expert_mask.any() else batch.select(~batch.expert_mask)
                inp, kl_m = self._advantage_input(usual)
                metrics.update({f"train/{k}": v for k, v in kl_m.items()})
                adv, ret, *dropped = a.advantage_fn(inp, **a.advantage_fn_args)
                if usual is not batch:  # expert rows (mix) carry no advantage
                    batch.advantages, batch.returns = scatter_rows(
                        batch, ~batch.expert_mask, adv, ret
                    )
                else:
                    batch.advantages, batch.returns = adv, ret
                if dropped:  # a TokenFilter: its dropped tokens leave training
                    (drop,) = scatter_rows(batch, ~batch.expert_mask, ~dropped[0].keep)
                    batch.response_mask = batch.response_mask & ~drop
                    metrics.update(
                        {f"train/advantage/{k}": v for k, v in dropped[0].metrics.items()}
                    )
            if batch.advantages is None:
                batch.advantages = torch.zeros_like(batch.rollout_logprobs)
        trained = batch.response_mask  # before a rejection mask drops tokens
        if correction.enabled:
            metrics.update(self._correct(batch))
        # 4. updates: the critic toward the returns, then (after its warm-up) the policy
        if self.critic is not None:
            with timers("critic"):
                metrics.update(self.critic.update(batch, mbs, a.loss_agg_mode, self.clip_grad))
        _, scheduler = self._planned()
        lr = scheduler.get_last_lr()[0]  # the lr of every update of this step
        if self.critic is None or self.step >= self.critic.warmup_steps:
            with timers("update"):
                update_metrics = self._update(batch, mbs, recompute_old)
                scheduler.step()
            metrics.update(update_metrics)
        if batch.has_rollout_logprobs and batch.old_logprobs is not None:
            seq = correction.rollout_is == "sequence"
            if batch.replayed is not None:  # a copy's π_old is μ: no mismatch to measure
                trained = trained & ~batch.replayed[:, None]
            mm = mismatch_metrics(batch.old_logprobs, batch.rollout_logprobs, trained, seq)
            metrics.update({f"off_policy/{k}": v for k, v in mm.items()})
        self.step += 1
        elapsed = time.perf_counter() - t_start
        resp = batch.response_mask
        metrics.update(
            {
                "train/lr": lr,
                "train/advantage_mean": _masked_mean(batch.advantages, resp),
                "train/reward_mean": float(batch.rewards.mean()),
                "train/response_length": float(batch.valid_mask.sum(dim=1).float().mean()),
                "train/experiences": float(len(batch)),
                "train/tokens": float(batch.num_tokens),
                "train/tokens_per_s": batch.num_tokens / elapsed,
                **timers.metrics("timing/train_"),
                **self._memory_metrics(),
            }
        )
        return metrics

    def _memory_metrics(self) -> dict[str, float]:
        """The step's peak RSS of this process (`trinity.common.memory.PeakRss`: the kernel's
        high-water mark, reset at the step's start) and, on CUDA, the allocator's peak."""
        out = {"memory/trainer_peak_rss_gb": self.peak_rss.peak_bytes() / GB}
        if self.device == "cuda":
            out["memory/trainer_peak_cuda_gb"] = torch.cuda.max_memory_allocated() / GB
        return out

    def _advantage_input(self, batch: Batch) -> tuple[AdvantageInput, dict[str, float]]:
        """The advantage fn's record: token rewards (a workflow's own, else each outcome reward
        on its row's last trained token) shaped by the KL penalty piece (`none`: unchanged),
        and each row's scalar reward = the sum of its shaped token rewards."""
        a = self.algo
        mask = batch.response_mask  # [B, R]
        outcome_tokens, trained = last_token_rewards(batch.rewards, mask)  # [B, R], [B]
        own = batch.token_rewards
        token_rewards = outcome_tokens if own is None else own * mask
        kl_m: dict[str, float] = {}
        if batch.ref_logprobs is not None:
            args = dict(a.kl_penalty_fn_args)
            if self.kl_ctrl is not None:
                args["kl_coef"] = self.kl_ctrl.value
            token_rewards, kl_m = a.kl_penalty_fn(
                token_rewards, batch.rollout_logprobs, batch.ref_logprobs, mask, **args
            )
            if self.kl_ctrl is not None:  # steer β by this step's KL
                self.kl_ctrl.update(kl_m.get("kl_penalty", 0.0), n_steps=len(batch))
        # a row with no trained token has no token reward to sum: it keeps its outcome reward
        rewards = torch.where(trained, (token_rewards * mask).sum(dim=1), batch.rewards)  # [B]
        inp = AdvantageInput(
            rewards=rewards,
            group_ids=batch.group_ids,
            response_mask=mask,
            token_rewards=token_rewards,
            run_ids=batch.run_ids,
            step_ids=batch.step_ids,
            values=batch.values,
            baselines=batch.baselines,
            logprob=next(
                lp
                for lp in (batch.stats_logprobs, batch.old_logprobs, batch.rollout_logprobs)
                if lp is not None
            ),
            ref_logprob=batch.ref_logprobs,
            entropy=batch.entropy,
            nec=batch.nec,
        )
        return inp, kl_m

    def _correct(self, batch: Batch) -> dict[str, float]:
        """Apply `algorithm.rollout_correction`: importance weights into `batch.is_weights`,
        rejected tokens out of `batch.response_mask` (after the advantages, which stay)."""
        if not batch.has_rollout_logprobs:
            raise ValueError(
                "algorithm.rollout_correction needs the engine's logprobs, and this train batch "
                "has experiences without them (offline data); turn the correction off"
            )
        assert batch.old_logprobs is not None  # recomputed whenever a correction is on
        corr = self.config.algorithm.rollout_correction
        weights, keep, m = rollout_correction(
            batch.old_logprobs,
            batch.rollout_logprobs,
            batch.response_mask,
            rollout_is=corr.rollout_is,
            rollout_is_threshold=corr.rollout_is_threshold,
            rollout_rs=corr.rollout_rs,
            rollout_rs_threshold=corr.rollout_rs_threshold,
            rollout_rs_threshold_lower=corr.rollout_rs_threshold_lower,
        )
        batch.is_weights, batch.response_mask = weights, keep  # a row rejected whole: no seq
        return {f"off_policy/{k}": v for k, v in m.items()}

    def _update(
        self, batch: Batch, mbs: list[torch.Tensor], recompute_old: bool
    ) -> dict[str, float]:
        optimizer, _ = self._planned()
        b = len(batch)
        mini = -(-(self.mini_batch_size or b) // self.unit) * self.unit  # whole pairs
        sums: dict[str, float] = {}
        n_updates = 0
        if not recompute_old:  # one update on the whole batch: its detached logprobs are π_old
            batch.old_logprobs = torch.zeros_like(batch.rollout_logprobs)
        for _ in range(self.ppo_epochs):
            for m0 in range(0, b, mini):
                rows = torch.arange(m0, min(m0 + mini, b))
                mini_batch = batch.select(rows)
                mask, expert = mini_batch.response_mask, mini_batch.expert_mask
                agg = self._aggregator(mask, mini_batch.num_seqs(unit=self.unit))
                part_aggs = None
                if expert.any():  # each part over its own counts
                    part_aggs = {
                        "usual": self._aggregator(
                            mask & ~expert[:, None], mini_batch.num_seqs(~expert)
                        ),
                        "expert": self._aggregator(
                            mask & expert[:, None], mini_batch.num_seqs(expert)
                        ),
                    }
                parts = self.ranks.micro_batches(
                    mini_batch,
                    self.config.trainer.micro_batch_size_per_gpu,
                    self._token_budget(),
                    self.unit,
                )
                optimizer.zero_grad(set_to_none=True)
                n_tok = max(float(mini_batch.response_mask.sum()), 1.0)
                update: dict[str, float] = {}
                for idx in parts:
                    if idx is None:  # an idle micro-batch: the ranks' collectives, no term
                        self._micro_step(idle_rows(mini_batch, self.unit), agg, True, part_aggs)
                        continue
                    mb = mini_batch.select(idx)
                    m = self._micro_step(mb, agg, recompute_old, part_aggs)
                    if not recompute_old:
                        assert mb.old_logprobs is not None
                        batch.old_logprobs[idx, : mb.old_logprobs.shape[1]] = mb.old_logprobs
                    # losses are already scaled by the whole mini-batch's counts: they add up;
                    # per-token means (clip fraction, ratio, ...) are weighted by token share
                    share = float(mb.response_mask.sum()) / n_tok
                    for k, v in m.items():
                        w = 1.0 if k.rsplit("/", 1)[-1] in ADDITIVE_METRICS else share
                        update[k] = update.get(k, 0.0) + v * w
                for k, v in self.ranks.sum_metrics(update).items():  # every rank's rows
                    sums[k] = sums.get(k, 0.0) + v
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    self.model.parameters(), self.clip_grad or float("inf")
                )
                optimizer.step()
                sums["train/grad_norm"] = sums.get("train/grad_norm", 0.0) + scalar(grad_norm)
                n_updates += 1
        if not recompute_old:  # each rank filled its rows
            assert batch.old_logprobs is not None
            self.ranks.all_sum(batch.old_logprobs)
        return {k: v / n_updates for k, v in sums.items()}

    def _micro_step(
        self,
        mb: Batch,
        agg: Aggregator,
        recompute_old: bool,
        part_aggs: dict[str, Aggregator] | None = None,
    ) -> dict[str, float]:
        """Forward, loss parts, backward for one micro-batch. Losses are pre-scaled by `agg`
        (`part_aggs`: the usual and expert rows' own aggregators, when the batch mixes them)."""
        a = self.algo
        tcfg = self.config.trainer
        logprob, entropy = self.policy(
            response_logprobs,
            mb,
            tcfg.logprob_chunk_size,
            lean=tcfg.lean_lm_head,
            share_prefix=self.share_prefix,
            entropy_grad=self.entropy_grad,
            sp=self.sp,
        )
        mask = mb.response_mask
        if not recompute_old:  # recorded for the off-policy metrics
            mb.old_logprobs = logprob.detach()
        assert mb.old_logprobs is not None and mb.advantages is not None
        advantages = mb.advantages if mb.is_weights is None else mb.advantages * mb.is_weights
        inp = PolicyLossInput(
            logprob=logprob,
            old_logprob=mb.old_logprobs,
            advantages=advantages,
            action_mask=mask,
            rollout_logprob=mb.rollout_logprobs if mb.has_rollout_logprobs else None,
            ref_logprob=mb.ref_logprobs,
            expert_mask=mb.expert_mask if part_aggs else None,
            part_aggs=part_aggs or {},
            step=self.step + 1,
            is_weights=mb.is_weights,
        )
        pg_loss, pg_m = a.policy_loss_fn(inp, agg=agg, **a.policy_loss_fn_args)
        loss = pg_loss
        metrics = {f"train/{k}": v for k, v in pg_m.items()}
        if entropy is not None:  # the policy's own samples: expert rows are not explored
            ent_mask, ent_agg = mask, agg
            if part_aggs:
                ent_mask, ent_agg = mask & ~mb.expert_mask[:, None], part_aggs["usual"]
            ent_loss, ent_m = a.entropy_loss_fn(
                entropy, ent_mask, agg=ent_agg, **a.entropy_loss_fn_args
            )
            loss = loss + ent_loss
            metrics.update({f"train/{k}": v for k, v in ent_m.items()})
        if mb.ref_logprobs is not None:
            kl_loss, kl_m = a.kl_loss_fn(
                logprob, mb.ref_logprobs, mask, agg=agg, **a.kl_loss_fn_args
            )
            loss = loss + kl_loss
            metrics.update({f"train/{k}": v for k, v in kl_m.items()})
        loss.backward()
        metrics["train/loss"] = float(loss.detach())
        heartbeat.progress("trainer")  # a micro-batch done: a long step still moves
        return metrics

    def _aggregator(self, mask: torch.Tensor, rows: int) -> Aggregator:
        """`loss_agg_mode` with the counts of a whole (mini-)batch: its trained tokens `mask`
        [B, R] and its `rows` (`Batch.num_seqs`: rows with no trained token do not count)."""
        return Aggregator(
            self.algo.loss_agg_mode,
            num_tokens=float(mask.sum()),
            num_seqs=float(rows),
            norm_length=self.norm_length,  # model.max_response_tokens
        )

    def _logprobs_no_grad(
        self, model: PassRoot, batch: Batch, mbs: list[torch.Tensor | None]
    ) -> torch.Tensor:
        """Logprobs [B, R] of every row of `batch`: this rank's micro-batches `mbs`, summed
        with the other ranks' rows."""
        out = torch.zeros_like(batch.rollout_logprobs)
        tcfg = self.config.trainer
        for idx in mbs:
            mb = batch.select(idx) if idx is not None else idle_rows(batch, self.unit)
            lp, _ = model(
                response_logprobs,
                mb,
                tcfg.logprob_chunk_size,
                with_entropy=False,
                share_prefix=self.share_prefix,
                sp=self.sp,
            )
            if idx is not None:
                out[idx, : lp.shape[1]] = lp
        return self.ranks.all_sum(out)

    def _token_stats(self, batch: Batch, mbs: list[torch.Tensor | None]) -> None:
        """π_old's logprobs, entropy and NEC [B, R] of every row (`response_token_stats`) into
        `batch`: this rank's micro-batches `mbs`, summed with the other ranks' rows."""
        if self.sp is not None:
            raise ValueError(
                "an advantage fn that reads token statistics (clipb, clipv) does not run with "
                "sequence parallelism here; set trainer.ulysses_sequence_parallel_size: 1"
            )
        outs = [torch.zeros_like(batch.rollout_logprobs, dtype=torch.float32) for _ in range(3)]
        for idx in mbs:
            mb = batch.select(idx) if idx is not None else idle_rows(batch, self.unit)
            stats = self.policy(
                response_token_stats,
                mb,
                self.config.trainer.logprob_chunk_size,
                share_prefix=self.share_prefix,
            )
            if idx is not None:
                for out, part in zip(outs, stats, strict=True):
                    out[idx, : part.shape[1]] = part
        batch.stats_logprobs, batch.entropy, batch.nec = (self.ranks.all_sum(o) for o in outs)

    def _token_budget(self) -> int | None:
        """Tokens per micro-batch (`max_token_len_per_gpu`); with sequence parallelism a rank
        holds 1/sp of each sequence, so a micro-batch takes sp times the budget (as verl)."""
        t = self.config.trainer
        if not t.use_dynamic_bsz or t.max_token_len_per_gpu is None:
            return None
        return t.max_token_len_per_gpu * self.ranks.sp

    # -- weights out -------------------------------------------------------------------------

    def sync_state(self) -> dict[str, torch.Tensor]:
        """The weights a sync publishes: every distinct tensor of the policy (a tied one once),
        or with LoRA only the adapter (`trainer.lora.adapter_state`; the engines merge it into
        their base, `models/lora_merge.py`). Sharded: gathered whole (a collective every rank
        calls; rank 0 holds the result, and with LoRA every rank)."""
        if self.lora is not None:
            return lora.adapter_state(self.model)
        if self.sharded:
            return full_state(self.model)
        return distinct_tensors(self.model.state_dict())

    def publish(self, method: str, step: int, sync_dir: Path) -> tuple[int, list[Any]]:
        """Publish the weights of `step` with sync method `method`'s trainer half: (bytes
        sent, the payload the synchronizer holds)."""
        from trinity.sync.method import state_nbytes, sync_method

        state = self.sync_state()
        return state_nbytes(state), sync_method(method).send(state, step, sync_dir)

    def save_checkpoint(
        self,
        root: Path,
        step: int,
        extra: dict[str, Any] | None = None,
        leases: list[int] | None = None,
    ) -> Path:
        """Weights plus the trainer state that resuming needs (`extra`: the caller's own;
        `leases`: the buffer leases trained since the last checkpoint).

        One process: `save_hf_checkpoint`, the optimizer state in `trainer_state.pt`. Sharded,
        every rank calls it (collectives): each writes its optimizer shards with DCP into
        `optimizer/` (loadable at any world size, one process included), rank 0 the gathered
        weights as the Hugging Face export, the trainer state and the seal."""
        keep = self.config.trainer.max_checkpoints_to_keep
        optimizer, scheduler = self._planned()
        state = {
            "step": step,
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "kl_coef": None if self.kl_ctrl is None else self.kl_ctrl.value,
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            **(extra or {}),
        }
        files = self.critic.save if self.critic is not None else None
        model, weights = self.model, None
        if self.lora is not None:  # the merged model as the HF export, the adapter beside it
            model, weights, files = lora.export(self.model, files, self.ranks.rank == 0)
        if not self.sharded:
            state["optimizer"] = optimizer.state_dict()
            return save_hf_checkpoint(
                model, self.tokenizer, root, step, keep, state, leases, files, weights
            )
        import torch.distributed as dist

        lead = self.ranks.rank == 0
        tmp = begin_checkpoint(root, step) if lead else temp_folder(root, step)
        dist.barrier()  # the folder exists, empty
        save_optimizer(self.model, optimizer, tmp, OPTIMIZER)
        if weights is None:
            weights = self.sync_state()
        state.update(files(tmp) if files is not None else {})  # every rank: collectives
        if lead:
            save_weights(model, tmp, weights)
            self.tokenizer.save_pretrained(tmp)
            torch.save(state, tmp / TRAINER_STATE)
            seal_checkpoint(root, step, tmp, keep, leases)
        dist.barrier()  # sealed: every rank's save returns a durable checkpoint
        return root / f"global_step_{step}"

    def resume(self, checkpoint: Path) -> dict[str, Any]:
        """Load weights, optimizer, scheduler and RNG states saved by `save_checkpoint`, at
        this trainer's world size whatever the saving one was.

        The model was built from the run's start model (so the reference model, if any, stays
        that one); the checkpoint's weights replace the policy's. Returns the saved state.
        """
        from trinity.sync.method import sync_method

        state = torch.load(checkpoint / TRAINER_STATE, weights_only=False)
        optimizer, scheduler = self._planned()
        if self.lora is not None:  # the base is the stage's start model, as built
            lora.load_adapter(self.model, checkpoint / lora.ADAPTER_DIR)
        elif self.sharded:  # rank 0 reads the export, every rank takes its shards
            lead = self.ranks.rank == 0
            load_full_state(
                self.model, sync_method("checkpoint").receive([str(checkpoint)]) if lead else {}
            )
        else:
            tensors = sync_method("checkpoint").receive([str(checkpoint)])
            load_weights(self.model, tensors, str(checkpoint))
            del tensors
        saved = state.get("optimizer")  # by one process; ranks write OPTIMIZER/ (DCP)
        restore_optimizer(self.model, optimizer, checkpoint, OPTIMIZER, saved, self.sharded)
        scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            self.critic.load(checkpoint, state)
        if self.kl_ctrl is not None and state.get("kl_coef") is not None:
            self.kl_ctrl.value = float(state["kl_coef"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.step = int(state["step"])
        return state


def enable_checkpointing(model: Any) -> None:
    """Hugging Face's gradient (activation) checkpointing of every decoder layer, non-reentrant
    (`activation_checkpointing_enable` from transformers 5.x on, the old name before)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def check_same_vocabulary(student: Any, teacher: Any, teacher_path: Any) -> None:
    """A teacher scores the student's token ids: both tokenizers must map text to the same ids."""
    if student.get_vocab() != teacher.get_vocab():
        raise ValueError(
            f"the teacher at {teacher_path} has another vocabulary than the student: its "
            "logprobs would score other tokens (on-policy distillation needs a shared tokenizer)"
        )


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = mask.sum()
    return float((x * mask).sum() / n) if n > 0 else 0.0
