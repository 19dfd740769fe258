"""`model.external_model`: the external engine's client side against a tiny in-test HTTP server
(what it sends, how it reads answers, every way the endpoint can fail), and its config rules."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from trinity.common.rollout import BadPrompt, PromptTooLong, SamplingParams
from trinity.config import TrinityConfig
from trinity.config.checks import check_config
from trinity.config.preflight import preflight
from trinity.config.secrets import REDACTED, redacted
from trinity.config.side_schema import ExternalModelConfig
from trinity.explorer.external_endpoint import EndpointError, endpoint_of, probe
from trinity.launcher.bench import bench_points

KEY = "sk-right-key"
MODEL = "served-model"


class FakeEndpoint:
    """An OpenAI-compatible server in a thread: GET /v1/models lists MODEL; POST
    /v1/completions answers `self.answer(body)` -> (status, body: dict | str). Requests are kept
    in `self.requests`; a wrong key is a 401 in the format trinity's endpoint uses."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.answer = lambda body: (200, {})
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict | str) -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                kind = "text/html" if isinstance(body, str) else "application/json"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorised(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {KEY}":
                    return True
                error = {"message": "invalid or missing API key", "code": "invalid_api_key"}
                self._send(401, {"error": error})
                return False

            def do_GET(self) -> None:
                if self._authorised():
                    self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self._authorised():
                    outer.requests.append(body)
                    outer.paths.append(self.path)
                    self._send(*outer.answer(body))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()


@pytest.fixture
def endpoint() -> Iterator[FakeEndpoint]:
    fake = FakeEndpoint()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def _ext(url: str, api: str = "completions", **kw: Any) -> ExternalModelConfig:
    return ExternalModelConfig(
        enable=True, model_name=MODEL, base_url=url, api_key=KEY, request_timeout=5, api=api, **kw
    )


def _engine(tiny_model_dir: Path, ext: ExternalModelConfig, **kw: Any) -> Any:
    from trinity.explorer.external_engine import ExternalEngine

    return ExternalEngine(str(tiny_model_dir), external_model=ext, **kw)


def _choice(i: int, text: str, finish: str, **extra: Any) -> dict[str, Any]:
    return {"index": i, "text": text, "finish_reason": finish, "logprobs": None, **extra}


def test_a_prompt_goes_as_token_ids_and_its_samples_come_back(endpoint, tiny_model_dir):
    engine = _engine(tiny_model_dir, _ext(endpoint.url), max_model_len=7)
    encode = engine.tokenizer.encode
    two = encode("12", add_special_tokens=False)

    def answer(body: dict) -> tuple[int, dict]:
        return 200, {
            "object": "text_completion",
            "choices": [  # out of order: read by index
                _choice(
                    1,
                    "7",
                    "stop",
                    token_ids=[5, 6, 7],
                    stop_reason="\n",
                    logprobs={"tokens": ["a", "b", "c"], "token_logprobs": [-1.0, -2.0, -0.5]},
                ),
                _choice(
                    0,
                    "12",
                    "length",
                    logprobs={"tokens": ["1", "2"], "token_logprobs": [-0.25] * len(two)},
                ),
            ],
        }

    endpoint.answer = answer
    params = SamplingParams(n=2, temperature=0.0, top_p=0.9, max_tokens=3, stop=("\n",))
    got = engine.generate([[1, 2, 3, 4, 5], [1] * 7], params, keys=[2**64 - 1, None])
    # the prompt of 7 tokens has no room under max_model_len 7: refused in its place, unsent
    assert isinstance(got[1], PromptTooLong) and len(endpoint.requests) == 1
    sent = endpoint.requests[0]
    assert sent["prompt"] == [1, 2, 3, 4, 5] and sent["model"] == MODEL
    assert (sent["n"], sent["temperature"], sent["top_p"], sent["stop"]) == (2, 0.0, 0.9, ["\n"])
    assert sent["max_tokens"] == 2  # min(max_tokens 3, max_model_len 7 - 5 prompt tokens)
    assert sent["logprobs"] == 0  # the sampled tokens' logprobs
    assert sent["seed"] == 2**63 - 1  # the key 2**64 - 1 as a signed 64-bit seed
    assert "top_k" not in sent  # top_k -1: off, not sent (OpenAI has no such field)
    first, second = got[0]
    # no token ids from the server: the text encoded with our tokenizer, its logprobs aligned
    assert first.response_ids == two and first.logprobs == [-0.25] * len(two)
    assert first.prompt_ids == [1, 2, 3, 4, 5] and first.finish_reason == "length"
    assert first.info == {"token_ids": "tokenizer"}
    # token ids from the server are taken as they are, with their logprobs
    assert second.response_ids == [5, 6, 7] and second.logprobs == [-1.0, -2.0, -0.5]
    assert second.finish_reason == "stop" and second.info["stop"] == "\n"
    assert engine.get_stats()["requests"] == 2


def test_more_than_16_samples_are_several_requests(endpoint, tiny_model_dir):
    engine = _engine(tiny_model_dir, _ext(endpoint.url))
    endpoint.answer = lambda body: (
        200,
        {"choices": [_choice(i, str(body["n"]), "stop") for i in range(body["n"])]},
    )
    [samples] = engine.generate([[1, 2]], SamplingParams(n=20), keys=[100])
    # 20 = 16 + 4: seeds key and key + 16, so the two requests draw different samples
    assert [(r["n"], r["seed"]) for r in endpoint.requests] == [(16, 100), (4, 116)]
    texts = [engine.decode(s.response_ids) for s in samples]
    assert texts == ["16"] * 16 + ["4"] * 4


def test_logprobs_that_do_not_align_are_zeros_and_say_so(endpoint, tiny_model_dir):
    engine = _engine(tiny_model_dir, _ext(endpoint.url))
    endpoint.answer = lambda body: (200, {"choices": [_choice(0, "12", "stop")]})
    [[sample]] = engine.generate([[1, 2]], SamplingParams(top_k=5))
    assert endpoint.requests[0]["top_k"] == 5  # sent where set (vLLM and trinity serve read it)
    assert sample.logprobs == [0.0] * len(sample.response_ids)
    assert sample.info["logprobs"] == "absent"


def test_an_unreachable_endpoint_is_named(tiny_model_dir):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(EndpointError, match=f"cannot reach the endpoint {url}"):
        probe(endpoint_of(_ext(url)))
    engine = _engine(tiny_model_dir, _ext(url))
    engine.client = engine.client.with_options(max_retries=0)
    with pytest.raises(EndpointError, match=f"cannot reach the endpoint {url}"):
        engine.generate([[1, 2]], SamplingParams())


def test_a_refused_key_is_a_named_401_without_the_key(endpoint, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-wrong")
    ext = ExternalModelConfig(enable=True, model_name=MODEL, base_url=endpoint.url,
                              api_key_env="MY_KEY", api="completions")  # fmt: skip
    with pytest.raises(EndpointError) as e:
        probe(endpoint_of(ext))
    msg = str(e.value)
    assert f"the endpoint {endpoint.url} refused the API key (401 Unauthorized" in msg
    assert "key from $MY_KEY" in msg and "invalid or missing API key" in msg
    assert "sk-wrong" not in msg
    with pytest.raises(EndpointError, match="401 Unauthorized"):
        _engine(tiny_model_dir, ext).generate([[1, 2]], SamplingParams())
    assert endpoint.requests == []


@pytest.mark.parametrize(
    "status, body, why",
    [
        (200, {"choices": "nope"}, "expected 1 choices, got str"),
        (200, {"choices": [{"index": 0, "finish_reason": "stop"}]}, "choice 0 has no text"),
        (200, "<html>a proxy's page</html>", "malformed answer"),
        (500, {"error": {"message": "engine died"}}, "answered 500 for model 'served-model': "
         "engine died"),
    ],
)  # fmt: skip
def test_a_malformed_or_failed_answer_names_the_endpoint(endpoint, tiny_model_dir, status, body,
                                                         why):  # fmt: skip
    engine = _engine(tiny_model_dir, _ext(endpoint.url))
    engine.client = engine.client.with_options(max_retries=0)
    endpoint.answer = lambda _: (status, body)
    with pytest.raises(EndpointError, match=endpoint.url) as e:
        engine.generate([[1, 2]], SamplingParams())
    assert why in str(e.value)


def test_a_prompt_the_server_refuses_fails_alone(endpoint, tiny_model_dir):
    def answer(body: dict) -> tuple[int, dict]:
        if len(body["prompt"]) > 2:  # trinity serve's refusal of a prompt over its context
            return 400, {"error": {"message": "prompt is too long", "param": "prompt"}}
        return 200, {"choices": [_choice(0, "1", "stop")]}

    endpoint.answer = answer
    engine = _engine(tiny_model_dir, _ext(endpoint.url))
    short, long = engine.generate([[1, 2], [1, 2, 3]], SamplingParams())
    assert isinstance(long, BadPrompt) and "prompt is too long" in str(long)
    assert isinstance(short, list) and short[0].finish_reason == "stop"


def test_the_endpoint_comes_from_the_config_or_the_environment(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://env-host:1/v1/")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    ep = endpoint_of(ExternalModelConfig(enable=True, model_name="m"))
    assert (ep.base_url, ep.api_key) == ("http://env-host:1/v1", "EMPTY")  # no key: as upstream
    assert "EMPTY" not in repr(ep)  # the key is never in a repr (logs, tracebacks)
    ep = endpoint_of(_ext("http://cfg-host:2/v1"))  # base_url / api_key set: they win
    assert (ep.base_url, ep.api_key) == ("http://cfg-host:2/v1", KEY) and KEY not in repr(ep)
    monkeypatch.delenv("OPENAI_BASE_URL")
    with pytest.raises(EndpointError, match="set the environment variable OPENAI_BASE_URL"):
        endpoint_of(ExternalModelConfig(enable=True, model_name="m"))
    with pytest.raises(EndpointError, match="must start with http"):
        endpoint_of(_ext("localhost:8000/v1"))


def _config(mode: str, url: str, **ext: Any) -> TrinityConfig:
    return TrinityConfig.model_validate(
        {
            "mode": mode,
            "model": {
                "model_path": "tiny://1m?seed=0",
                "external_model": {
                    "enable": True,
                    "model_name": MODEL,
                    "base_url": url,
                    "api_key": KEY,
                    **ext,
                },
            },
            "buffer": {
                "explorer_input": {
                    "eval_tasksets": [
                        {
                            "name": "add_eval",
                            "storage_type": "synthetic",
                            "path": "arithmetic",
                            "split": "test",
                            "generator_args": {"digits": 1, "num_tasks": 4},
                            "format": {"prompt_key": "question", "response_key": "answer"},
                        }
                    ],
                    "default_reward_fn_type": "arithmetic_reward",
                },
            },
        }
    )


def test_only_mode_bench_takes_an_external_model(endpoint):
    assert check_config(_config("bench", endpoint.url)) == []
    for mode in ("both", "explore", "train", "serve"):
        [p] = [p for p in check_config(_config(mode, endpoint.url)) if "external" in p.path]
        assert p.path == "model.external_model.enable" and "mode 'bench' only" in p.message
        assert "no weights here to train, sync or save" in p.message
    [p] = check_config(_config("bench", endpoint.url, model_name=None))
    assert p.path == "model.external_model.model_name"
    cfg = _config("bench", endpoint.url).model_copy(deep=True)
    cfg.explorer.rollout_model.engine_type = "vllm"
    cfg.explorer.rollout_model.tensor_parallel_size = 2
    paths = {p.path for p in check_config(cfg) if "model.external_model" in p.message}
    assert paths == {
        "explorer.rollout_model.engine_type",
        "explorer.rollout_model.tensor_parallel_size",
    }


def test_preflight_probes_the_endpoint_and_bench_evaluates_it_alone(
    endpoint, tmp_path, monkeypatch
):
    assert preflight(_config("bench", endpoint.url)).problems == []
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    [p] = preflight(_config("bench", None)).problems  # no URL: neither base_url nor the env var
    assert (p.path, p.message.split(":")[0]) == ("model.external_model", "no endpoint URL")
    assert "set the environment variable OPENAI_BASE_URL" in p.message
    [p] = preflight(_config("bench", endpoint.url, model_name="other")).problems
    assert p.path == "model.external_model"
    assert f"does not serve model 'other' (model.external_model.model_name); it serves " \
           f"['{MODEL}']" in p.message  # fmt: skip
    [p] = preflight(_config("bench", endpoint.url, api_key="sk-wrong")).problems
    assert "401 Unauthorized" in p.message and "sk-wrong" not in p.message
    # the key is redacted wherever the config is shown
    assert (
        redacted(_config("bench", endpoint.url).model_dump())["model"]["external_model"]["api_key"]
        == REDACTED
    )
    # bench: the endpoint is the one row, step 0 (the run folder's checkpoints are not loaded)
    (tmp_path / "global_step_3").mkdir()
    points, line = bench_points(_config("bench", endpoint.url), tmp_path, "tiny://1m?seed=0")
    assert [(p.label, p.step) for p in points] == [
        (f"{MODEL} at {endpoint.url} (model.external_model)", 0)
    ]
    assert line == f"bench: evaluating the external model {MODEL} at {endpoint.url}"


def _chat_answer(body: dict) -> tuple[int, dict]:
    if body.get("logprobs") and body["messages"][0]["content"] == "no logprobs here":
        return 400, {"error": {"message": "logprobs are not supported", "param": "logprobs"}}
    if body.get("tools"):
        call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return 200, {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    entries = [{"token": t, "logprob": -0.5, "bytes": None, "top_logprobs": []} for t in "12"]
    message = {"role": "assistant", "content": "12"}
    choice = {"index": 0, "message": message, "finish_reason": "length",
              "logprobs": {"content": entries} if body.get("logprobs") else None}  # fmt: skip
    return 200, {"choices": [choice]}


def _handle(engine: Any, messages: bool = True) -> Any:
    from trinity.explorer.in_process import InProcess
    from trinity.explorer.model_client import BatchingClient, TaskModelHandle

    client = BatchingClient([InProcess(engine)], messages=messages)
    return TaskModelHandle(client, engine.tokenizer, SamplingParams(max_tokens=4), key=7)


def test_a_chat_call_goes_as_its_messages(endpoint, tiny_model_dir):
    import asyncio

    engine = _engine(tiny_model_dir, _ext(endpoint.url, api="chat"))
    endpoint.answer = _chat_answer
    messages = [{"role": "user", "content": "5+7="}]
    [sample] = asyncio.run(_handle(engine).chat(messages, temperature=0.0))
    assert endpoint.paths == ["/v1/chat/completions"]
    sent = endpoint.requests[0]
    assert sent["messages"] == messages and sent["model"] == MODEL and "tools" not in sent
    assert (sent["n"], sent["temperature"], sent["max_completion_tokens"]) == (1, 0.0, 4)
    assert sent["logprobs"] is True and isinstance(sent["seed"], int)
    # the prompt is our rendering of the messages; the reply's content, encoded by our tokenizer
    tok = engine.tokenizer
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tok.decode(sample.prompt_ids) == rendered and "5+7=" in rendered
    two = engine.tokenizer.encode("12", add_special_tokens=False)
    assert sample.response_ids == two and sample.finish_reason == "length"
    assert len(two) == 2  # the tiny tokenizer has a token per digit: the two entries align
    assert sample.logprobs == [-0.5, -0.5] and "logprobs" not in sample.info
    # a reply the server parsed into tool calls: in the sample's info, not in its ids
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    [called] = asyncio.run(_handle(engine).chat(messages, tools=tools))
    assert endpoint.requests[1]["tools"] == tools
    assert called.response_ids == [] and called.info["tool_calls"][0]["function"]["name"] == "add"


def test_a_server_without_logprobs_is_asked_again_without(endpoint, tiny_model_dir):
    import asyncio

    engine = _engine(tiny_model_dir, _ext(endpoint.url, api="chat"))
    endpoint.answer = _chat_answer
    messages = [{"role": "user", "content": "no logprobs here"}]
    [sample] = asyncio.run(_handle(engine).chat(messages))
    assert [r.get("logprobs") for r in endpoint.requests] == [True, None]
    assert sample.info["logprobs"] == "absent" and engine.chat_logprobs is False


def test_token_ids_cannot_go_to_a_chat_api(endpoint, tiny_model_dir):
    import asyncio

    engine = _engine(tiny_model_dir, _ext(endpoint.url, api="chat"))
    with pytest.raises(BadPrompt, match="use api: completions"):
        asyncio.run(_handle(engine).generate([1, 2, 3]))
    assert endpoint.requests == []
