"""The typed config schema, in Trinity-RFT's documented key layout (`buffer` in
`buffer_schema.py`). Every section is default-constructible; rules spanning sections live in
`checks.py`, so `TrinityConfig()` stays usable in tests.

Departure from Trinity-RFT: validation never fills in derived batch sizes or paths; those are
computed by `trinity.config.resolve()`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    create_model,
    field_validator,
)
from pydantic_core import PydanticCustomError

from trinity.config.base import ConfigSection, Dtype, Inside, NotApplicable, NotBuilt, Refused, TopK
from trinity.config.buffer_schema import BufferConfig
from trinity.config.engine_schema import InferenceModelConfig
from trinity.config.lora_schema import LoRAConfig
from trinity.config.problems import suggest
from trinity.config.side_schema import (
    DataProcessorConfig,
    ExternalModelConfig,
    LogConfig,
    ServiceConfig,
    TinkerConfig,
)

_LIMITS = NotApplicable("set from model.* (Trinity-RFT overwrites these on the rollout model too)")
_ROLLOUT_MODEL = {
    "model_path": NotApplicable("the rollout model is model.model_path (or the last stage's)"),
    "name": NotApplicable("names address auxiliary models; the rollout model is `model`"),
    "max_model_len": _LIMITS,
    "max_prompt_tokens": _LIMITS,
    "max_response_tokens": _LIMITS,
}


Beta = Annotated[float, Field(ge=0, lt=1)]


class OptimizerConfig(ConfigSection):
    """Optimizer and learning-rate schedule of the trainer."""

    renamed_keys: ClassVar[dict[str, str]] = {"warmup_style": "lr_scheduler_type"}

    lr: float = Field(1e-6, ge=0)
    """Peak learning rate."""
    lr_warmup_steps: int = Field(-1, ge=-1)
    """Warm-up length in train steps; -1 = use lr_warmup_steps_ratio."""
    lr_warmup_steps_ratio: float = Field(0.0, ge=0, le=1)
    """Warm-up length as a fraction of the total train steps."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Final learning rate as a fraction of lr (cosine/linear)."""
    lr_scheduler_type: Literal["constant", "cosine", "linear"] = "constant"
    """Schedule after warm-up: constant, cosine or linear decay (was warmup_style)."""
    optimizer_type: Annotated[
        Literal["adam", "adamw"],
        NotApplicable("always AdamW here ('adam' and 'adamw' both name it)"),
    ] = "adamw"
    """Optimizer; 'adam' (Trinity-RFT's name) and 'adamw' both mean AdamW with decoupled
    weight_decay."""
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    """Adam β1, β2."""
    weight_decay: float = Field(0.01, ge=0)
    """Decoupled weight decay."""
    clip_grad: float = Field(1.0, gt=0)
    """Max global gradient norm (trainer.grad_clip overrides it)."""
    state_dtype: Literal["float32", "bfloat16"] = "float32"
    """dtype of AdamW's two moments (our extension): bfloat16 halves the optimizer's memory
    (the update is still computed in float32; the second moment is rounded stochastically,
    trinity/trainer/bf16_adamw.py). Resume with the state_dtype a checkpoint was saved with."""


LossAggMode = Literal[
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]


class RolloutCorrectionConfig(ConfigSection):
    """Off-policy correction against the engine's logprobs (verl's `algorithm.rollout_correction`
    names): truncated importance weights and/or a rejection mask (`trinity/algorithm/correction.py`).
    Either one makes the trainer recompute π_old before the update (decoupled PPO)."""

    rollout_is: Literal["token", "sequence"] | None = None
    """Truncated importance weight π_old/μ per token or per sequence (the product of its tokens'
    ratios), multiplied into the advantages; None = off."""
    rollout_is_threshold: float = Field(2.0, gt=0)
    """Upper truncation C of the importance weight."""
    rollout_rs: Literal["token", "sequence", "geometric"] | None = None
    """Reject (drop from training) tokens, or whole sequences by their product or geometric-mean
    ratio, whose weight lies outside the thresholds; None = off."""
    rollout_rs_threshold: float = Field(2.0, ge=1)
    """Upper bound of the kept importance weights."""
    rollout_rs_threshold_lower: float | None = Field(None, ge=0, le=1)
    """Lower bound; None = 1 / rollout_rs_threshold."""

    @property
    def enabled(self) -> bool:
        return self.rollout_is is not None or self.rollout_rs is not None


