"""Rollout engine on Hugging Face transformers: batched sampling with per-token logprobs.

It wraps `model.generate` (the portable path; vLLM is the GPU path where installed) and adds what
RL needs: the logprob of every sampled token, the exact sampled ids, a finish reason, and a
`model_version` that `update_weights` bumps.

Logprobs are those of the raw policy, log_softmax(logits) at temperature 1, whatever the sampling
temperature/top-p/top-k: that is the distribution the trainer recomputes, so the two can be compared
token for token (`rollout/logprob_diff`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trinity.models import load_model, load_tokenizer, resolve_model_path


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. `n` sequences are drawn per prompt."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 64

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Sample:
    """One sampled continuation of one prompt."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (eos sampled) or "length" (max_tokens reached)
    model_version: int
    info: dict[str, Any] = field(default_factory=dict)


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
    ) -> None:
        # Ray sets OMP_NUM_THREADS=1 in actors that reserve no CPU: choose explicitly
        torch.set_num_threads(num_threads or os.cpu_count() or 1)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        path = resolve_model_path(model_path)
        self.tokenizer = load_tokenizer(path, custom_chat_template=custom_chat_template)
        self.model = load_model(path, dtype=dtype, device=self.device)
        self.model.requires_grad_(False)
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

    # -- sampling --------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        """Sample `params.n` continuations for each prompt. Returns one list per prompt."""
        flat = [p for p in prompts for _ in range(params.n)]
        out: list[Sample] = []
        for start in range(0, len(flat), self.max_batch_size):
            out.extend(self._generate_batch(flat[start : start + self.max_batch_size], params))
        return [out[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        t0 = time.perf_counter()
        # 1. left-pad the prompts into one tensor  # [B, P]
        width = max(len(p) for p in prompts)
        max_new = params.max_tokens
        if self.max_model_len is not None:
            max_new = min(max_new, self.max_model_len - width)
            if max_new <= 0:
                raise ValueError(
                    f"prompt of {width} tokens leaves no room under max_model_len={self.max_model_len}"
                )
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p) :] = 1
        # 2. sample, keeping the raw logits of every step  # [B, P + R]
        sampling: dict[str, Any] = {"do_sample": False}
        if not params.greedy:
            sampling = {
                "do_sample": True,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k if params.top_k > 0 else None,
            }
        out = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention.to(self.device),
            max_new_tokens=max_new,
            min_new_tokens=0,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
            **sampling,
        )
        responses = out.sequences[:, width:]  # [B, R]
        # 3. logprob of each sampled token under the raw policy  # [B, R]
        logits = torch.stack(out.logits, dim=1).float()  # [B, R, V]
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
        # 4. cut each row at its first eos (kept, it is a trained token)
        responses, logprobs = responses.cpu(), logprobs.cpu()
        is_eos = torch.zeros_like(responses, dtype=torch.bool)
        for e in self.eos_ids:
            is_eos |= responses == e
        samples = []
        for i, prompt in enumerate(prompts):
            eos_pos = torch.nonzero(is_eos[i])
            if len(eos_pos):
                n, reason = int(eos_pos[0]) + 1, "stop"
            else:
                n, reason = responses.shape[1], "length"
            samples.append(
                Sample(
                    prompt_ids=list(prompt),
                    response_ids=responses[i, :n].tolist(),
                    logprobs=logprobs[i, :n].tolist(),
                    finish_reason=reason,
                    model_version=self.model_version,
                )
            )
            self.stats["generated_tokens"] += n
        self.stats["generate_seconds"] += time.perf_counter() - t0
        return samples

    @torch.inference_mode()
    def logprobs(self, tokens: list[int]) -> list[float]:
        """Logprob of tokens[1:] given their prefixes (length len(tokens) - 1)."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        logits = self.model(input_ids=ids).logits.float()[0, :-1]
        lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        return lp.cpu().tolist()

    # -- weights ---------------------------------------------------------------------------------

    def update_weights(self, state: dict[str, np.ndarray] | str, version: int) -> int:
        """Load new weights (a name → array dict, or a safetensors file path); bump the version."""
        if isinstance(state, str):
            from safetensors.torch import load_file

            tensors = load_file(state)
        else:
            # object-store arrays are read-only views: copy into tensors the model can own
            tensors = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in state.items()}
        missing, unexpected = self.model.load_state_dict(tensors, strict=False)
        missing = [k for k in missing if not _is_tied(self.model, k)]
        if missing or unexpected:
            raise RuntimeError(
                f"weight update v{version} does not match the rollout model: "
                f"missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        self.model_version = version
        return version

    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def get_stats(self) -> dict[str, float]:
        return dict(self.stats)


def _is_tied(model: torch.nn.Module, key: str) -> bool:
    """True when `key` is the output embedding tied to the input embedding (not in state dicts)."""
    return bool(getattr(model.config, "tie_word_embeddings", False)) and key.endswith(
        "lm_head.weight"
    )
