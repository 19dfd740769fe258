"""Rollout engine on Hugging Face transformers: batched sampling with per-token logprobs.

Any transformers causal LM (the portable path; vLLM is the GPU path where installed), driven by our
own decode loop rather than `model.generate`, for what RL rollouts need:
- each distinct prompt is prefilled once and its KV cache fanned out to the `n` samples
  (`generate` would prefill every copy: n times the prompt compute for GRPO's groups);
- rows that sampled eos leave the batch at once, so long and short answers don't pay for each other;
- the logprob of every sampled token is taken at each step, never keeping [B, R, V] logits;
- sampling (temperature, top-k, top-p; `sampling.py`) is keyed: a request's key, hashed with its
  sample index and the decode step, gives each draw, so a request samples the same tokens whatever
  shares its batch; requests without a key get one from the engine's seeded generator.
It also returns the exact sampled ids, a finish reason, and the `model_version` that
`update_weights` bumps. Greedy output equals `model.generate`'s (tested).

Logprobs are those of the raw policy, log_softmax(logits) at temperature 1, whatever the sampling
temperature/top-p/top-k: that is the distribution the trainer recomputes, so the two can be compared
token for token (`rollout/logprob_diff`). With `SamplingParams.logprobs` = k > 0 each sample also
carries, per token, the k most likely tokens of that distribution and their logprobs (`top_ids`,
`top_logprobs`; vLLM's `logprobs=k`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import time
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from trinity.common.core_shares import core_shares
from trinity.common.lazy import import_now, lazy_module
from trinity.common.memory import IdleTrim
from trinity.common.rollout import (
    ENGINE,
    BadPrompt,
    Peers,
    Progress,
    PromptTooLong,
    Sample,
    SamplingParams,
)
from trinity.common.startup import StartupMarks
from trinity.explorer.detokenize import RowTexts
from trinity.models import load_model, load_tokenizer, offload, resolve_model_path
from trinity.models.basics import resolve_dtype
from trinity.models.forward import cache_kwarg
from trinity.models.loading import load_weights
from trinity.sync.method import sync_method

# torch and the modules built on it load in the engine's process when it is made: the driver
# imports this module only to start engines (`common.lazy`)
if TYPE_CHECKING:
    import torch
    import transformers

    from trinity.explorer import sampling
    from trinity.models import lean_decode as decoders
    from trinity.models import lean_head
    from trinity.models.tensor_parallel import TensorParallel, TPPlace
else:
    torch = lazy_module("torch")
    transformers = lazy_module("transformers")
    sampling = lazy_module("trinity.explorer.sampling")
    lean_head = lazy_module("trinity.models.lean_head")
    decoders = lazy_module("trinity.models.lean_decode")

F = TypeVar("F", bound=Callable[..., Any])


def _inference_mode(fn: F) -> F:
    """`torch.inference_mode()` as a decorator that imports torch on the first call. A
    generator runs each of its steps in inference mode, and the code it yields to does not
    (torch's own decorator, made on the first call)."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def steps(*args: Any, **kwargs: Any) -> Any:
            return torch.inference_mode()(fn)(*args, **kwargs)

        return steps  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.inference_mode():
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


__all__ = ["HFRolloutEngine", "PromptTooLong", "Sample", "SamplingParams"]

SCORE_CHUNK = 512  # tokens whose logits `logprobs()` holds at once


@ENGINE.register("transformers")
class HFRolloutEngine:
    """Batched generation on one transformers model. Thread-compatible, not thread-safe."""

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
        trim_when_idle: bool = True,
        lean_decode: bool = True,
        lend_cores: bool = False,
        tensor_parallel: TPPlace | None = None,
    ) -> None:
        """`trim_when_idle`: give the KV cache's freed heap back to the OS once the engine
        idles (`common.memory.IdleTrim`); False where the process's other user of the heap
        reuses it (a trainer in the same process, `cluster.one_process`). `lean_decode`: decode
        Llama-layout models with `models.lean_decode.LeanDecoder` (False: the model's own
        forward for every family, `HFDecoder`). `lend_cores`: the engine's threads are a part of
        its process's cores that it lends while idle and that grows by idle parts while it
        samples (`common.core_shares`; a one-process run whose sides overlap).
        `tensor_parallel`: this process's rank of a tensor-parallel engine (`tp_engine.py`):
        it joins the ranks' process group, keeps its slices of the decoder layers
        (`models.tensor_parallel`) and samples the tokens rank 0 draws."""
        import_now(torch, transformers, sampling, lean_head, decoders)  # before the `imports` mark

        self.startup = StartupMarks("engine")  # its process start, its imports done
        # Ray sets OMP_NUM_THREADS to the CPUs an actor reserves: choose explicitly
        threads = num_threads or os.cpu_count() or 1
        torch.set_num_threads(threads)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tp: TensorParallel | None = None
        if tensor_parallel is not None:
            from trinity.models.tensor_parallel import TensorParallel

            self.tp = TensorParallel.join(tensor_parallel)
        path = resolve_model_path(model_path)
        self.tokenizer = load_tokenizer(path, custom_chat_template=custom_chat_template)
        if self.tp is None:
            self.model = load_model(path, dtype=dtype, device=self.device)
        else:  # loaded whole on CPU (in the device's dtype), then its slices go to the device
            dtype = str(resolve_dtype(dtype, self.device)).removeprefix("torch.")
            self.model = self.tp.parallelize(load_model(path, dtype=dtype)).to(self.device)
        self.model.requires_grad_(False)
        self.cache_kw = cache_kwarg(self.model)
        self.lean_decode = lean_decode
        self.cores = core_shares().join(threads) if lend_cores else None
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len
        self.model_version = 0
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        torch.manual_seed(seed)
        gen_cfg = self.model.generation_config
        eos = gen_cfg.eos_token_id if gen_cfg.eos_token_id is not None else []
        self.eos_ids: set[int] = set(eos if isinstance(eos, list) else [eos])
        if self.tokenizer.eos_token_id is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else next(iter(self.eos_ids))
        )
        self.stats = {"generated_tokens": 0, "generate_seconds": 0.0}
        self.asleep = False  # colocation: the weights are in host memory (`sleep`)
        # the KV cache's freed blocks go back to the OS once the engine idles (common.memory)
        self.idle_trim = IdleTrim() if trim_when_idle else None
        self.startup.mark("engine_ready")

    def _busy(self) -> Any:
        """Marks a call's work for the idle trim (a plain context without one)."""
        return self.idle_trim.busy() if self.idle_trim is not None else contextlib.nullcontext()

    def _sampling(self) -> Any:
        """Marks a batch's sampling as the use of this engine's cores (`lend_cores`)."""
        return self.cores.active() if self.cores is not None else contextlib.nullcontext()

    def _follow(self) -> None:
        """Take the threads this engine may use now (`lend_cores`)."""
        if self.cores is not None:
            self.cores.follow()

    def startup_marks(self) -> dict[str, float]:
        """When this engine's process started, its imports ended and its model was loaded
        (epoch seconds; `common.startup`)."""
        return dict(self.startup.marks)

    def set_num_threads(self, num_threads: int) -> None:
        """Compute with `num_threads` torch threads from the next call on (a split run's
        explorer follows its part of the run's cores, `common.resources.RunShares`)."""
        torch.set_num_threads(max(1, num_threads))

    # -- sampling --------------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        keys: list[int | None] | None = None,
    ) -> list[list[Sample] | BadPrompt]:
        """Sample `params.n` continuations for each prompt. Returns one list per prompt.

        `keys`: a 64-bit sampling key per prompt (`sampling.keyed_uniforms`); None (for all, or
        for one prompt) draws the key from the engine's seeded generator. Each prompt's budget
        is its own (`RolloutEngine.generate`); a prompt with no room under `max_model_len` gets a
        `PromptTooLong` in its place, an empty one a `BadPrompt`, and either is left out before
        the others are batched, so they are sampled exactly as without it. A row that completes
        one of `params.stop` ends at that token (`detokenize.RowTexts`).
        """
        *_, out = self.generate_stream(prompts, params, keys)
        return out

    @_inference_mode
    def generate_stream(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        keys: list[int | None] | None = None,
        watch: list[bool] | None = None,
    ) -> Iterator[Progress | list[list[Sample] | BadPrompt]]:
        """`generate`, yielding a `Progress` per decode step for the prompts `watch` marks,
        then `generate`'s answer (`RolloutEngine.generate_stream`)."""
        self._check_awake()
        keys = list(keys) if keys is not None else [None] * len(prompts)
        watch = list(watch) if watch is not None else [False] * len(prompts)
        if not len(keys) == len(watch) == len(prompts):
            raise ValueError(
                f"{len(keys)} keys and {len(watch)} watch flags for {len(prompts)} prompts"
            )
        out: list[list[Sample] | BadPrompt] = [
            BadPrompt("an empty prompt: there is nothing to continue")
            if not p
            else PromptTooLong(
                f"prompt of {len(p)} tokens leaves no room for a response under "
                f"max_model_len={self.max_model_len}"
            )
            for p in prompts
        ]
        fits = [
            i for i, p in enumerate(prompts) if p and self._budget(len(p), params.max_tokens) > 0
        ]
        per_chunk = max(1, self.max_batch_size // max(1, params.n))  # prompts per batch
        with self._busy(), self._sampling():
            for start in range(0, len(fits), per_chunk):
                chunk = fits[start : start + per_chunk]
                got = yield from self._generate_batch(
                    [prompts[i] for i in chunk],
                    params,
                    [keys[i] for i in chunk],
                    [i if watch[i] else None for i in chunk],
                )
                for i, samples in zip(chunk, got, strict=True):
                    out[i] = samples
        yield out

    def _budget(self, prompt_len: int, max_tokens: int) -> int:
        """New tokens a prompt of `prompt_len` may get: its own room under max_model_len."""
        if self.max_model_len is None:
            return max_tokens
        return min(max_tokens, self.max_model_len - prompt_len)

    def _row_keys(self, keys: list[int | None], n: int) -> np.ndarray:
        """[len(keys) * n] uint64: sample j of prompt i is keyed splitmix64(splitmix64(key_i) + j)."""
        filled = [
            k if k is not None else int(torch.randint(0, 2**62, (1,), generator=self.generator))
            for k in keys
        ]
        base = sampling.splitmix64(np.repeat(np.asarray(filled, dtype=np.uint64), n))
        with np.errstate(over="ignore"):
            return sampling.splitmix64(base + np.tile(np.arange(n, dtype=np.uint64), len(keys)))

    def _padded(self, prompts: list[list[int]]) -> tuple[torch.Tensor, ...]:
        """[B, P] input ids left-padded, attention mask, positions counting real tokens only."""
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        return tuple(t.to(self.device) for t in (input_ids, attention, positions))

    def _generate_batch(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        keys: list[int | None],
        watch: list[int | None],
    ) -> Generator[Progress, None, list[list[Sample]]]:
        """Prefill each prompt once, fan its KV cache out to `n` rows, decode until all stop.
        `watch[i]`: the number prompt i's rows are reported under in `Progress` (None: not).

        1. left-pad the prompts; each row's token budget
        2. prefill the B distinct prompts, then repeat each row's cache `n` times
        3. decode: raw-policy logprob of the drawn token, the text it adds where a row streams
           or may stop at a string; drop rows that sampled eos, completed a stop string or used
           up their own budget
        4. cut each row at its end (the eos or the token completing the stop string is kept:
           it is a trained token)
        """
        t0 = time.perf_counter()
        # 1.
        budgets = [self._budget(len(p), params.max_tokens) for p in prompts]
        if min(budgets) <= 0:  # `generate` leaves such prompts out
            raise PromptTooLong(f"a prompt leaves no room under max_model_len={self.max_model_len}")
        max_new, n, rows = max(budgets), params.n, len(prompts) * params.n
        # 2.  # logits [B, V] -> [B*n, V]
        self._follow()
        dec = decoders.decoder_for(
            self.model, self.cache_kw, max_new, lean=self.lean_decode, version=self.model_version
        )
        logits = dec.prefill(*self._padded(prompts), n)
        alive = torch.arange(rows, device=self.device)  # original row of each live row
        tokens = torch.full((rows, max_new), self.pad_id, dtype=torch.long, device=self.device)
        logprobs = torch.zeros((rows, max_new), dtype=torch.float32, device=self.device)
        top_k = min(params.logprobs, logits.shape[-1])  # alternatives per token
        top_lp = torch.zeros((rows, max_new, top_k), dtype=torch.float32, device=self.device)
        top_id = torch.zeros((rows, max_new, top_k), dtype=torch.long, device=self.device)
        # [B*n]: row r of prompt r // n stops after its prompt's budget at the latest
        budget = torch.tensor(budgets, dtype=torch.long, device=self.device).repeat_interleave(n)
        lengths = budget.clone()
        stopped = torch.zeros(rows, dtype=torch.bool, device=self.device)
        stop_ids = torch.tensor(sorted(self.eos_ids), device=self.device)
        row_keys = self._row_keys(keys, n)  # [b], follows `alive`
        followed = [r for r in range(rows) if params.stop or watch[r // n] is not None]
        texts = RowTexts(self.tokenizer, followed, params.stop) if followed else None
        stop_strings: dict[int, str] = {}  # row -> the stop string that ended it
        # 3.
        for t in range(max_new):
            tok = sampling.sample_next(
                logits,
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
                uniforms=sampling.keyed_uniforms(row_keys, t) if params.temperature > 0 else None,
            )  # [b]
            if self.tp is not None:  # every rank goes on with rank 0's draw
                tok = self.tp.agree(tok)
            raw = torch.log_softmax(logits.float(), dim=-1)  # [b, V]
            lp = raw.gather(-1, tok[:, None]).squeeze(-1)
            tokens[alive, t], logprobs[alive, t] = tok, lp
            if top_k:  # [b, k]: the raw policy's k most likely tokens
                top_lp[alive, t], top_id[alive, t] = torch.topk(raw, top_k, dim=-1)
            ended = torch.isin(tok, stop_ids)
            if texts is not None:
                live, sampled = alive.tolist(), tok.tolist()
                added, hits = texts.step(live, sampled)
                if hits:
                    stop_strings.update(hits)
                    ended |= torch.tensor([r in hits for r in live], device=self.device)
                seen = [k for k, r in enumerate(live) if watch[r // n] is not None]
                if seen:
                    lps = lp.tolist()
                    yield Progress(
                        self.model_version,
                        [
                            (
                                watch[live[k] // n],
                                live[k] % n,
                                t,
                                sampled[k],
                                lps[k],
                                added[live[k]],
                            )
                            for k in seen
                        ],
                    )
            done = ended | (budget[alive] == t + 1)  # [b]
            if bool(done.any()):
                lengths[alive[done]] = t + 1
                stopped[alive[ended]] = True
                keep = torch.nonzero(~done).squeeze(-1)
                if keep.numel() == 0:
                    break
                dec.keep(keep)
                row_keys = row_keys[keep.cpu().numpy()]
                alive, tok = alive[keep], tok[keep]
            if t + 1 == max_new:
                break
            self._follow()
            logits = dec.step(tok)
        # 4.
        tokens, logprobs, top_lp, top_id = tokens.cpu(), logprobs.cpu(), top_lp.cpu(), top_id.cpu()
        lengths_l, stopped_l = lengths.tolist(), stopped.tolist()
        out: list[list[Sample]] = []
        for i, prompt in enumerate(prompts):
            group = []
            for r in range(i * n, (i + 1) * n):
                k = lengths_l[r]
                group.append(
                    Sample(
                        prompt_ids=list(prompt),
                        response_ids=tokens[r, :k].tolist(),
                        logprobs=logprobs[r, :k].tolist(),
                        finish_reason="stop" if stopped_l[r] else "length",
                        model_version=self.model_version,
                        info={"stop": stop_strings[r]} if r in stop_strings else {},
                        top_ids=top_id[r, :k].tolist() if top_k else None,
                        top_logprobs=top_lp[r, :k].tolist() if top_k else None,
                    )
                )
                self.stats["generated_tokens"] += k
            out.append(group)
        self.stats["generate_seconds"] += time.perf_counter() - t0
        return out

    @_inference_mode
    def logprobs(self, tokens: list[int]) -> list[float]:
        """Logprob of tokens[1:] given their prefixes (length len(tokens) - 1)."""
        self._check_awake()
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        backbone = self.model.get_decoder()
        hidden = backbone(input_ids=ids, use_cache=False).last_hidden_state[0, :-1]  # [T-1, H]
        # the head in chunks: never T × V logits at once (a 49k vocabulary is 0.2 GB per 1k tokens)
        lp, _ = lean_head.head_logprobs(
            self.model.get_output_embeddings(), hidden, ids[0, 1:], SCORE_CHUNK, with_entropy=False
        )
        return lp.float().cpu().tolist()

    # -- colocation (`common.turns`) --------------------------------------------------------------

    def sleep(self, level: int = 1) -> int:
        """Free the device for a colocated trainer: the weights go to host memory (vLLM's sleep
        level 1; this engine keeps no KV cache between calls, so that is all it holds). Until
        `wake_up`, sampling and scoring are refused; a weight update loads into the host copy.
        Returns the bytes moved (0 on a CPU-only machine, where the device is host memory)."""
        if level != 1:
            raise ValueError(f"the transformers engine sleeps at level 1 only, not {level}")
        if self.asleep:
            return 0
        self.asleep = True
        return offload.to_device([self.model], [], "cpu")

    def wake_up(self) -> int:
        """The weights back on the device; returns the bytes moved."""
        if not self.asleep:
            return 0
        self.asleep = False
        return offload.to_device([self.model], [], self.device)

    def _check_awake(self) -> None:
        if self.asleep:
            raise RuntimeError(
                "the rollout engine is asleep while a colocated trainer holds the device: "
                "wake_up() first (common.turns)"
            )

    # -- weights ---------------------------------------------------------------------------------

    def update_weights(
        self, method: str, payload: list[Any], version: int, peers: Peers | None = None
    ) -> int:
        """Load the weights a sync method published (`trinity.sync.method`); bump the version."""
        transport = sync_method(method)
        tensors = transport.receive(payload, peers)
        return self.load_state(tensors, version, take=transport.hands_over)

    def load_state(self, tensors: dict[str, torch.Tensor], version: int, take: bool = False) -> int:
        """Load a name -> tensor dict as weights `version` (tied output embeddings may be absent).
        `take`: keep the tensors as the parameters (`load_weights`; a sync method that hands
        them over), so the engine holds one copy of the weights, not the transport's and its
        own. A tensor-parallel rank keeps its slices of each split weight
        (`TensorParallel.shard`)."""
        if self.tp is not None:
            tensors = self.tp.shard(self.model, tensors)
        with self._busy():  # the replaced weights' blocks, when they were copied
            load_weights(self.model, tensors, f"weight update v{version}", take=take)
        self.model_version = version
        return version

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
