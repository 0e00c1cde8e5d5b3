"""The router's bug switches: each is off by default, and each, switched on, changes exactly the decision its
zoo entry names (the correct decision is pinned by the other core tests)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from pdchaos.bugs import list_text
from reference_router.cli import main as router_main
from reference_router.core import (
    LEG_RETRIES_TOTAL,
    BreakerConfig,
    Counters,
    Delivery,
    DispatchFlow,
    DispatchLimits,
    HealthConfig,
    LegError,
    LegPolicies,
    MetadataRead,
    MetricInc,
    ReadOutcome,
    Role,
    Status,
    Worker,
    WorkerRegistry,
    apply_metadata_read,
    apply_property_update,
    breaker_failure,
    decide_engine_id,
    dispatch_serialized,
    identity_check_eligible,
    make_worker_spec,
    next_status,
    own_failure,
    worker_api_dict,
)
from reference_router.core import bugs as b
from reference_router.core.health_tick import on_probe_done, start_tick

LIMITS = DispatchLimits(request_timeout_s=10.0, id_read_wait_s=0.5)
BODY: dict[str, Any] = {"prompt": "x", "max_tokens": 5}
REFUSED = LegError(502, "upstream_error", "connection refused", Delivery.NOT_SENT)
KV_FAILED = LegError(502, "upstream_error", "answered 500: KV load failed: reset", Delivery.ANSWERED,
                     worker_status=500, worker_message="KV load failed: reset")
TIMED_OUT = LegError(504, "upstream_timeout", "decode-0 timed out after 1s")


def _ready(w: Worker, engine_id: str | None = None) -> Worker:
    w.runtime.status = Status.READY
    w.runtime.engine_id = engine_id
    w.runtime.engine_id_confirmed = True
    return w


def _cluster(connector: str = "mooncake", prefills: int = 1, decodes: int = 1,
             bugs: frozenset[str] = frozenset()) -> WorkerRegistry:
    reg = WorkerRegistry(bugs)
    for i in range(prefills):
        _ready(reg.add(make_worker_spec(f"http://127.0.0.1:{8100 + i}", "prefill", connector=connector)),
               f"eng-p{i}")
    for i in range(decodes):
        _ready(reg.add(make_worker_spec(f"http://127.0.0.1:{8200 + i}", "decode", connector=connector)))
    return reg


def _flow(reg: WorkerRegistry, *bugs: str) -> DispatchFlow:
    on = frozenset(bugs)
    return DispatchFlow("req-1", BODY, reg, LegPolicies.make("round_robin", "round_robin", bugs=on), LIMITS,
                        new_uuid=lambda: uuid.UUID(int=7), bugs=on)


# ---------------------------------------------------------------- the catalogue


def test_every_zoo_entry_has_a_switch_and_every_switch_says_what_and_where() -> None:
    zoo = {sw.zoo for sw in b.ROUTER_BUGS.values()}
    assert {f"zoo-{n}" for n in range(1, 15)} <= zoo
    for sw in b.ROUTER_BUGS.values():
        assert sw.side == "router" and sw.symptom and sw.reference
        assert set(sw.transports) <= {"http", "grpc"} and set(sw.connectors) <= {"mooncake", "nixl"}


def test_list_bugs_prints_every_switch(capsys: pytest.CaptureFixture[str]) -> None:
    assert router_main(["--list-bugs"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == list_text(b.ROUTER_BUGS.values()).strip()
    for name in b.ROUTER_BUGS:
        assert name in out


def test_unknown_switch_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="nonsense"):
        b.validate_bugs(["nonsense"])
    with pytest.raises(ValueError):
        HealthConfig(bugs=frozenset({"nonsense"}))


# ---------------------------------------------------------------- health and engine id


def test_reread_no_retry_takes_a_failed_read_as_final() -> None:
    err = MetadataRead(ReadOutcome.ERROR)
    assert decide_engine_id("old", err).confirmed is False
    assert decide_engine_id("old", err, frozenset({b.REREAD_NO_RETRY})).confirmed is True


def test_reread_every_probe_leaves_an_id_less_read_unconfirmed() -> None:
    no_id = MetadataRead(ReadOutcome.COMPLETE, engine_id=None)
    assert decide_engine_id("old", no_id).confirmed is True
    assert decide_engine_id("old", no_id, frozenset({b.REREAD_EVERY_PROBE})).confirmed is False


def test_failed_terminal_never_promotes_a_failed_worker() -> None:
    cfg = HealthConfig(failure_threshold=1, success_threshold=1)
    assert next_status(Status.FAILED, Counters(), True, cfg)[0] is Status.READY
    buggy = HealthConfig(failure_threshold=1, success_threshold=1, bugs=frozenset({b.FAILED_TERMINAL}))
    assert next_status(Status.FAILED, Counters(), True, buggy)[0] is Status.FAILED


def test_no_identity_check_makes_no_worker_eligible() -> None:
    w = _ready(Worker.new("w1", make_worker_spec("http://127.0.0.1:8100", "prefill", connector="mooncake")))
    assert identity_check_eligible(w, HealthConfig())
    assert not identity_check_eligible(w, HealthConfig(bugs=frozenset({b.NO_IDENTITY_CHECK})))


def test_api_reports_first_id_shows_the_id_read_first() -> None:
    w = Worker.new("w1", make_worker_spec("http://127.0.0.1:8100", "prefill", connector="mooncake"))
    cfg = HealthConfig()
    apply_metadata_read(w, MetadataRead(ReadOutcome.COMPLETE, engine_id="first"), 1.0, cfg)
    apply_metadata_read(w, MetadataRead(ReadOutcome.COMPLETE, engine_id="second"), 2.0, cfg)
    assert worker_api_dict(w)["kv_engine_id"] == "second"
    assert worker_api_dict(w, frozenset({b.API_REPORTS_FIRST_ID}))["kv_engine_id"] == "first"


def test_patch_drops_kv_config_loses_connector_and_bootstrap_port() -> None:
    spec = make_worker_spec("http://127.0.0.1:8100", "prefill", connector="mooncake", bootstrap_port=9000)
    kept = apply_property_update(spec, {"priority": 3})
    assert (kept.connector.value, kept.bootstrap_port, kept.priority) == ("mooncake", 9000, 3)
    dropped = apply_property_update(spec, {"priority": 3}, frozenset({b.PATCH_DROPS_KV_CONFIG}))
    assert (dropped.connector.value, dropped.bootstrap_port) == ("none", None)


# ---------------------------------------------------------------- dispatch


def test_no_worker_404_answers_404_instead_of_503() -> None:
    reg = _cluster(prefills=0)
    answer = _flow(reg).pick(0.0)
    assert answer is not None and answer.status == 503
    answer = _flow(_cluster(prefills=0), b.NO_WORKER_404).pick(0.0)
    assert answer is not None and (answer.status, answer.code) == (404, "model_not_found")
    assert (answer.message, answer.type) == ("no prefill worker serves this model", "not_found")
    # prefill_on_decode with no decode either: the missing prefill is what the client hears about.
    alone = _flow(_cluster(prefills=0, decodes=0), b.PREFILL_ON_DECODE, b.NO_WORKER_404).pick(0.0)
    assert alone is not None and alone.message == "no prefill worker serves this model"


def test_prefill_on_decode_runs_the_request_on_the_decode_alone() -> None:
    reg = _cluster(prefills=0)
    f = _flow(reg, b.PREFILL_ON_DECODE)
    assert f.pick(0.0) is None and f.pd is False
    leg = f.regular_leg()
    assert leg.worker.role is Role.DECODE and "kv_transfer_params" not in leg.body


def test_no_prefill_retry_fails_a_refused_leg_another_prefill_could_serve() -> None:
    for bugs, retried in (((), True), ((b.NO_PREFILL_RETRY,), False)):
        f = _flow(_cluster(prefills=2), *bugs)
        f.pick(0.0)
        f.prefill_leg(0.0)
        failed = f.prefill_failed(REFUSED, 0.1)
        assert (failed.retry_on is not None) is retried
        assert (failed.answer is not None) is not retried


def _failed_decode(error: LegError, *bugs: str) -> DispatchFlow:
    """A flow whose decode leg just failed with `error`."""
    f = _flow(_cluster(), *bugs)
    f.pick(0.0)
    f.prefill_leg(0.0)
    f.prefill_done(None)
    assert f.final_done(error, now=0.2).answer is not None
    return f


def test_retry_failed_requests_runs_a_failed_leg_again_whole_with_smgs_backoff() -> None:
    assert _failed_decode(KV_FAILED).retry_backoff_s(1, 502) is None  # the correct router answers the failure
    f = _failed_decode(KV_FAILED, b.RETRY_FAILED_REQUESTS)
    waits = [f.retry_backoff_s(n, 502) for n in range(1, 6)]
    assert waits[:4] == pytest.approx([0.05, 0.075, 0.1125, 0.16875])
    assert waits[4] is None  # five attempts in all
    assert f.retry_backoff_s(1, 400) is None  # a client error is not transient
    refused = _flow(_cluster(prefills=0), b.RETRY_FAILED_REQUESTS)
    answer = refused.pick(0.0)
    assert answer is not None and refused.retry_backoff_s(1, answer.status) is None  # no leg ran


def test_retry_transport_failures_reruns_only_decode_legs_the_transport_broke() -> None:
    broken = LegError(502, "upstream_error", "stream broke", Delivery.MAYBE_SENT)
    for error in (broken, REFUSED):
        assert _failed_decode(error).retry_backoff_s(1, error.status) is None
        f = _failed_decode(error, b.RETRY_TRANSPORT_FAILURES)
        waits = [f.retry_backoff_s(n, error.status) for n in range(1, 6)]
        assert waits[:4] == pytest.approx([0.05, 0.075, 0.1125, 0.16875]) and waits[4] is None
    # The engine's own answer (a failed KV load) is final; the older switch retries it too.
    assert _failed_decode(KV_FAILED, b.RETRY_TRANSPORT_FAILURES).retry_backoff_s(1, 502) is None
    assert _failed_decode(KV_FAILED, b.RETRY_FAILED_REQUESTS).retry_backoff_s(1, 502) == pytest.approx(0.05)
    f = _flow(_cluster(prefills=1), b.RETRY_TRANSPORT_FAILURES)
    f.pick(0.0)
    f.prefill_leg(0.0)
    assert f.prefill_failed(REFUSED, 0.1).answer is not None  # no other prefill: the request fails...
    assert f.retry_backoff_s(1, 502) is None  # ...and is answered: only a decode's transport is retried


def test_legs_joined_sends_the_decode_after_a_failed_prefill() -> None:
    f = _flow(_cluster(), b.LEGS_JOINED)
    f.pick(0.0)
    f.prefill_leg(0.0)
    failed = f.prefill_failed(LegError(502, "upstream_error", "answered 500"), 0.1)
    assert failed.answer is None and failed.retry_on is None and failed.decode_anyway is not None
    assert failed.decode_anyway.worker.role is Role.DECODE
    assert failed.decode_anyway.body["kv_transfer_params"]["do_remote_prefill"] is True
    correct = _flow(_cluster())
    correct.pick(0.0)
    correct.prefill_leg(0.0)
    assert correct.prefill_failed(LegError(502, "upstream_error", "answered 500"), 0.1).decode_anyway is None


def test_nixl_not_relayed_drops_the_prefill_params() -> None:
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_host": "h", "remote_port": 1}
    for bugs, relayed in (((), True), ((b.NIXL_NOT_RELAYED,), False)):
        f = _flow(_cluster("nixl"), *bugs)
        f.pick(0.0)
        f.prefill_leg(0.0)
        final = f.prefill_done(params)
        assert ("kv_transfer_params" in final.body) is relayed


def test_no_request_timeout_gives_legs_no_real_deadline() -> None:
    f = _flow(_cluster(), b.NO_REQUEST_TIMEOUT)
    f.pick(0.0)
    assert f.prefill_leg(0.0).timeout_s > 1e5
    assert f.prefill_done(None).timeout_s > 1e5
    g = _flow(_cluster())
    g.pick(0.0)
    assert g.prefill_leg(0.0).timeout_s == 10.0


def test_error_as_200_and_wedged_stalls_all_are_asked_of_the_shells() -> None:
    assert _flow(_cluster(), b.ERROR_AS_200).masks_errors and not _flow(_cluster()).masks_errors
    assert dispatch_serialized(frozenset({b.WEDGED_STALLS_ALL})) and not dispatch_serialized(frozenset())


def test_shared_policy_uses_one_cursor_for_both_legs() -> None:
    own = LegPolicies.make("round_robin", "round_robin")
    assert own.prefill is not own.decode
    shared = LegPolicies.make("round_robin", "round_robin", bugs=frozenset({b.SHARED_POLICY}))
    assert shared.prefill is shared.decode
    reg = _cluster(prefills=1, decodes=2)
    decodes = set()
    for i in range(6):
        f = DispatchFlow(f"r{i}", BODY, reg, shared, LIMITS)
        f.pick(0.0)
        assert f.decode is not None
        decodes.add(f.decode.id)
        f.release()
    assert len(decodes) == 1  # every other worker: the second decode never gets a request


# ---------------------------------------------------------------- circuit breaker


def _decode() -> Worker:
    return _ready(Worker.new("d", make_worker_spec("http://127.0.0.1:8200", "decode", connector="nixl")))


def test_breaker_charges_kv_failure_counts_a_decode_kv_load_failure() -> None:
    assert own_failure(_decode(), KV_FAILED) is False
    assert own_failure(_decode(), KV_FAILED, frozenset({b.BREAKER_CHARGES_KV_FAILURE})) is True
    w = _decode()
    cfg = BreakerConfig(1, 5.0, frozenset({b.BREAKER_CHARGES_KV_FAILURE}))
    assert breaker_failure(w, "r", KV_FAILED, 0.0, cfg).of_type("breaker")
    assert w.runtime.breaker.state.value == "open"


def test_no_outlier_ejection_does_not_count_timeouts() -> None:
    assert own_failure(_decode(), TIMED_OUT) is True
    assert own_failure(_decode(), TIMED_OUT, frozenset({b.NO_OUTLIER_EJECTION})) is False


def test_breaker_no_readmit_keeps_a_recovered_worker_out() -> None:
    for bugs, closed in (((), True), ((b.BREAKER_NO_READMIT,), False)):
        cfg = HealthConfig(failure_threshold=1, success_threshold=1, interval_s=1.0, probe_timeout_s=0.5,
                           bugs=frozenset(bugs))
        w = _decode()
        breaker_failure(w, "r", TIMED_OUT, 0.0, BreakerConfig(1, 60.0))
        w.runtime.status = Status.FAILED
        plan = start_tick([w], 10.0, cfg)
        (probe,) = plan.probes
        done = on_probe_done(w, probe.token, True, 0.01, 10.0, cfg)
        assert w.status is Status.READY
        assert (w.runtime.breaker.state.value == "closed") is closed
        assert bool(done.effects.of_type("breaker")) is closed


# ---------------------------------------------------------------- what a switched-on decision records
# (mutation testing showed these fields unpinned: a zoo run reads them as its evidence)


@pytest.mark.parametrize(
    ("bug", "read", "want"),
    [
        (b.REREAD_EVERY_PROBE, MetadataRead(ReadOutcome.COMPLETE), ("old", False, "old", "no_id")),
        (b.PARTIAL_READ_CLEARS_ID, MetadataRead(ReadOutcome.PARTIAL), (None, False, "old", "error")),
        (b.REREAD_NO_RETRY, MetadataRead(ReadOutcome.ERROR), ("old", True, "old", "error")),
        (b.REREAD_NO_RETRY, MetadataRead(ReadOutcome.TIMEOUT), ("old", True, "old", "timeout")),
    ],
)
def test_an_injected_engine_id_decision_is_whole_and_says_it_is_injected(
    bug: str, read: MetadataRead, want: tuple[str | None, bool, str, str]
) -> None:
    d = decide_engine_id("old", read, frozenset({bug}))
    assert (d.engine_id, d.confirmed, d.previous, d.event_outcome) == want
    assert d.reason.endswith("(injected bug)")
    assert decide_engine_id("old", read).reason != d.reason


def test_no_prefill_retry_counts_the_refused_leg_as_having_no_other_worker() -> None:
    f = _flow(_cluster(prefills=2), b.NO_PREFILL_RETRY)
    f.pick(0.0)
    f.prefill_leg(0.0)
    failed = f.prefill_failed(REFUSED, 0.1)
    assert MetricInc(LEG_RETRIES_TOTAL, {"leg": "prefill", "outcome": "no_other_ready_worker"}) in (
        failed.effects.metrics
    )
    assert f.failed_delivery is Delivery.NOT_SENT


def test_legs_joined_hands_the_failed_prefills_effects_to_the_decode_leg() -> None:
    f = _flow(_cluster(), b.LEGS_JOINED)
    f.pick(0.0)
    f.prefill_leg(0.0)
    failed = f.prefill_failed(REFUSED, 0.1)
    assert failed.effects.events == [] and failed.effects.metrics == []
    assert failed.decode_anyway is not None
    # The refused leg's own evidence (its worker is suspect) travels with the decode leg's effects.
    suspects = failed.decode_anyway.effects.of_type("worker_suspect")
    assert [e["error"] for e in suspects] == ["connection refused"]


def test_a_retried_prefill_leg_warns_naming_both_workers() -> None:
    reg = _cluster(prefills=2)
    p0, p1 = reg.by_role(Role.PREFILL)
    f = _flow(reg)
    f.pick(0.0)
    f.prefill_leg(0.0)
    failed = f.prefill_failed(REFUSED, 0.1)
    assert failed.effects.warnings == [
        f"prefill leg to {p0.id} never reached it (connection refused): retrying on {p1.id}"
    ]