class KLControlConfig(ConfigSection):
    """The KL reward penalty's coefficient over training (verl's `algorithm.kl_ctrl`); the
    starting value is `kl_penalty_fn_args.kl_coef`."""

    type: Literal["fixed", "adaptive"] = "fixed"
    """'fixed' keeps kl_coef; 'adaptive' steers the measured KL to target_kl."""
    target_kl: float = Field(0.1, gt=0)
    """The KL per token the controller aims at."""
    horizon: int = Field(10000, ge=1)
    """Samples over which β may change by the full ±20% step."""


class FilterGroupsConfig(ConfigSection):
    """DAPO's dynamic sampling (verl's `algorithm.filter_groups`): the explorer drops tasks whose
    samples all got the same reward and runs more tasks until the step is full."""

    enable: bool | None = None
    """Drop all-equal groups and refill; None = the algorithm's default."""
    max_num_gen_batches: int = Field(10, ge=1)
    """Tasks tried per step at most this many times batch_size; then the step is filled with dropped
    groups (rollout/filter_exhausted)."""


class OverlongPenaltyConfig(ConfigSection):
    """DAPO's soft overlong punishment (verl's `reward_model.overlong_buffer`): a length
    penalty added to the reward of responses that enter the last `buffer_len` tokens."""

    enable: bool | None = None
    """None = the algorithm's default."""
    buffer_len: int | None = Field(None, ge=1)
    """L_cache in tokens; None = a fifth of model.max_response_tokens (DAPO's 4096 of 20480)."""
    penalty_factor: float = Field(1.0, ge=0)
    """The penalty at the full length."""


class AlgorithmConfig(ConfigSection):
    """Which RL algorithm runs, and the pieces (advantage, losses, sampling) it is made of."""

    algorithm_type: str = "grpo"
    """Algorithm registry name, e.g. grpo, ppo, dpo, sft."""
    repeat_times: int = Field(1, ge=1)
    """Samples (rollouts) per task (unit: experiences per task)."""
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    """Optimizer and learning-rate schedule."""
    advantage_fn: str | None = None
    """Advantage function; None = the algorithm's default."""
    advantage_fn_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the advantage function."""
    policy_loss_fn: str | None = None
    """Policy loss; None = the algorithm's default."""
    policy_loss_fn_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the policy loss, e.g. clip_range, clip_range_low, clip_range_high (each
    > 0)."""
    kl_penalty_fn: str | None = None
    """KL penalty folded into the reward; None = the algorithm's default."""
    kl_penalty_fn_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the KL penalty."""
    kl_loss_fn: str | None = None
    """KL term added to the loss; None = the algorithm's default."""
    kl_loss_fn_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the KL loss, e.g. kl_coef."""
    entropy_loss_fn: str | None = None
    """Entropy bonus; None = the algorithm's default."""
    entropy_loss_fn_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the entropy loss, e.g. entropy_coef."""
    sample_strategy: str | None = None
    """How train batches are drawn from buffers; None = the default."""
    sample_strategy_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the sample strategy."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How per-token losses become one number: mean over all tokens, or per sequence (sum or mean
    over tokens) then mean over sequences."""
    kl_ctrl: KLControlConfig = Field(default_factory=KLControlConfig)
    """Fixed or adaptive coefficient of the KL reward penalty."""
    filter_groups: FilterGroupsConfig = Field(default_factory=FilterGroupsConfig)
    """Dynamic sampling: drop all-equal groups and refill (DAPO)."""
    overlong_penalty: OverlongPenaltyConfig = Field(default_factory=OverlongPenaltyConfig)
    """Soft overlong punishment on the reward (DAPO)."""
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)
    """Off-policy correction against the engine's logprobs (truncated or masked importance
    sampling); off by default."""


