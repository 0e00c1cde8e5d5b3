"""Sans-IO parts of the embedded Toxiproxy: toxic parsing, stages, chains, registry rules."""

from __future__ import annotations

import random

import pytest

from harness.toxiproxy.chain import DirectionChain, unit_draw
from harness.toxiproxy.errors import ApiError
from harness.toxiproxy.registry import ProxyRegistry, parse_listen, parse_upstream
from harness.toxiproxy.stages import Bandwidth, Latency, LimitData, ResetPeer, Slicer, SlowClose, Timeout
from harness.toxiproxy.toxics import ToxicSpec, parse_new_toxic, update_toxic


def toxic(
    kind: str, version: int = 1, toxicity: float = 1.0, name: str | None = None, **attrs: int
) -> ToxicSpec:
    body: dict[str, object] = {"type": kind, "toxicity": toxicity, "attributes": attrs}
    if name:
        body["name"] = name
    return parse_new_toxic(body, version)


# --- toxic parsing --------------------------------------------------------------------------------


def test_new_toxic_defaults_follow_toxiproxy() -> None:
    spec = parse_new_toxic({"type": "latency", "attributes": {"latency": 100}}, 7)
    assert spec.name == "latency_downstream"
    assert spec.stream == "downstream"
    assert spec.toxicity == 1.0
    assert spec.version == 7
    assert spec.to_json() == {
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 100, "jitter": 0},
    }
    up = parse_new_toxic({"type": "timeout", "stream": "UPSTREAM"}, 1)
    assert (up.name, up.stream, dict(up.attributes)) == ("timeout_upstream", "upstream", {"timeout": 0})


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"type": "nope"}, "invalid toxic type"),
        ({"stream": "sideways", "type": "latency"}, "stream was invalid"),
        ({"type": "latency", "attributes": {"latency": -1}}, "negative"),
        ({"type": "latency", "attributes": {"latency": "10"}}, "number"),
        ({"type": "latency", "attributes": {"latency": 1.5}}, "integer"),
        ({"type": "latency", "attributes": {"latency": True}}, "number"),
        ({"type": "latency", "attributes": [1]}, "object"),
        ({"type": "latency", "toxicity": 1.5}, "toxicity"),
        ({"type": "latency", "toxicity": "all"}, "toxicity"),
        ({"type": "slicer", "attributes": {"average_size": 0}}, "average_size"),
        ({"type": "slicer", "attributes": {"average_size": 10, "size_variation": 10}}, "size_variation"),
        (["latency"], "object"),
    ],
)
def test_bad_toxic_bodies_are_400(body: object, fragment: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_new_toxic(body, 1)
    assert err.value.status == 400
    assert fragment in err.value.message


def test_update_merges_attributes_and_keeps_identity() -> None:
    spec = toxic("latency", latency=100, jitter=10)
    updated = update_toxic(spec, {"attributes": {"jitter": 20}}, 2)
    assert dict(updated.attributes) == {"latency": 100, "jitter": 20}
    assert (updated.name, updated.stream, updated.toxicity, updated.version) == (
        spec.name,
        spec.stream,
        1.0,
        2,
    )
    assert update_toxic(spec, {"toxicity": 0.25}, 3).toxicity == 0.25
    with pytest.raises(ApiError):
        update_toxic(spec, {"attributes": {"latency": -5}}, 4)


def test_unknown_attributes_are_ignored() -> None:
    assert dict(toxic("bandwidth", rate=5, colour=3).attributes) == {"rate": 5}


# --- stages ---------------------------------------------------------------------------------------


def test_latency_delays_and_never_reorders() -> None:
    stage = Latency(100, 50, random.Random(1))
    outs = [stage.on_data(b"x", i * 0.005)[0] for i in range(20)]
    times = [o.at for o in outs]
    assert times == sorted(times)
    assert len(set(times)) > 5  # jitter varies the delay
    for i, at in enumerate(times):
        sent = i * 0.005
        assert at >= sent + 0.05 - 1e-9
        assert at <= max(sent + 0.15, times[i - 1] if i else 0.0) + 1e-9
    assert stage.on_eof(0.0)[0].at == times[-1]
    assert Latency(100, 0, random.Random(1)).on_data(b"y", 1.0)[0].at == pytest.approx(1.1)


def test_bandwidth_spaces_bytes_at_the_rate() -> None:
    stage = Bandwidth(100)  # 100 KB/s
    outs = stage.on_data(b"a" * 50_000, 1.0)
    assert b"".join(o.data for o in outs) == b"a" * 50_000
    assert outs[-1].at == pytest.approx(1.5)
    assert max(len(o.data) for o in outs) == 2000  # 20 ms slices
    # Back-to-back data queues behind the first.
    assert stage.on_data(b"b" * 1000, 1.1)[-1].at == pytest.approx(1.51)


def test_bandwidth_rate_0_holds_everything_until_released() -> None:
    """Issue 16: as in Toxiproxy, a rate of 0 passes no byte (it was taken as 'no limit'); the toxic's
    removal lets what it held go on, in order, end of stream last."""
    stage = Bandwidth(0)
    assert stage.on_data(b"z" * 10, 2.0) == []
    assert stage.on_data(b"y", 2.5) == [] and stage.on_eof(3.0) == []
    assert stage.release(4.0) == [(4.0, "data", b"z" * 10), (4.0, "data", b"y"), (4.0, "eof", b"")]
    assert stage.release(5.0) == []


def test_chain_releases_a_rate_0_bandwidth_when_the_toxic_goes() -> None:
    chain = DirectionChain(0, "p", 0, "downstream")
    stall = ToxicSpec("stall", "bandwidth", "downstream", 1.0, {"rate": 0}, version=1)
    chain.sync([stall], 0.0)
    chain.feed(b"hello", 1.0)
    assert chain.poll(10.0) == []
    chain.sync([], 11.0)
    assert chain.poll(11.0) == [(11.0, "data", b"hello")]


def test_slow_close_delays_only_the_end() -> None:
    stage = SlowClose(200)
    assert stage.on_data(b"hi", 1.0)[0].at == 1.0
    assert stage.on_eof(1.0) == [(pytest.approx(1.2), "eof", b"")]


def test_timeout_swallows_and_closes_after_its_timeout() -> None:
    hold = Timeout(0, attached_at=5.0)
    assert hold.on_data(b"data", 5.1) == []
    assert hold.deadline() is None
    assert hold.on_eof(6.0)[0].kind == "eof"
    closing = Timeout(300, attached_at=5.0)
    assert closing.deadline() == pytest.approx(5.3)
    assert closing.on_time(5.2) == []
    assert closing.on_time(5.4) == [(pytest.approx(5.3), "close", b"")]
    assert closing.deadline() is None


def test_reset_peer_arms_on_first_arrival() -> None:
    stage = ResetPeer(100)
    assert stage.deadline() is None
    assert stage.on_data(b"x", 2.0) == []
    assert stage.on_data(b"y", 2.05) == []
    assert stage.deadline() == pytest.approx(2.1)
    assert stage.on_time(2.2) == [(pytest.approx(2.1), "reset", b"")]
    assert stage.on_data(b"z", 3.0) == [] and stage.deadline() is None


def test_slicer_splits_within_the_variation() -> None:
    stage = Slicer(100, 20, 10_000, random.Random(3))
    data = bytes(range(256)) * 8
    outs = stage.on_data(data, 0.0)
    assert b"".join(o.data for o in outs) == data
    sizes = [len(o.data) for o in outs]
    assert all(80 <= s <= 120 for s in sizes[:-1]) and 0 < sizes[-1] <= 120
    assert [o.at for o in outs] == pytest.approx([i * 0.01 for i in range(len(outs))])
    assert len(Slicer(100, 20, 0, random.Random(3)).on_data(b"q" * 110, 0.0)) == 1


def test_limit_data_passes_exactly_n_bytes_then_closes() -> None:
    stage = LimitData(10)
    assert stage.on_data(b"123456", 0.0) == [(0.0, "data", b"123456")]
    assert stage.on_data(b"789abc", 0.1) == [(0.1, "data", b"789a"), (0.1, "close", b"")]
    assert stage.on_data(b"more", 0.2) == []
    renewed = LimitData(12)
    renewed.inherit(stage)
    assert renewed.on_data(b"xyz", 0.3) == [(0.3, "data", b"xy"), (0.3, "close", b"")]


# --- chains ---------------------------------------------------------------------------------------


def test_chain_composes_stages_in_order() -> None:
    chain = DirectionChain(0, "p", 0, "downstream")
    chain.sync([toxic("latency", 1, latency=100), toxic("limit_data", 2, bytes=4)], now=0.0)
    chain.feed(b"abcdef", 1.0)
    assert chain.poll(1.05) == []
    assert chain.next_deadline() == pytest.approx(1.1)
    assert chain.poll(1.2) == [(pytest.approx(1.1), "data", b"abcd"), (pytest.approx(1.1), "close", b"")]
    assert chain.ended and chain.poll(2.0) == [] and chain.next_deadline() is None


def test_chain_terminal_discards_later_data() -> None:
    chain = DirectionChain(0, "p", 0, "upstream")
    chain.sync([toxic("latency", 1, latency=500), toxic("timeout", 2, timeout=100)], now=0.0)
    chain.feed(b"late", 0.0)  # swallowed by the timeout stage after the latency
    assert chain.poll(0.2) == [(pytest.approx(0.1), "close", b"")]


def test_chain_applies_toxic_changes_to_live_connection() -> None:
    chain = DirectionChain(0, "p", 0, "downstream")
    chain.feed(b"a", 0.0)
    assert chain.poll(0.0) == [(0.0, "data", b"a")]
    chain.sync([toxic("latency", 1, latency=200)], now=0.5)
    chain.feed(b"b", 1.0)
    assert chain.poll(1.1) == []
    assert chain.poll(1.2) == [(pytest.approx(1.2), "data", b"b")]
    chain.sync([], now=1.3)
    chain.feed(b"c", 1.4)
    assert chain.poll(1.4) == [(1.4, "data", b"c")]


def test_chain_keeps_fifo_when_a_toxic_is_removed() -> None:
    chain = DirectionChain(0, "p", 0, "downstream")
    chain.sync([toxic("latency", 1, latency=300)], now=0.0)
    chain.feed(b"first", 0.0)
    chain.sync([], now=0.1)
    chain.feed(b"second", 0.1)
    assert chain.poll(0.2) == []  # "second" may not overtake "first"
    assert [o.data for o in chain.poll(0.3)] == [b"first", b"second"]


def test_update_keeps_limit_data_count() -> None:
    chain = DirectionChain(0, "p", 0, "downstream")
    first = toxic("limit_data", 1, bytes=5)
    chain.sync([first], now=0.0)
    chain.feed(b"abc", 0.0)
    chain.sync([update_toxic(first, {"attributes": {"bytes": 6}}, 2)], now=0.1)
    chain.feed(b"defg", 0.2)
    assert chain.poll(0.2) == [(0.0, "data", b"abc"), (0.2, "data", b"def"), (0.2, "close", b"")]


def test_timeout_clock_starts_when_the_toxic_is_added() -> None:
    chain = DirectionChain(0, "p", 0, "downstream")
    chain.sync([toxic("timeout", 1, timeout=200)], now=10.0)
    assert chain.next_deadline() == pytest.approx(10.2)
    chain.sync([], now=10.1)  # removed in time: no close
    assert chain.poll(11.0) == [] and not chain.ended


def test_eof_passes_through_and_stops_input() -> None:
    chain = DirectionChain(0, "p", 0, "upstream")
    chain.sync([toxic("slow_close", 1, delay=100)], now=0.0)
    chain.feed(b"x", 0.0)
    chain.feed_eof(0.0)
    chain.feed(b"after", 0.01)
    assert chain.poll(0.05) == [(0.0, "data", b"x")]
    assert chain.poll(0.2) == [(pytest.approx(0.1), "eof", b"")]


def test_toxicity_draws_are_seeded_and_replay() -> None:
    def hits(seed: int) -> list[bool]:
        out = []
        for conn in range(64):
            chain = DirectionChain(seed, "p", conn, "downstream")
            chain.sync([toxic("latency", 1, toxicity=0.5, latency=10)], now=0.0)
            out.append(chain.active_toxics() == ["latency_downstream"])
        return out

    first = hits(1)
    assert first == hits(1)
    assert first != hits(2)
    assert 16 < sum(first) < 48
    assert unit_draw(1, "a") == unit_draw(1, "a") != unit_draw(1, "b")


def test_toxicity_zero_and_one() -> None:
    chain = DirectionChain(0, "p", 0, "downstream")
    chain.sync([toxic("latency", 1, toxicity=0.0, latency=100, name="never")], now=0.0)
    chain.feed(b"x", 0.0)
    assert chain.poll(0.0) == [(0.0, "data", b"x")]
    assert chain.active_toxics() == []


# --- registry -------------------------------------------------------------------------------------


def test_addresses_are_loopback_only() -> None:
    assert parse_listen("0.0.0.0:0") == ("127.0.0.1", 0)
    assert parse_listen("localhost:9000") == ("127.0.0.1", 9000)
    assert parse_listen("[::]:9000") == ("127.0.0.1", 9000)
    assert parse_listen("127.0.0.2:9000") == ("127.0.0.2", 9000)
    assert parse_upstream("localhost:80") == ("localhost", 80)
    assert parse_upstream("[::1]:80") == ("::1", 80)
    for bad in ("10.1.2.3:80", "example.com:80", "127.0.0.1", "127.0.0.1:x", "127.0.0.1:70000"):
        with pytest.raises(ApiError):
            parse_upstream(bad)
    with pytest.raises(ApiError):
        parse_upstream("127.0.0.1:0")
    with pytest.raises(ApiError):
        parse_listen("192.168.1.1:80")


def test_registry_errors() -> None:
    reg = ProxyRegistry()
    spec = reg.check_new({"name": "a", "upstream": "127.0.0.1:9"})
    assert (spec.listen, spec.enabled) == ("127.0.0.1:0", True)
    reg.add(spec)
    with pytest.raises(ApiError) as err:
        reg.check_new({"name": "a", "upstream": "127.0.0.1:9"})
    assert err.value.status == 409
    for body, field in (({"upstream": "127.0.0.1:9"}, "name"), ({"name": "b"}, "upstream")):
        with pytest.raises(ApiError) as err:
            reg.check_new(body)
        assert (err.value.status, err.value.message) == (400, f"missing required field: {field}")
    with pytest.raises(ApiError) as err:
        reg.get("zz")
    assert err.value.status == 404
    reg.add_toxic("a", {"type": "latency"})
    with pytest.raises(ApiError) as err:
        reg.add_toxic("a", {"type": "latency", "stream": "downstream"})
    assert err.value.status == 409
    with pytest.raises(ApiError) as err:
        reg.remove_toxic("a", "nope")
    assert err.value.status == 404
    with pytest.raises(ApiError) as err:
        reg.plan_update("a", {"enabled": "yes"})
    assert err.value.status == 400


def test_registry_lists_upstream_toxics_first_and_versions_grow() -> None:
    reg = ProxyRegistry()
    reg.add(reg.check_new({"name": "a", "upstream": "127.0.0.1:9"}))
    first = reg.add_toxic("a", {"type": "latency"})
    second = reg.add_toxic("a", {"type": "latency", "stream": "upstream"})
    assert [t["name"] for t in reg.get("a").toxics_json()] == ["latency_upstream", "latency_downstream"]
    assert second.version > first.version
    assert reg.update_toxic("a", "latency_downstream", {}).version > second.version


def test_populate_plan_validates_everything_first() -> None:
    reg = ProxyRegistry()
    with pytest.raises(ApiError) as err:
        reg.plan_populate([{"name": "a", "upstream": "127.0.0.1:9"}, {"name": "b"}])
    assert err.value.message == "missing required field: upstream at proxy 2"
    with pytest.raises(ApiError):
        reg.plan_populate([{"name": "a", "upstream": "127.0.0.1:9"}] * 2)
    with pytest.raises(ApiError):
        reg.plan_populate({"name": "a"})
    assert [s.name for s in reg.plan_populate([{"name": "x", "upstream": "127.0.0.1:9"}])] == ["x"]
