"""Streamed answers in simulated time follow the real shells: a streamed leg keeps its connection while its
tokens go out, so a decode that dies mid-stream breaks the client's stream (a 200 that ends with an error
chunk); the client has its 200 once the engine's headers reached the router (HTTP) or the first token did
(gRPC), so a link that never lets the headers through is a plain 504."""

from __future__ import annotations

import collections
from dataclasses import replace
from pathlib import Path

import pytest

from fake_engines.core.generator import expected_completion
from fake_engines.core.tokenizer import decode, encode, eos_token_id
from harness.runner import run_scenario
from harness.scenario import (
    At,
    Crash,
    Expect,
    HealLink,
    LinkLatency,
    LinkReset,
    Partition,
    Respawn,
    Scenario,
    Step,
    load_scenarios,
)
from harness.worlds.sim.router import grpc_text
from pdchaos.jsonl import read_jsonl
from pdchaos.stop_strings import cut_at_stop

SCENARIOS = {s.name: s for s in load_scenarios()}


def _answers(out: Path) -> collections.Counter[tuple[int | None, str]]:
    """(status, error's first words) of every request that did not end cleanly."""
    seen: collections.Counter[tuple[int | None, str]] = collections.Counter()
    for rec in read_jsonl(out / "history.jsonl"):
        if rec.get("type") == "request_completed" and rec.get("error"):
            seen[(rec.get("status"), str(rec["error"]))] += 1
    return seen


def _streams_with_a_decode_crash() -> Scenario:
    s = SCENARIOS["decode_link_wedged"]
    return replace(
        s, name="decode_crash_mid_stream",
        timeline=(Step("crash", Crash("decode-1"), At(1.5)), Step("back", Respawn("decode-1"), At(4.0))),
        engines=replace(s.engines, ttft_ms=30.0, itl_ms=150.0),
        workload=replace(s.workload, stream_fraction=1.0, concurrency=6, duration_s=6.0),
        expect=(Expect("nothing_lost"),),
    )


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_a_decode_that_dies_mid_stream_breaks_its_streams(transport: str, tmp_path: Path) -> None:
    res = await run_scenario(_streams_with_a_decode_crash(), "1p2d", "nixl", transport, "reference", tmp_path,
                             seed=1, world="sim", settings="scaled")
    assert res.status == "pass", res.reason
    broken = {k: n for k, n in _answers(tmp_path).items() if k[0] == 200}
    assert broken, _answers(tmp_path)  # each was a 200 whose stream then ended with an error
    if transport == "http":
        assert all("decode-1 stream broke: connection reset" in err for _, err in broken)


async def test_a_stream_whose_headers_never_get_through_is_a_plain_504(tmp_path: Path) -> None:
    s = SCENARIOS["decode_link_wedged"]
    s = replace(s, workload=replace(s.workload, stream_fraction=1.0))
    await run_scenario(s, "1p2d", "mooncake", "http", "reference", tmp_path, seed=1, world="sim",
                       settings="scaled")
    failed = _answers(tmp_path)
    assert failed and all(status == 504 for status, _ in failed), failed


@pytest.mark.parametrize(("fault", "words"), [
    (Partition("decode-0", "serve", "timeout"), "decode-0 stream overran 2s"),
    (LinkReset("decode-0", "serve", timeout_ms=0, stream="downstream"),
     "decode-0 stream broke: connection reset"),
    (Partition("decode-0", "serve", "down"), "decode-0 stream broke: connection closed"),
])
async def test_a_link_fault_mid_stream_ends_streams_already_answered_with_an_error_chunk(
        fault: object, words: str, tmp_path: Path) -> None:
    """The streams were answered (their headers, even tokens, reached the router) before the link went bad:
    whatever the fault does to them later, the client has its 200 and the stream ends with an error."""
    s = SCENARIOS["decode_link_wedged"]
    s = replace(s, name="decode_link_fault_mid_stream", topologies=("1p1d",),
                engines=replace(s.engines, ttft_ms=30.0, itl_ms=150.0),
                workload=replace(s.workload, stream_fraction=1.0, concurrency=6, duration_s=6.0),
                timeline=(Step("fault", fault, At(1.5)),  # type: ignore[arg-type]
                          Step("heal", HealLink("decode-0"), At(4.5))),
                expect=(Expect("nothing_lost"),))
    await run_scenario(s, "1p1d", "nixl", "http", "reference", tmp_path, seed=1, world="sim",
                       settings="scaled")
    caught = [(status, err) for (status, err), n in _answers(tmp_path).items() for _ in range(n)
              if err.startswith("decode-0 stream")]
    # The six clients' streams open at the fault; the requests after it fail before any answer.
    assert len(caught) == 6 and all(status == 200 and err == words for status, err in caught), caught


async def test_a_stream_s_first_token_never_comes_after_its_last(tmp_path: Path) -> None:
    """A latency fault gone while a stream runs makes its last message quicker than its first: the client
    still reads them in order."""
    s = SCENARIOS["decode_link_wedged"]
    s = replace(s, name="decode_link_slow_then_healed", topologies=("1p1d",),
                engines=replace(s.engines, ttft_ms=30.0, itl_ms=150.0),
                workload=replace(s.workload, stream_fraction=1.0, concurrency=6, duration_s=4.0),
                timeline=(Step("slow", LinkLatency("decode-0", "serve", 1500, stream="downstream"), At(1.0)),
                          Step("heal", HealLink("decode-0"), At(1.2))),
                expect=(Expect("nothing_lost"),))
    await run_scenario(s, "1p1d", "nixl", "http", "reference", tmp_path, seed=1, world="sim",
                       settings="scaled")
    done = [r for r in read_jsonl(tmp_path / "history.jsonl") if r.get("type") == "request_completed"]
    assert done and all(r["ttft_s"] <= r["latency_s"] for r in done)


def test_grpc_text_streamed_through_the_routers_cutter_equals_the_whole_cut() -> None:
    ids = encode(expected_completion("[pdchaos:s:1] alpha bravo", 12))
    whole = decode(ids)
    # Output tokens are whole words: each decodes alone, and the pieces make the whole.
    assert "".join(decode([t]) for t in ids) == whole
    third = whole.split()[2]
    for stream in (False, True):
        body = {"stream": stream, "stop": [third]}
        assert grpc_text(ids, body) == cut_at_stop(whole, [third]) == whole[:whole.index(third)]
        assert grpc_text(ids, {"stream": stream}) == whole
        # An answer ended by end of sequence: the router leaves its id out of the text, streamed or not,
        # and a stop string it never meets holds nothing back at the end.
        ended = [*ids, eos_token_id()]
        assert grpc_text(ended, {"stream": stream}) == whole
        assert grpc_text(ended, {"stream": stream, "stop": ["###"]}) == whole