class ModelConfig(ConfigSection):
    """The policy model and its default sampling and length settings."""

    model_path: str = ""
    """Local path or hub id of the policy model (required)."""
    critic_model_path: str = ""
    """Path of the critic model (PPO); empty = same as model_path."""
    max_model_len: int | None = Field(None, ge=1)
    """Maximum prompt + response length in tokens."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Prompts longer than this many tokens are truncated."""
    max_response_tokens: int | None = Field(None, ge=1)
    """Maximum generated tokens per response."""
    temperature: float = Field(1.0, ge=0)
    """Default sampling temperature (≥ 0)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Default nucleus-sampling mass in (0, 1]."""
    top_k: TopK = -1
    """Default top-k cutoff in tokens; -1 = off."""
    custom_chat_template: str | None = None
    """Jinja chat template replacing the tokenizer's; None = tokenizer's."""
    lora_configs: list[LoRAConfig] | None = None
    """LoRA adapters of the policy (one at most): only the adapter trains and is synced, the
    base weights stay frozen (docs/lora.md); None = every weight trains."""
    fully_sharded_loras: Annotated[bool, NotApplicable("vLLM's sharding of LoRA layers")] = False
    """vLLM: shard the LoRA computation over tensor-parallel ranks."""
    max_cpu_loras: Annotated[int | None, NotApplicable("vLLM's CPU cache of LoRA adapters")] = None
    """vLLM: adapters kept in CPU memory."""
    enable_thinking: bool | None = None
    """Chat-template switch of reasoning models (Qwen3): true/false is passed to the template as
    enable_thinking; None = the template's own default."""
    enable_prompt_truncation: bool = True
    """A rollout prompt longer than max_prompt_tokens is cut to it and not sampled: its
    experiences train nothing (zero action mask, counted in rollout/prompt_truncated). false =
    prompts are sent whole; one with no room under max_model_len fails its own task."""
    logprobs: int = Field(0, ge=0)
    """Top alternatives per response token that the engine returns (the k most likely tokens
    of the raw policy and their logprobs, `Experience.topk_ids` / `topk_logprobs`); 0 = none.
    A taskset's `rollout_args.logprobs` overrides it."""
    external_model: ExternalModelConfig = Field(default_factory=ExternalModelConfig)
    """An OpenAI-compatible endpoint benchmarked instead of local engines (mode bench)."""
    tinker: Annotated[TinkerConfig, NotBuilt("the Tinker training backend")] = Field(
        default_factory=TinkerConfig
    )
    """Tinker (remote training service) backend."""


class ClusterConfig(ConfigSection):
    """The Ray cluster the run uses."""

    ray_address: str = "auto"
    """Ray address; 'auto' joins a running cluster or starts a local one (a one-process run with
    nothing else on Ray starts none), 'local' always starts a local one."""
    node_num: int | None = Field(None, ge=1)
    """Ray nodes the run spreads over (it waits for them): trainer on the first, engine i on node i
    mod N; None or 1 = one node."""
    gpu_per_node: int | None = Field(None, ge=0)
    """GPUs the run may use on the node; None = every GPU the Ray cluster has."""
    one_process: bool | None = None
    """A run on one machine's CPUs in one process: the explorer (its rollout engines on threads
    of its own, as `explorer.rollout_model.in_explorer_process`), the trainer, the buffer, the
    synchronizer and the metrics hub are objects of the run's one `ServiceHost` instead of a Ray
    actor each, so torch and transformers are loaded once (a laptop's lean run;
    trinity/common/service_host.py). Where nothing else in the run needs Ray, no Ray instance is
    started at all (the host runs on a thread of `trinity run`: trinity/common/local_host.py). Mode both, train and
    bench; not with `synchronizer.sync_method: nccl`, several nodes or GPUs. None = chosen by
    the run's plan: true where every stage can run so (one CPU-only node, no split processes),
    printed with the reason (trinity/launcher/plan.py); false keeps a process per part."""
    colocate: bool | None = None
    """Trainer and rollout engines share one device and take turns on it: the engines sleep
    (their weights offloaded to host memory, their caches freed) while the trainer steps, and
    the trainer offloads its parameters, gradients and optimizer state while they sample;
    weights go by `memory` (trinity/common/turns.py, docs/scale_out.md). None = chosen by the
    run's plan: on where the cluster has exactly one GPU on one node and a stage both trains and
    samples, as Trinity-RFT does (`mode: colocate` reads as mode both with this on); true asks
    for it anywhere (on CPUs too: the two sides then never compute at once); false = off."""


