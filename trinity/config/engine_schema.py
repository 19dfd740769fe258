"""Schema of an inference engine pool: `explorer.rollout_model` and each `auxiliary_models[*]`.

An auxiliary model (a judge, a user simulator) is served to workflows as `model.auxiliary(i)` or
`model.auxiliary("<name>")` (`trinity/explorer/auxiliary.py`); its engines are never trained.

Trinity-RFT's vLLM knobs (`enforce_eager`, `gpu_memory_utilization`, ...) and OpenAI-API settings
are accepted with its defaults so that its configs load; `support.py` says which of them act here
(the vLLM knobs act in a pool whose `engine_type` is vllm, and are noted as not applicable in a
pool the transformers engine serves).
"""

from __future__ import annotations

import importlib.util
from typing import Annotated, Any, Literal

from pydantic import Field

from trinity.config.base import ConfigSection, Dtype, NotApplicable


def serves_with_vllm(pool: Any) -> bool:
    """Whether an engine pool's engines are vLLM's (`engine_type: vllm`; unset is the best
    available, `resolved.BEST_ENGINE`: transformers)."""
    return getattr(pool, "engine_type", None) == "vllm"


def vllm_installed() -> bool:
    """Whether this Python environment can import vLLM (a module lookup: nothing imported)."""
    return importlib.util.find_spec("vllm") is not None


VLLM_INSTALL = (
    "`scripts/setup.sh vllm` makes .venv-vllm with vLLM's CPU build (run "
    "`.venv-vllm/bin/trinity`), `pip install 'trinity[vllm]'` installs vLLM's GPU build; "
    "docs/engines.md"
)

_VLLM = NotApplicable(
    "vLLM engine knob, acted upon with engine_type: vllm; the transformers engine serves rollouts",
    unless=serves_with_vllm,
)


class InferenceModelConfig(ConfigSection):
    """An inference engine pool serving rollouts."""

    model_path: str | None = None
    """Model to serve; None = model.model_path (rollout model). An auxiliary model must set it;
    it is also the model name its OpenAI client passes (`client.model_path`)."""
    name: str | None = None
    """An auxiliary model's name: workflows address it as `model.auxiliary("<name>")` (or by
    its position in the list); unique among auxiliary_models."""
    engine_type: Literal["transformers", "vllm"] | None = None
    """Inference backend: 'transformers' (our decode loop, everywhere) or 'vllm' (where vLLM
    is installed: `scripts/setup.sh vllm`, or `pip install 'trinity[vllm]'` on a GPU;
    docs/engines.md); None = 'transformers'."""
    engine_num: int = Field(1, ge=1)
    """Number of engine replicas."""
    tensor_parallel_size: int = Field(1, ge=1)
    """Processes per engine replica, which split each decoder layer between them (tensor
    parallelism: attention heads, KV heads and the MLP's inner width, each of which it must
    divide): on GPUs one GPU each (rollout GPUs = engine_num × tensor_parallel_size), on CPUs
    the replica's cores divided between them. The transformers engine only
    (docs/scale_out.md); not with in_explorer_process or cluster.one_process."""
    dtype: Dtype = "auto"
    """Weight dtype of the engine."""
    seed: int | None = None
    """Sampling seed of the engine (replica i uses seed + i); None = the global seed. An
    auxiliary model's seed also enters the sampling keys of the calls made to it."""
    enable_openai_api: bool = False
    """Serve an OpenAI-compatible HTTP endpoint on 127.0.0.1 to the explorer's workflows. The
    rollout model's: `model.openai_client()` / `async_openai_client()` calls sample from the
    rollout engines and are recorded in the task's session. An auxiliary model's (an endpoint
    of its own): `model.auxiliary(i).openai_client()` / `async_openai_client()`, not recorded."""
    max_batch_size: int = Field(256, ge=1)
    """Sequences per generate call (unit: sequences)."""
    num_threads: int | None = Field(None, ge=1)
    """torch CPU threads of each engine replica; None = its share of the free cores
    (trinity.common.resources; auxiliary engines count as engines there)."""
    in_explorer_process: bool = False
    """Run the rollout engines inside the explorer's process, each on a thread of its own,
    instead of as Ray actors of their own: one process fewer per engine, so one copy fewer of
    torch, transformers and the model code (a lean local run on a laptop). The explorer reserves
    the engines' cores. Not with `synchronizer.sync_method: nccl`, nor for auxiliary models;
    `max_restarts` does not apply (an engine's crash is the explorer's)."""
    max_restarts: int = Field(3, ge=0)
    """Times Ray restarts a crashed engine replica (its process died: OOM kill, segfault); the
    explorer reloads the weights it held and resends its requests. 0: a crash ends the run."""
    use_v1: Annotated[
        bool, NotApplicable("vLLM engine knob; the vLLM releases trinity runs have only V1")
    ] = True
    """vLLM: use the V1 engine."""
    enforce_eager: Annotated[bool, _VLLM] = True
    """vLLM: no CUDA graphs (eager mode)."""
    enable_prefix_caching: Annotated[bool, _VLLM] = False
    """vLLM: reuse KV cache of prefixes."""
    enable_chunked_prefill: Annotated[bool, _VLLM] = False
    """vLLM: split long prefills."""
    gpu_memory_utilization: Annotated[float, _VLLM] = Field(0.9, gt=0, le=1)
    """vLLM: fraction of GPU memory the engine may take."""
    enable_log_requests: Annotated[
        bool,
        NotApplicable("vLLM engine knob; trinity runs vLLM's offline engine, which logs none"),
    ] = False
    """vLLM: log every request."""
    enable_history: Annotated[
        bool,
        NotApplicable(
            "every call of a workflow's model handle and its OpenAI clients is always recorded "
            "in the task's ledger (model.extract_experiences())"
        ),
    ] = False
    """Record every request and response of this model for the workflow."""
    enable_auto_tool_choice: Annotated[
        bool, NotApplicable("tool_choice 'auto' is always served to a request with tools")
    ] = False
    """OpenAI API: let the model decide to call tools."""
    tool_call_parser: str | None = None
    """OpenAI API: parser of tool calls in the output (`trinity.endpoint.tool_calls`: hermes,
    qwen, json, or a dotted path); None = hermes."""
    reasoning_parser: str | None = None
    """Parser of a reply's `<think>` reasoning (`trinity.common.reasoning`, vLLM's names:
    deepseek_r1, qwen3, or a dotted path): the endpoint's chat messages carry it as
    `reasoning_content` apart from `content`, a workflow's chat samples as
    `info["reasoning_content"]` / `info["content"]`, and a later turn that repeats the answer
    alone still continues the sampled tokens; the tokens are never changed. None = no split."""
    max_model_len: int | None = Field(None, ge=1)
    """Prompt + response tokens; None = model.max_model_len."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Prompt token limit; None = model.max_prompt_tokens. An auxiliary model refuses a longer
    prompt (`PromptTooLong`) instead of cutting it."""
    max_response_tokens: int | None = Field(None, ge=1)
    """Response token limit; None = model.max_response_tokens."""
    enable_thinking: bool | None = None
    """Chat-template reasoning switch; None = model.enable_thinking."""
