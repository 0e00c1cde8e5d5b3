"""Streamed answers in simulated time follow the real shells: a streamed leg keeps its connection while its
tokens go out, so a decode that dies mid-stream breaks the client's stream (a 200 that ends with an error
chunk); the client has its 200 once the engine's headers reached the router (HTTP) or the first token did
(gRPC), so a link that never lets the headers through is a plain 504."""

from __future__ import annotations

import collections
from dataclasses import replace
from pathlib import Path

import pytest

from harness.runner import run_scenario
from harness.scenario import At, Crash, Expect, Respawn, Scenario, Step, load_scenarios
from pdchaos.jsonl import read_jsonl

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