class MalformedToolCallsConfig(ConfigSection):
    """What training does with a reply that tried to call a tool and did not parse (the
    endpoint's `tool_call_parser`: bad JSON, no name, an unclosed tag). Every parse is counted
    (`rollout/ledger_tool_calls_ok`, `rollout/ledger_tool_calls_malformed`) and kept on the
    experience (`info["tool_calls"]`, one status per turn), whatever the policy."""

    policy: Literal["keep", "mask", "penalize"] = "keep"
    """'keep' = train on the reply as sampled; 'mask' = its tokens get action mask 0 (the rest of
    the trajectory is still trained); 'penalize' = `penalty` is added to its experience's
    reward once per malformed reply."""
    penalty: float | None = None
    """Policy 'penalize': added to the reward per malformed reply; None = -1.0 there (set only
    with that policy)."""


class ExplorerConfig(ConfigSection):
    """The explorer: runs workflows on tasks to produce experiences."""

    name: str = "explorer"
    """This explorer's name in its run: its actor (`<stage>/explorer/<name>`), its cursor and
    writer registration in the buffer, its experiences' ids (groups of two explorers never
    mix) and its metrics file (`metrics.explorer-<name>.jsonl`). Give each explore process of a
    run its own."""
    runner_per_model: int = Field(8, ge=1)
    """Concurrent workflow runners per engine replica."""
    max_timeout: float = Field(900, gt=0)
    """Seconds one workflow run may take."""
    max_retry_times: int = Field(2, ge=0)
    """Retries of a failed or timed-out workflow run."""
    max_failure_fraction: float = Field(0.25, ge=0, le=1)
    """A task that fails every try is dropped and counted; an explore step or evaluation in which
    more than this fraction of tasks failed ends the run with the first failure's traceback (0 =
    any failure does)."""
    eval_interval: int = Field(100, ge=0)
    """Evaluate every this many explore steps; 0 = never."""
    eval_on_startup: bool = True
    """Evaluate before the first explore step."""
    rollout_model: Annotated[InferenceModelConfig, Inside(_ROLLOUT_MODEL)] = Field(
        default_factory=InferenceModelConfig
    )
    """Engines serving the policy."""
    auxiliary_models: list[InferenceModelConfig] = Field(default_factory=list)
    """Extra engine pools (e.g. a judge) served to workflows, by position or `name`
    (`model.auxiliary(0)`, `model.auxiliary("judge")`); their calls are not trained. Each
    replica counts as an engine in the core shares. Under an algorithm whose teacher is
    auxiliary_models[0] (on_policy_distill) that one is the trainer's and is not served."""
    env_vars: dict[str, str] = Field(default_factory=dict)
    """Environment variables set where workflows run: the explorer's process, through its Ray
    runtime_env (the engines, the trainer and the services do not get them); in the one-process
    layout the run's one process, from the explorer's start (`explorer/workflow_env.py`)."""
    max_repeat_times_per_runner: Annotated[
        int | None,
        NotApplicable(
            "all samples of a task run in one workflow call here; splitting them over runners changes scheduling, not results"
        ),
    ] = Field(None, ge=1)
    """Split a task's repeat_times samples over runners, at most this many per runner; None = all
    samples of a task in one runner."""
    bench_on_latest_checkpoint: bool = False
    """Mode 'bench': evaluate only the latest checkpoint."""
    bench_checkpoints: str | list[int] = "all"
    """Ours. Mode 'bench': which checkpoints to evaluate: 'all', 'latest', 'every:N' (those whose
    run-wide step is a multiple of N, and the latest), or a list of run-wide steps (0 = the base
    model, `model.model_path`; the others must have a checkpoint). `bench_on_latest_checkpoint:
    true` is 'latest' (docs/evaluation.md)."""

    @field_validator("bench_checkpoints")
    @classmethod
    def _checkpoint_choice(cls, value: str | list[int]) -> str | list[int]:
        if isinstance(value, list):
            if not value or any(s < 0 for s in value):
                raise ValueError("a list of checkpoints names one or more steps >= 0")
            return value
        every = value.removeprefix("every:")
        if value in ("all", "latest") or (every != value and every.isdigit() and int(every) > 0):
            return value
        raise ValueError(
            f"{value!r}: expected 'all', 'latest', 'every:N' (N > 0) or a list of steps"
        )

    api_port: int = Field(8010, ge=0, le=65535)
    """Mode 'serve': the endpoint's port (0 = any free port, printed at start)."""
    listen_address: str = "127.0.0.1"
    """Mode 'serve': the address the endpoint binds (Trinity-RFT's default is 0.0.0.0; here only
    this machine, unless set)."""
    api_key: str | None = None
    """Mode 'serve': the key clients must send (`Authorization: Bearer <key>`); None = none."""
    feedback_window: float = Field(600.0, gt=0)
    """Mode 'serve': seconds after its commit a session waits for its rewards before it is
    dropped (counted in serve/expired)."""
    service_status_check_interval: float = Field(60, gt=0)
    """Mode 'serve': seconds between checks for newer trained weights."""
    min_running_model_num: Annotated[
        int, NotApplicable("a crashed engine is restarted by Ray (rollout_model.max_restarts)")
    ] = Field(1, ge=1)
    """Mode 'serve': engines kept running at least."""
    malformed_tool_calls: MalformedToolCallsConfig = Field(default_factory=MalformedToolCallsConfig)
    """Replies whose tool call did not parse: kept, masked or penalised in training."""


