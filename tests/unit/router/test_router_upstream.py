"""The router's upstream clients on their own: failures become UpstreamError, never a cancelled task."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from fake_engines.core.tokenizer import data_dir, eos_token_id
from reference_router.core import Delivery, ReadOutcome, Role, Worker, make_worker_spec
from reference_router.errors import UpstreamError
from reference_router.prober import Prober, parse_bootstrap_query
from reference_router.stub_engines import GrpcStubEngine, StubState
from reference_router.tokenizer import load_from_dir
from reference_router.transports import Transports
from reference_router.upstream_grpc import GrpcWorker, build_generate_request, grpc_delivery


async def test_generate_on_a_channel_closed_under_it_is_an_upstream_error() -> None:
    stub = await GrpcStubEngine(StubState("d", "decode", "nixl")).start()
    client = GrpcWorker(f"127.0.0.1:{stub.port}")
    try:
        stub.state.hang_generate = True
        req = build_generate_request({"max_tokens": 2}, [1, 2, 3], "abc", None)
        call = asyncio.ensure_future(client.generate_complete(req, 10.0))
        await asyncio.sleep(0.2)
        await client.close()  # what replacing a failing channel does to the calls on the old one
        with pytest.raises(UpstreamError) as exc:
            await asyncio.wait_for(call, 5.0)
        assert exc.value.delivery is Delivery.MAYBE_SENT  # the engine may have seen it: never run again
    finally:
        stub.state.hang_generate = False
        await client.close()
        await stub.stop()


@pytest.mark.parametrize(("code", "details", "delivery"), [
    (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: ...", Delivery.NOT_SENT),
    (grpc.StatusCode.UNAVAILABLE, "Socket closed", Delivery.MAYBE_SENT),
    (grpc.StatusCode.CANCELLED, "Channel closed!", Delivery.MAYBE_SENT),
    (grpc.StatusCode.INTERNAL, "Received RST_STREAM with error code 2", Delivery.MAYBE_SENT),
    (grpc.StatusCode.INTERNAL, "KV load failed: connection reset", Delivery.ANSWERED),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", Delivery.ANSWERED),
])
def test_grpc_delivery_tells_the_engines_answer_from_a_broken_transport(
    code: grpc.StatusCode, details: str, delivery: Delivery
) -> None:
    assert grpc_delivery(code, details) is delivery


async def test_grpc_deadline_is_a_504_upstream_timeout() -> None:
    stub = await GrpcStubEngine(StubState("d", "decode", "nixl")).start()
    client = GrpcWorker(f"127.0.0.1:{stub.port}")
    try:
        stub.state.hang_generate = True
        req = build_generate_request({"max_tokens": 2}, [1], "a", {"x": 1})
        with pytest.raises(UpstreamError) as exc:
            await client.generate_complete(req, 0.2)
        assert exc.value.status == 504 and exc.value.code == "upstream_timeout"
    finally:
        stub.state.hang_generate = False
        await client.close()
        await stub.stop()


async def test_probe_and_read_of_a_dead_address_fail_within_the_timeout() -> None:
    transports = Transports()
    prober = Prober(transports)
    workers = [
        Worker.new("g", make_worker_spec("grpc://127.0.0.1:9", Role.PREFILL, connector="mooncake")),
        Worker.new("h", make_worker_spec("http://127.0.0.1:9", Role.PREFILL, bootstrap_port=9)),
    ]
    try:
        for w in workers:
            assert await asyncio.wait_for(prober.probe(w, 0.5), 2.0) is False
            read = await asyncio.wait_for(prober.read_metadata(w, 0.5), 2.0)
            assert read.outcome in (ReadOutcome.ERROR, ReadOutcome.TIMEOUT)
    finally:
        await transports.close()


def test_bootstrap_query_parsing() -> None:
    one = parse_bootstrap_query({"0": {"engine_id": "abc", "worker_addr": {"0": {"0": "tcp://h:1"}}}})
    assert (one.outcome, one.engine_id, one.dp_size) == (ReadOutcome.COMPLETE, "abc", 1)
    two = parse_bootstrap_query({"0": {"engine_id": "abc_dp0"}, "1": {"engine_id": "abc_dp1"}})
    assert (two.engine_id, two.dp_size) == ("abc", 2)
    none = parse_bootstrap_query({"0": {"engine_id": ""}})
    assert (none.outcome, none.engine_id) == (ReadOutcome.COMPLETE, None)
    bads: list[object] = [{}, [], "x", {"0": 5}]
    for bad in bads:
        assert parse_bootstrap_query(bad).outcome is ReadOutcome.ERROR


def test_the_router_leaves_end_of_sequence_out_of_an_answer_and_keeps_it_in_a_prompt() -> None:
    codec = load_from_dir(data_dir())
    words = codec.encode(" alpha bravo")
    ended = [*words, eos_token_id()]
    assert codec.decode_output(ended) == " alpha bravo"
    # A prompt's text must round-trip its ids: special tokens kept.
    assert codec.decode(ended) == " alpha bravo<|endoftext|>"
    stream = codec.streamer()
    assert "".join(stream.push([t]) for t in ended) + stream.flush() == " alpha bravo"
