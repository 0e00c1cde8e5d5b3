"""Issue 16 regressions: the reference router (both transports) and the fake engines answer every client
mistake with a 4xx JSON error, never a 5xx, and no single request can wedge an engine; the worker API cannot
be turned against the router or the network."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import requests
from helpers.pd_stack import BackgroundPdStack, PdStack

from fake_engines.core.generator import expected_completion
from pdchaos.proto import vllm_engine_pb2, vllm_engine_pb2_grpc
from pdchaos.sse import parse_sse

TIMEOUT_S = 30.0
PROMPT = "[pdchaos:hard:1] alpha bravo"
# Under the router's 4 MiB body limit, far over any 32768-token context.
HUGE_PROMPT = "hello " * 650_000


@pytest.fixture(scope="module", params=["http", "grpc"])
def stack(request: pytest.FixtureRequest) -> Iterator[PdStack]:
    with BackgroundPdStack(request.param) as s:
        yield s


def post(url: str, body: Any, path: str = "/v1/completions") -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=True).encode()
    return requests.post(f"{url}{path}", data=data, headers={"Content-Type": "application/json"},
                         timeout=TIMEOUT_S)


def assert_400(resp: requests.Response, needle: str = "") -> dict[str, Any]:
    assert resp.status_code == 400, resp.text[:400]
    err = resp.json()["error"]
    assert needle in err["message"], err
    return err


def assert_serving(stack: PdStack) -> None:
    for url in stack.engine_http_urls():
        assert requests.get(f"{url}/health", timeout=TIMEOUT_S).status_code == 200
    assert requests.get(f"{stack.url}/readiness", timeout=TIMEOUT_S).status_code == 200
    done = post(stack.url, {"prompt": PROMPT, "max_tokens": 5})
    assert done.status_code == 200 and done.json()["choices"][0]["text"] == expected_completion(PROMPT, 5)


# ----------------------------------------------------------------------------------- the router, both paths


@pytest.mark.parametrize("max_tokens", [2**63, 2**32, 32768, 40000])
def test_max_tokens_beyond_the_context_is_400_and_wedges_nothing(stack: PdStack, max_tokens: int) -> None:
    """One request with max_tokens 2**63 used to hold the decode at 100% CPU (and 109 later requests got
    503): now a 400 like vLLM's, from the router before any leg, and everything still serves."""
    seen = len(stack.prefill.engine.records)
    assert_400(post(stack.url, {"prompt": PROMPT, "max_tokens": max_tokens}), "max_tokens")
    assert len(stack.prefill.engine.records) == seen  # refused before the prefill leg ran
    assert_serving(stack)


def test_prompt_longer_than_the_context_is_400(stack: PdStack) -> None:
    """A 3.8 MB prompt (under the 4 MiB body limit) used to cost 97 s of prefill work; a prompt over the
    context in tokens but short in bytes is tokenized and refused too."""
    assert_400(post(stack.url, {"prompt": HUGE_PROMPT, "max_tokens": 2}), "maximum context length")
    assert_400(post(stack.url, {"prompt": "alpha " * 40_000, "max_tokens": 2}), "maximum context length")
    assert_serving(stack)


@pytest.mark.parametrize("depth", [100, 5000, 100_000])
def test_deeply_nested_json_is_400(stack: PdStack, depth: int) -> None:
    raw = b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"
    err = assert_400(post(stack.url, raw))
    assert err["code"] in ("invalid_json", "invalid_request")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"prompt": [-1]}, "token ids"),
        ({"prompt": [2**40]}, "token ids"),
        ({"prompt": [5_000_000]}, "out of"),
        ({"prompt": PROMPT, "temperature": "hot"}, "temperature"),
        ({"prompt": PROMPT, "seed": "x"}, "seed"),
        ({"prompt": PROMPT, "seed": 2**64}, "seed"),
        ({"prompt": "[pdchaos:hard:2] \ud800"}, "not valid Unicode"),
        ({"prompt": PROMPT, "stop": ["ok", "\udfff"]}, "not valid Unicode"),
        ({"prompt": PROMPT, "stream": True, "stream_options": "bad"}, "stream_options"),
        ({"prompt": PROMPT, "stream": False, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": PROMPT, "n": 2}, "n=1"),
        ({"prompt": PROMPT, "max_tokens": 2, "min_tokens": 5}, "min_tokens"),
        ({"prompt": PROMPT, "top_p": 0}, "top_p"),
        ({"prompt": PROMPT, "model": 5}, "model"),
    ],
)
def test_client_mistakes_are_400_before_any_leg(stack: PdStack, body: dict[str, Any], needle: str) -> None:
    """The 500s and 502s of the issue (OverflowError, RecursionError, an engine's 500 relayed as 502) and
    the n=2 that used to be refused only after the prefill leg ran (HTTP) or ignored (gRPC)."""
    seen = len(stack.prefill.engine.records)
    assert_400(post(stack.url, {"max_tokens": 3, **body}), needle)
    assert len(stack.prefill.engine.records) == seen


def test_a_lone_surrogate_in_chat_is_400(stack: PdStack) -> None:
    body = {"messages": [{"role": "user", "content": "hi \ud83d"}], "max_tokens": 2}
    assert_400(post(stack.url, body, "/v1/chat/completions"), "not valid Unicode")


def test_include_usage_ends_the_stream_with_a_usage_chunk(stack: PdStack) -> None:
    """It was ignored on the gRPC path."""
    body = {"prompt": PROMPT, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    resp = post(stack.url, body)
    assert resp.status_code == 200
    chunks = [p for p in parse_sse(resp.text).chunks if isinstance(p, dict)]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] == 4 and usage[0]["prompt_tokens"] > 0
    assert usage[0]["total_tokens"] == usage[0]["prompt_tokens"] + 4
    text = "".join(c["choices"][0].get("text") or "" for c in chunks if c.get("choices"))
    assert text == expected_completion(PROMPT, 4)