class SynchronizerConfig(ConfigSection):
    """How and when trained weights reach the explorer."""

    renamed_values: ClassVar[dict[str, dict[str, str]]] = {
        "sync_method": {"online": "nccl", "offline": "checkpoint"},
        "sync_style": {
            "dynamic_by_explorer": "explorer_driven",
            "dynamic_by_trainer": "trainer_driven",
        },
    }

    sync_method: Literal["checkpoint", "memory", "nccl", "shared"] | None = None
    """'checkpoint' = via files on disk; 'memory' = via the Ray object store; 'nccl' = a collective
    broadcast (gloo on CPU; mode both only, checkpoint otherwise); 'shared' = the engines use the
    trainer's own weights in shared memory, one copy on the machine (mode both only, checkpoint
    otherwise; one node, CPU, sync_style fixed, sync_interval 1, sync_offset 0); None = the best
    available here ('memory'; 'shared' for a strictly on-policy `cluster.one_process` run; see
    resolve())."""
    sync_style: Literal["fixed", "explorer_driven", "trainer_driven"] = "fixed"
    """'fixed' = every sync_interval steps; 'explorer_driven' / 'trainer_driven' = when that side
    asks (were dynamic_by_explorer / dynamic_by_trainer)."""
    sync_interval: int = Field(1, ge=1)
    """Train steps between weight syncs (unit: train steps)."""
    sync_offset: int = Field(0, ge=0)
    """Explore steps the explorer runs ahead of the trainer (staleness)."""
    sync_timeout: float = Field(3600, gt=0)
    """Seconds to wait for a weight sync."""


class CriticConfig(ConfigSection):
    """PPO's value model (`algorithm_type: ppo`; trinity/trainer/critic.py)."""

    optimizer: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(lr=1e-5))
    """The critic's own AdamW and lr schedule (verl's critic.optim)."""
    cliprange_value: float = Field(0.5, gt=0)
    """Clip of the value update around the values the advantages used."""
    warmup_steps: int = Field(0, ge=0)
    """First train steps that update only the critic (verl's trainer.critic_warmup)."""


