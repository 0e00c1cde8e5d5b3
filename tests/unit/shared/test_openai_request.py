"""The OpenAI request checks the router and the fake engines share (`pdchaos.openai_request`)."""

from __future__ import annotations

from collections import OrderedDict  # a Mapping that is not a dict

import pytest

from pdchaos.openai_request import (
    MAX_JSON_DEPTH,
    context_problem,
    max_tokens_of,
    request_problem,
    structure_problem,
    text_too_long,
)

OK = {"prompt": "hello", "max_tokens": 4}


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth - 1):
        value = [value]
    return value


def test_valid_requests_pass() -> None:
    assert request_problem(OK, chat=False) is None
    assert request_problem({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]},
                           chat=True) is None
    full = {**OK, "stream": True, "stream_options": {"include_usage": True}, "seed": -3, "temperature": 0,
            "top_p": 1, "top_k": -1, "stop": ["a"], "n": 1}
    assert request_problem(full, chat=False) is None
    assert request_problem({**OK, "stream": None, "n": None, "stream_options": None}, chat=False) is None


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"max_tokens": 0}, "positive"),
        ({"max_tokens": True}, "positive"),
        ({"max_tokens": 2**32}, "out of range"),
        ({"n": 2}, "n=1"),
        ({"temperature": float("nan")}, "number"),
        ({"temperature": -1}, "temperature"),
        ({"seed": 2**31}, "seed"),
        ({"prompt": ["a", "b"]}, "batches"),
        ({"prompt": [1, True]}, "token ids"),
        ({"prompt": "\ud800"}, "Unicode"),
        ({"weird\udfff": 1}, "Unicode"),
        ({"stream_options": {"include_usage": True}}, "stream is true"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "include_usage"),
        ({"kv_transfer_params": []}, "object"),
        ({"prompt": nested(MAX_JSON_DEPTH + 1)}, "nested deeper"),
    ],
)
def test_client_mistakes(change: dict[str, object], needle: str) -> None:
    problem = request_problem({**OK, **change}, chat=False)
    assert problem is not None and needle in problem


def test_json_depth_is_walked_without_recursion() -> None:
    assert structure_problem(nested(MAX_JSON_DEPTH)) is None
    assert structure_problem(nested(50_000)) is not None  # deeper than Python's recursion limit


def test_one_walk_finds_lone_surrogates_anywhere_and_depth_first() -> None:
    bad = "x\ud800"
    assert structure_problem({"prompt": "caf\u00e9 \u4e2d\u6587 \U0001f600"}) is None
    for value in ({bad: 1}, {"a": [1, {"b": bad}]}, OrderedDict(k=[bad]), [None, 2.5, True, bad]):
        assert "lone surrogate" in (structure_problem(value) or ""), value
    both = {"a": bad, "b": nested(MAX_JSON_DEPTH + 1)}
    assert "nested deeper" in (structure_problem(both) or "")
    assert structure_problem(OrderedDict(a=nested(MAX_JSON_DEPTH))) is not None
    assert structure_problem(OrderedDict(a=nested(MAX_JSON_DEPTH - 1))) is None


def test_context_budget_like_vllm() -> None:
    assert context_problem(10, 32758, 32768) is None
    assert "too large: 32759" in (context_problem(10, 32759, 32768) or "")
    assert "your prompt has 32768 tokens" in (context_problem(32768, 1, 32768) or "")
    assert context_problem(None, 32767, 32768) is None and context_problem(None, 32768, 32768) is not None
    assert max_tokens_of({"max_tokens": 3, "max_completion_tokens": 5}, chat=True) == 5
    assert max_tokens_of({"max_tokens": 3, "max_completion_tokens": 5}, chat=False) == 3


def test_text_too_long_before_tokenizing() -> None:
    assert text_too_long("a" * 100, context=10, max_token_chars=10) is None
    assert text_too_long("a" * 101, context=10, max_token_chars=10) is not None
