"""Hypothesis fuzz of the reference router in front of the fake engines, over both transports (issue 16).

Bodies are OpenAI completion and chat requests with every field drawn from valid values, wrong types, out
of range numbers, lone surrogates and junk, plus raw bodies no JSON parser likes (deep nesting, bytes,
non-objects). Whatever the client sends, the answer is never a 5xx: a 4xx carries the documented JSON error,
a 200 is a real completion (a stream ends with [DONE] and carries no error chunk). Afterwards both engines
are healthy, the router is ready and a completion is correct.

A fixed set of examples per transport in the default run (seconds); PDCHAOS_SLOW=1 also draws many new random
ones every run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from helpers.pd_stack import BackgroundPdStack, PdStack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_engines.core.generator import expected_chat_completion, expected_completion

SLOW = os.environ.get("PDCHAOS_SLOW") == "1"
# A fixed set in the default run (a few seconds per transport); new random ones behind PDCHAOS_SLOW=1.
EXAMPLES = 100
SLOW_EXAMPLES = 1500
TIMEOUT_S = 30.0
WORDS = ("alpha", "bravo", "delta", "echo", "river", "stone", "cloud", "maple")

_prompt_text = st.builds(
    lambda n, ws: f"[pdchaos:fuzz:{n}] " + " ".join(ws),
    st.integers(0, 10**6), st.lists(st.sampled_from(WORDS), min_size=1, max_size=6),
)
_surrogates = st.sampled_from(["\ud800", "a\udfffb", "[pdchaos:fuzz:1] \udbff"])
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=12), _surrogates
)
_junk = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 5)

FIELDS: dict[str, Any] = {
    "model": st.sampled_from(["pdchaos-fake", "other-model", ""]) | _junk,
    "prompt": st.one_of(
        _prompt_text, st.lists(st.integers(0, 2999), min_size=1, max_size=6),
        st.lists(st.integers(-(2**41), 2**41), min_size=1, max_size=3), st.just([]), _surrogates,
        st.lists(_prompt_text, min_size=1, max_size=2), _junk,
    ),
    "messages": st.one_of(
        st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": _prompt_text}), min_size=1,
                 max_size=2),
        st.lists(st.fixed_dictionaries({"role": _junk, "content": _junk}), max_size=2), _junk,
    ),
    "max_tokens": st.integers(1, 8) | st.sampled_from([0, -5, 2**31, 2**63, 32768, 10**9]) | _junk,
    "max_completion_tokens": st.integers(1, 8) | st.sampled_from([0, 2**63]) | _junk,
    "n": st.integers(-1, 3) | _junk,
    "stream": st.booleans() | _junk,
    "stream_options": st.sampled_from([None, {"include_usage": True}, {"include_usage": "yes"}, "bad"])
    | _junk,
    "temperature": _numbers | st.just("hot") | _junk,
    "top_p": _numbers | _junk,
    "top_k": st.integers(-3, 100) | _junk,
    "seed": st.integers(-(2**65), 2**65) | st.just("x") | _junk,
    "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=3) | _junk,
    "min_tokens": st.integers(-2, 10) | _junk,
    "ignore_eos": st.booleans() | _junk,
    "kv_transfer_params": st.dictionaries(st.text(max_size=8), _junk, max_size=3) | _junk,
    "request_id": st.text(max_size=8) | _junk,
    "unknown_field": _junk,
}


def _raw_bodies() -> st.SearchStrategy[bytes]:
    deep = st.integers(1, 3000).map(lambda d: b'{"prompt": ' + b"[" * d + b"]" * d + b"}")
    return st.one_of(
        deep,
        st.binary(max_size=64),
        st.sampled_from([b"", b"null", b"[1, 2]", b'"text"', b"{", b'{"prompt": "\\ud800"}', b"NaN"]),
    )


@st.composite
def requests_(draw: st.DrawFn) -> tuple[str, bytes]:
    chat = draw(st.booleans())
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if draw(st.integers(0, 9)) == 0:
        return path, draw(_raw_bodies())
    body: dict[str, Any] = {"model": "pdchaos-fake", "max_tokens": 4}
    if chat:
        body["messages"] = [{"role": "user", "content": draw(_prompt_text)}]
    else:
        body["prompt"] = draw(_prompt_text)
    for key in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=4, unique=True)):
        body[key] = draw(FIELDS[key])
    # ensure_ascii: lone surrogates travel as \\ud800 escapes, as a JSON client may send them.
    return path, json.dumps(body, ensure_ascii=True).encode()


def check_answer(path: str, raw: bytes, resp: requests.Response) -> None:
    said = f"{path} {raw[:300]!r} -> {resp.status_code} {resp.text[:300]!r}"
    assert resp.status_code < 500, said
    if resp.status_code >= 400:
        err = resp.json()["error"]
        assert isinstance(err["message"], str) and err["type"] and err["code"], said
        return
    assert resp.status_code == 200, said
    if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
        assert resp.text.rstrip().endswith("data: [DONE]"), said
        assert '{"error"' not in resp.text, said
    else:
        assert resp.json()["choices"], said


@pytest.fixture(scope="module", params=["http", "grpc"])
def stack(request: pytest.FixtureRequest) -> Iterator[PdStack]:
    with BackgroundPdStack(request.param) as s:
        yield s


def assert_still_serving(stack: PdStack) -> None:
    """Both engines healthy, the router ready, and a completion (plain and chat) correct."""
    for url in stack.engine_http_urls():
        assert requests.get(f"{url}/health", timeout=TIMEOUT_S).status_code == 200
    assert requests.get(f"{stack.url}/readiness", timeout=TIMEOUT_S).status_code == 200
    prompt = "[pdchaos:fuzz:after] alpha bravo"
    done = requests.post(f"{stack.url}/v1/completions", json={"prompt": prompt, "max_tokens": 6},
                         timeout=TIMEOUT_S)
    assert done.status_code == 200 and done.json()["choices"][0]["text"] == expected_completion(prompt, 6)
    messages = [{"role": "user", "content": prompt}]
    chat = requests.post(f"{stack.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 5},
                         timeout=TIMEOUT_S)
    assert chat.json()["choices"][0]["message"]["content"] == expected_chat_completion(messages, 5)


def fuzz_router(stack: PdStack, examples: int, fixed: bool) -> None:
    """`examples` drawn bodies through the router (`fixed`: the same ones every run), then still serving."""
    session = requests.Session()

    @settings(max_examples=examples, deadline=None, database=None, derandomize=fixed,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(requests_())
    def one(request: tuple[str, bytes]) -> None:
        path, raw = request
        resp = session.post(f"{stack.url}{path}", data=raw, headers={"Content-Type": "application/json"},
                            timeout=TIMEOUT_S)
        check_answer(path, raw, resp)

    try:
        one()
    finally:
        session.close()
    assert_still_serving(stack)


def fuzz_engines(stack: PdStack, examples: int, fixed: bool) -> None:
    """The same bodies straight at the fake engines' HTTP surface (no router in front): never a 5xx."""
    session = requests.Session()
    urls = stack.engine_http_urls()

    @settings(max_examples=examples, deadline=None, database=None, derandomize=fixed,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(requests_(), st.sampled_from(urls))
    def one(request: tuple[str, bytes], url: str) -> None:
        path, raw = request
        resp = session.post(f"{url}{path}", data=raw, headers={"Content-Type": "application/json"},
                            timeout=TIMEOUT_S)
        said = f"{url}{path} {raw[:300]!r} -> {resp.status_code} {resp.text[:300]!r}"
        assert resp.status_code < 500, said
        if resp.status_code >= 400:
            assert resp.json()["error"]["code"] == resp.status_code, said

    try:
        one()
    finally:
        session.close()
    assert_still_serving(stack)


def test_no_client_mistake_gets_a_5xx_and_the_engines_stay_healthy(stack: PdStack) -> None:
    fuzz_router(stack, EXAMPLES, fixed=True)


def test_the_engines_answer_client_mistakes_with_a_4xx_too(stack: PdStack) -> None:
    if stack.transport != "http":
        pytest.skip("the engines' HTTP surface is the same whatever the router's transport")
    fuzz_engines(stack, EXAMPLES, fixed=True)


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="slow: set PDCHAOS_SLOW=1")
def test_many_random_bodies(stack: PdStack) -> None:
    """New random bodies every run, many of them, through the router and straight at the engines."""
    fuzz_router(stack, SLOW_EXAMPLES, fixed=False)
    if stack.transport == "http":
        fuzz_engines(stack, SLOW_EXAMPLES, fixed=False)