class TrainerConfig(ConfigSection):
    """The trainer: turns experiences into gradient steps."""

    name: Annotated[
        str, NotApplicable("a run has one trainer, named by its role (`<stage>/trainer`)")
    ] = "trainer"
    """Actor name."""
    trainer_type: Annotated[
        Literal["verl", "tinker"] | None,
        NotApplicable(
            "the built-in PyTorch trainer trains, not verl; the trainer_config keys that mean something here are read"
        ),
        Refused(("tinker",), "the Tinker training backend"),
    ] = None
    """Trinity-RFT's training backend: 'verl' or 'tinker' (a remote service); None = the built-in
    PyTorch trainer. Not the same key as trainer_strategy."""
    trainer_strategy: Literal["torch", "fsdp", "fsdp2"] | None = None
    """'torch' = one process on one device; 'fsdp2' = `world_size` processes (Ray actors in a
    placement group), the models' parameters, gradients and optimizer state sharded over them
    with PyTorch FSDP2 and the batch split between them (trinity/trainer/ranks.py); 'fsdp'
    (verl's FSDP1) is sharded by FSDP2 here too; None = 'torch' (see resolve())."""
    world_size: int | None = Field(None, ge=1)
    """Ranks of a sharded trainer (`trainer_strategy: fsdp2`; unit: processes, one GPU each on
    GPUs). None = the GPUs the cluster has beyond the rollout engines' (node_num × gpu_per_node
    − engine_num × tensor_parallel_size, Trinity-RFT's rule) when `cluster.gpu_per_node` is set,
    else 1. Each rank takes an equal part of the trainer's cores."""
    ulysses_sequence_parallel_size: int = Field(1, ge=1)
    """Ranks one sequence is split over (DeepSpeed-Ulysses sequence parallelism; unit: ranks;
    1 = off): a sharded trainer's `world_size` ranks form world_size / this data-parallel
    groups, whose ranks take the same rows, each a contiguous slice of every sequence, and
    exchange attention heads by all-to-all (trinity/trainer/sequence_parallel.py). Must divide
    `world_size` and the model's attention and key/value heads. Unset trainer_strategy becomes
    fsdp2, unset world_size this many ranks."""
    trainer_config: dict[str, Any] = Field(default_factory=dict)
    """An inline verl config tree (actor_rollout_ref, critic, trainer, ...); the keys that mean
    something here map to our fields (see compat.py)."""
    enable_preview: Annotated[
        bool, NotApplicable("tables of sample rollouts are not sent to the monitors here")
    ] = True
    """Show sample rollouts in the wandb monitor."""
    save_interval: int | None = Field(None, ge=0)
    """Checkpoint (and ack the buffer) every this many train steps; None = a tenth of the run,
    ceil(total_steps / 10), so a crash costs at most a tenth of it; 0 = only at the end (Trinity-
    RFT's default)."""
    total_steps: int | None = Field(None, ge=1)
    """Train steps to run; None = buffer.total_steps or derived."""
    grad_clip: float | None = Field(None, gt=0)
    """Max gradient norm; overrides algorithm.optimizer.clip_grad."""
    micro_batch_size_per_gpu: int = Field(8, ge=1)
    """Experiences per forward/backward pass per GPU (unit: experiences); ignored when
    use_dynamic_bsz packs by tokens."""
    use_dynamic_bsz: bool = True
    """Pack micro-batches by token count (max_token_len_per_gpu) instead of a fixed number of
    experiences."""
    max_token_len_per_gpu: int | None = Field(None, ge=1)
    """Token budget per micro-batch per GPU (unit: tokens) when use_dynamic_bsz."""
    max_checkpoints_to_keep: int | None = Field(None, ge=1)
    """Delete older checkpoints beyond this many; None = keep all."""
    dtype: Dtype = "auto"
    """Training dtype of the weights."""
    num_threads: int | None = Field(None, ge=1)
    """torch CPU threads of the trainer; None = its share of the free cores
    (trinity.common.resources)."""
    logprob_chunk_size: int = Field(256, ge=1)
    """Tokens whose logits are materialised at once (unit: tokens). Plain autograd keeps each
    chunk's logits for backward (two or three copies of response tokens × vocabulary × 4 bytes);
    with `lean_lm_head` none are kept and the transient is about 3 × logprob_chunk_size ×
    vocabulary × 4 bytes."""
    lean_lm_head: bool = False
    """Keep no logits for backward: recompute each chunk's in backward and apply the gradients of
    log p and of the entropy in closed form (trinity/models/lean_head.py). Values and gradients
    equal plain autograd; saves most of the LM head's memory on large vocabularies for one more
    head matmul per chunk. Off by default (docs/real_model.md says why)."""
    share_prompt_prefix: bool = True
    """Run the backbone once per distinct prompt of a micro-batch, not once per sample (GRPO's n
    samples of a task share their prompt): its KV cache is gathered to the samples, whose
    responses attend to it (trinity/trainer/prefix.py). Logprobs and gradients equal one pass up
    to float rounding; used where it cuts a tenth of the positions or more, never under gradient
    checkpointing nor in a sharded trainer (FSDP2 frees a layer's gathered weights after each of
    its calls). False: one pass over every row's whole sequence."""
    malloc_mmap_threshold_mb: int | None = Field(None, ge=1, le=32)
    """Fix glibc's mmap threshold in the trainer's process (unit: MiB): every allocation at least
    this large gets its own pages and returns them to the OS when freed, instead of glibc's
    threshold that rises to 32 MiB and leaves a step's freed tensors as heap holes. Lower peak
    memory per train step (SmolLM2 micro-batch: 2.46 -> 2.12 GB with 1) for more page faults
    (steps 10-15% longer on CPU). None: glibc's default. Linux (glibc) only."""
    release_heap_after_step: bool | None = None
    """Hand the C heap's free pages back to the OS once the trainer has idled 0.5 s after a train
    step (glibc `malloc_trim`, `common.memory.IdleTrim`): the steps' freed transients become
    memory the engines can use while the trainer waits for its next batch (an on-policy run
    generates then), for the page faults of taking them back in the next step. Back-to-back
    steps (batches ready) never trim; a trim after every step cost them 0.13 s of a 0.57 s step
    (tiny 1m model, `benchmarks/bench_throughput.py`). False: the trainer keeps its heap
    (more resident memory). None: true, except with `cluster.one_process`, where the engines
    reuse the trainer's freed heap in the same process without a trim (and the trainer theirs).
    Linux (glibc) only: a no-op elsewhere."""
    enable_gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them (Hugging
    Face's gradient checkpointing, non-reentrant): far less memory per micro-batch, about a third
    more compute. verl's `actor_rollout_ref.model.enable_gradient_checkpointing` sets it."""
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each train batch; > 1 recomputes old logprobs first."""
    ppo_mini_batch_size: int | None = Field(None, ge=1)
    """Experiences per optimizer update inside a train step (None = the whole train batch, one
    update per step)."""
    critic: CriticConfig = Field(default_factory=CriticConfig)
    """PPO's value model (algorithm_type ppo)."""


MonitorType = Literal["tensorboard", "jsonl", "console", "wandb", "mlflow", "swanlab"]
_MONITOR_TYPES: tuple[str, ...] = get_args(MonitorType)


class MonitorConfig(ConfigSection):
    """Where metrics go, besides `metrics.jsonl` and the console (always on). Backends write
    under the run folder and need no network (docs/monitoring.md)."""

    monitor_type: MonitorType | list[MonitorType] = Field(
        "tensorboard", description=f"One backend or a list of them: {', '.join(_MONITOR_TYPES)}."
    )
    monitor_args: dict[str, Any] | None = Field(default_factory=dict)
    """The backends' arguments, one dict for all (e.g. mlflow's `uri`, swanlab's `mode`); each
    key is checked against the backends in use (`trinity.monitor.backends`)."""
    enable_console: Annotated[bool, NotApplicable("not read here; use monitor_type console")] = True
    """Also print a metrics line per step."""
    enable_ray_timeline: bool = False
    """Write Ray's timeline of every task and actor call to `<run_dir>/timeline.json`
    (`timeline.<part>.json` for one process of a split run) when the run ends; open it in
    chrome://tracing or Perfetto."""
    detailed_stats: bool = False
    """Also report the spread over an eval set's tasks of each per-task mean (accuracy, reward,
    response length): `eval/<set>/<metric>/std`, `/min`, `/max` (docs/evaluation.md)."""
    cache_dir: Annotated[
        str, NotApplicable("set by Trinity-RFT itself; outputs go to the run folder here")
    ] = ""
    """Trinity-RFT's folder of monitor outputs (`<run>/monitor`)."""
    collapse_threshold: float = Field(0.25, ge=0, le=1)
    """Ours: warn (console and `collapse/warning`) when fewer than this share of each task's
    samples are distinct for `collapse_patience` explore steps in a row; 0 = no warning."""
    collapse_patience: int = Field(3, ge=1)
    """Ours: consecutive low-diversity explore steps before the collapse warning."""
    stall_timeout: float | None = Field(None, ge=0)
    """Ours: seconds without progress anywhere in the run before the stall doctor reports which
    part waits on which and dumps every process's stacks (docs/monitoring.md). Unset:
    automatic, 10 minutes or 10 times the slowest step seen, whichever is longer; 0: off."""
    on_stall: Literal["warn", "fail"] = "warn"
    """Ours: after a stall report, `warn` keeps waiting (and reports again after another
    timeout without progress); `fail` ends the run with exit 1."""

    @field_validator("monitor_type", mode="wrap")
    @classmethod
    def _one_clear_error(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """Replace pydantic's two union-branch errors by one message with a suggestion."""
        try:
            return handler(value)
        except ValidationError:
            values = value if isinstance(value, list) else [value]
            bad = next((v for v in values if v not in _MONITOR_TYPES), value)
            raise PydanticCustomError(
                "literal_error",
                "{bad} is not allowed; expected one of: {allowed}, or a list of them",
                {
                    "bad": repr(bad),
                    "allowed": ", ".join(repr(t) for t in _MONITOR_TYPES),
                    "did_you_mean": suggest(str(bad), _MONITOR_TYPES),
                },
            ) from None


Mode = Literal["both", "explore", "train", "bench", "serve"]


class TrinityConfig(ConfigSection):
    """A whole run. Everything it writes lives under `<checkpoint_root_dir>/<project>/<name>/`."""

    mode: Mode = "both"
    """'both' = explorer and trainer together; 'explore' / 'train' = one side; 'bench' = evaluate
    only; 'serve' = the OpenAI-compatible endpoint for external agents, their rewarded sessions
    written to the buffer a 'train' process reads. Trinity-RFT's 'colocate' is read as 'both'
    with `cluster.colocate: true` (one device shared by turns)."""
    project: str = "trinity"
    """Project name (a folder under checkpoints)."""
    group: str = ""
    """Run group: part of the run's Ray namespace (`trinity:<project>/<group>/<name>`), so the
    processes of a run find each other by name and runs of other groups never share actors."""
    name: str = "run"
    """Run name (a folder under the project)."""
    checkpoint_root_dir: str = "./checkpoints"
    """Root folder of everything runs write."""
    continue_from_checkpoint: bool = False
    """true: resume the run in the run folder (trainer, explorers, buffer); false: a folder in use
    gives this run a fresh <name>_<timestamp>."""
    seed: int = 42
    """Global random seed: tiny:// model init, engine sampling, task selectors, synthetic generators
    and the trainer, unless a section sets its own."""
    stage_name: str = ""
    """Set on the per-stage configs returned by stage_configs(); not for users."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """Algorithm."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """Policy model."""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """Ray cluster."""
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    """Data and batches."""
    explorer: ExplorerConfig = Field(default_factory=ExplorerConfig)
    """Explorer."""
    synchronizer: SynchronizerConfig = Field(default_factory=SynchronizerConfig)
    """Weight synchronisation."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """Trainer."""
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    """Metrics."""
    data_processor: DataProcessorConfig = Field(default_factory=DataProcessorConfig)
    """Task and experience pipelines."""
    service: ServiceConfig = Field(default_factory=ServiceConfig)
    """Outside services (Data-Juicer)."""
    log: Annotated[
        LogConfig,
        NotApplicable("log files and levels are not configurable here; output goes to the console"),
    ] = Field(default_factory=LogConfig)
    """Logging."""
    schema_type: Annotated[
        str | None, NotApplicable("the experience schema follows algorithm.algorithm_type")
    ] = None
    """Experience schema of the run (e.g. 'experience', 'dpo', 'sft'); None = the algorithm's own."""
    stages: list[StageConfig] = Field(default_factory=list)
    """Stages run in order, each a deep-merged override of this config, each starting from the
    previous stage's model."""

    _rename_notes: tuple[str, ...] = PrivateAttr(default=())
    """Set at load: a line per deprecated key or value the file used (read as its new name)."""
    _compat_notes: tuple[str, ...] = PrivateAttr(default=())
    """Set at load: a line per Trinity-RFT value the effective config leaves out."""
    _written: dict[str, Any] | None = PrivateAttr(default=None)

    @property
    def written(self) -> dict[str, Any]:
        """What stages merge onto: the config as written (renames applied, verl keys not
        lifted); without a source file, the explicitly set values."""
        return self.model_dump(exclude_unset=True) if self._written is None else self._written


StageConfig = create_model(  # derived from TrinityConfig: one field per overridable key
    "StageConfig",
    __base__=ConfigSection,
    __doc__="One stage of a multi-stage run: a name plus overrides deep-merged onto the base "
    "config. Values are kept raw here; the merged config is validated as a whole "
    "(`loader.py`, step 8).",
    stage_name=(str, Field(..., min_length=1, description="Name of the stage (required).")),
    **{
        name: (Any, Field(None, description=f"Override deep-merged onto the top-level `{name}`."))
        for name in TrinityConfig.model_fields
        if name not in ("stages", "stage_name")
    },
)
TrinityConfig.model_rebuild()