def test_models_retrieve(stack: PdStack) -> None:
    """`GET /v1/models/{id}` (the openai client's models.retrieve) was a 404."""
    one = requests.get(f"{stack.url}/v1/models/pdchaos-fake", timeout=TIMEOUT_S)
    assert one.status_code == 200 and one.json()["id"] == "pdchaos-fake" and one.json()["object"] == "model"
    missing = requests.get(f"{stack.url}/v1/models/other-model", timeout=TIMEOUT_S)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def raw_http(url: str, request: bytes) -> tuple[int, dict[str, Any]]:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"application/json" in head, head
    return status, json.loads(body)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"BREW /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
        b"GET /health HTTP/1.1\r\n\r\n",
    ],
    ids=["unknown-method", "9k-header", "no-host"],
)
def test_aiohttp_parser_errors_answer_json(stack: PdStack, request_bytes: bytes) -> None:
    """Router and engines alike: the documented JSON error, not aiohttp's plain text."""
    status, body = raw_http(stack.url, request_bytes)
    assert status == 400 and isinstance(body["error"]["message"], str) and body["error"]["code"]
    status, body = raw_http(stack.engine_http_urls()[0], request_bytes)
    assert status == 400 and body["error"]["code"] == 400


# ----------------------------------------------------------------------------------- the engines directly


def test_engines_refuse_what_would_wedge_them(stack: PdStack) -> None:
    if stack.transport != "http":
        pytest.skip("one engine HTTP surface is enough")
    for url in stack.engine_http_urls():
        assert_400(post(url, {"prompt": PROMPT, "max_tokens": 2**63}), "max_tokens")
        assert_400(post(url, {"prompt": HUGE_PROMPT, "max_tokens": 1}), "maximum context length")
        assert_400(post(url, {"prompt": "x \ud800", "max_tokens": 1}), "Unicode")
        assert_400(post(url, {"prompt": PROMPT, "stream": True, "stream_options": "bad"}), "stream_options")
        assert_400(post(url, b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), "JSON")
        assert requests.get(f"{url}/health", timeout=TIMEOUT_S).status_code == 200
    assert_serving(stack)


def test_grpc_engine_refuses_out_of_range_requests(stack: PdStack) -> None:
    if stack.transport != "grpc":
        pytest.skip("the gRPC surface once")
    target = stack.decode.url("grpc").removeprefix("grpc://")

    async def generate(req: Any) -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(target) as channel:
            call = vllm_engine_pb2_grpc.VllmEngineStub(channel).Generate(req, timeout=TIMEOUT_S)
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError as exc:
                return exc.code()
        return grpc.StatusCode.OK

    pb = vllm_engine_pb2

    def req(ids: list[int] | None = None, text: str = "", max_tokens: int = 2) -> Any:
        sp = pb.SamplingParams(max_tokens=max_tokens)
        if ids is not None:
            return pb.GenerateRequest(request_id="r", tokenized=pb.TokenizedInput(input_ids=ids),
                                      sampling_params=sp)
        return pb.GenerateRequest(request_id="r", text=text, sampling_params=sp)

    for bad in (req([5_000_000]), req(text="word " * 100_000), req([1, 2], max_tokens=0)):
        assert stack.call(generate(bad)) == grpc.StatusCode.INVALID_ARGUMENT
    assert stack.call(generate(req([1, 2, 3]))) == grpc.StatusCode.OK
    # As vLLM's gRPC server: a max_tokens past the context is not refused; the work ends at the context.
    assert stack.call(generate(req([1, 2], max_tokens=2**32 - 1))) == grpc.StatusCode.OK
    assert_serving(stack)


# ----------------------------------------------------------------------------------- the worker API


def test_worker_api_refuses_itself_other_hosts_and_credentials(stack: PdStack) -> None:
    if stack.transport != "http":
        pytest.skip("the worker API does not depend on the transport")
    workers = f"{stack.url}/workers"
    before = requests.get(workers, timeout=TIMEOUT_S).json()["workers"]
    router_port = stack.url.rsplit(":", 1)[1]
    decode_port = stack.decode.url("http").rsplit(":", 1)[1]
    refused = {
        f"http://127.0.0.1:{router_port}": "this router itself",
        f"http://localhost:{router_port}": "this router itself",
        "http://10.0.0.1:8000": "not a loopback address",
        "http://169.254.169.254:80": "not a loopback address",
        "http://example.com:80": "not a loopback address",
        "http://0.0.0.0:8000": "not a loopback address",
        f"http://user:pw@127.0.0.1:{decode_port}": "credentials",
        f"grpc://user@127.0.0.1:{decode_port}": "credentials",
    }
    for url, needle in refused.items():
        resp = requests.post(workers, json={"url": url, "role": "decode"}, timeout=TIMEOUT_S)
        assert resp.status_code == 400, (url, resp.text)
        assert resp.json()["error"]["code"] == "invalid_worker" and needle in resp.json()["error"]["message"]
    # The engine already registered, spelled another way, is the same engine.
    again = requests.post(workers, json={"url": f"http://LOCALHOST:{decode_port}/", "role": "decode"},
                          timeout=TIMEOUT_S)
    assert again.status_code == 409 and again.json()["error"]["code"] == "duplicate_worker"
    after = requests.get(workers, timeout=TIMEOUT_S).json()["workers"]
    assert [w["id"] for w in after] == [w["id"] for w in before]  # nothing registered, nothing probed
    assert not any("@" in w["url"] for w in after)
