"""The engine-id re-read gate and the three read outcomes (DESIGN §2), plus the injected bugs #1 and #3."""

from __future__ import annotations

import pytest

from reference_router.core import (
    PARTIAL_READ_CLEARS_ID,
    STALE_ENGINE_ID,
    Connector,
    HealthConfig,
    MetadataRead,
    ReadOutcome,
    Role,
    Status,
    Worker,
    apply_metadata_read,
    decide_engine_id,
    make_worker_spec,
    reread_due,
)

P, R, NR, F, D = Status.PENDING, Status.READY, Status.NOT_READY, Status.FAILED, Status.DRAINING
MC = Connector.MOONCAKE
NO_BUGS: frozenset[str] = frozenset()

# (status before the probe, engine id known, confirmed) -> re-read due, for a PD Mooncake worker.
GATE = [
    (F, False, False, True),
    (F, True, False, True),
    (F, True, True, True),
    (NR, False, False, True),
    (NR, True, True, True),
    (NR, True, False, True),
    (P, False, False, True),  # Pending without an id re-reads
    (P, False, True, True),  # ... even after a complete no-id read (Pending only reads while it has no id)
    (P, True, False, False),
    (P, True, True, False),
    (R, True, False, True),  # Ready with the id unconfirmed (a failed read at promotion: bug #4)
    (R, False, False, True),
    (R, True, True, False),
    (R, False, True, False),  # a complete read without id confirmed it: no re-read every probe (bug #5)
    (D, False, False, False),  # never for Draining
    (D, True, False, False),
    (D, True, True, False),
]


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
@pytest.mark.parametrize(("status", "has_id", "confirmed", "due"), GATE)
def test_gate_table(role: Role, status: Status, has_id: bool, confirmed: bool, due: bool) -> None:
    engine_id = "e1" if has_id else None
    assert reread_due(status, role, MC, engine_id, confirmed, NO_BUGS) is due
    # A connector not known yet (gRPC, learned by the read) follows the same gate.
    assert reread_due(status, role, None, engine_id, confirmed, NO_BUGS) is due


@pytest.mark.parametrize("status", list(Status))
@pytest.mark.parametrize("confirmed", [True, False])
@pytest.mark.parametrize("has_id", [True, False])
def test_gate_never_for_nixl_none_or_regular(status: Status, confirmed: bool, has_id: bool) -> None:
    engine_id = "e1" if has_id else None
    for conn in (Connector.NIXL, Connector.NONE):
        assert not reread_due(status, Role.PREFILL, conn, engine_id, confirmed, NO_BUGS)
    for conn2 in (MC, None, Connector.NONE):
        assert not reread_due(status, Role.REGULAR, conn2, engine_id, confirmed, NO_BUGS)


@pytest.mark.parametrize(("status", "has_id", "confirmed", "_due"), GATE)
def test_gate_with_stale_engine_id_bug_only_reads_while_no_id(
    status: Status, has_id: bool, confirmed: bool, _due: bool
) -> None:
    engine_id = "e1" if has_id else None
    want = status is not D and not has_id
    assert reread_due(status, Role.PREFILL, MC, engine_id, confirmed, frozenset({STALE_ENGINE_ID})) is want


# previous id, read -> (id in force, confirmed, event outcome)
OUTCOMES = [
    (None, MetadataRead(ReadOutcome.COMPLETE, engine_id="new"), ("new", True, "id")),
    ("old", MetadataRead(ReadOutcome.COMPLETE, engine_id="new"), ("new", True, "id")),
    ("old", MetadataRead(ReadOutcome.COMPLETE, engine_id="old"), ("old", True, "id")),
    ("old", MetadataRead(ReadOutcome.COMPLETE, engine_id=""), ("old", True, "no_id")),
    ("old", MetadataRead(ReadOutcome.COMPLETE, engine_id=None), ("old", True, "no_id")),
    (None, MetadataRead(ReadOutcome.COMPLETE), (None, True, "no_id")),
    ("old", MetadataRead(ReadOutcome.PARTIAL), ("old", False, "error")),
    (None, MetadataRead(ReadOutcome.PARTIAL), (None, False, "error")),
    ("old", MetadataRead(ReadOutcome.ERROR), ("old", False, "error")),
    ("old", MetadataRead(ReadOutcome.TIMEOUT), ("old", False, "timeout")),
    (None, MetadataRead(ReadOutcome.TIMEOUT), (None, False, "timeout")),
    # A failed read that somehow carries an id is still a failed read: the id is not trusted.
    ("old", MetadataRead(ReadOutcome.ERROR, engine_id="junk"), ("old", False, "error")),
]


@pytest.mark.parametrize(("previous", "read", "want"), OUTCOMES)
def test_read_outcomes(previous: str | None, read: MetadataRead, want: tuple[str | None, bool, str]) -> None:
    d = decide_engine_id(previous, read, NO_BUGS)
    assert (d.engine_id, d.confirmed, d.event_outcome) == want
    assert d.previous == previous
    assert d.changed is (want[0] != previous)
    assert d.reason


@pytest.mark.parametrize(("previous", "read", "_want"), OUTCOMES)
def test_a_read_never_clears_a_known_id(previous: str | None, read: MetadataRead, _want: object) -> None:
    d = decide_engine_id(previous, read, NO_BUGS)
    if previous is not None:
        assert d.engine_id is not None


def test_partial_read_clears_id_only_with_the_bug() -> None:
    read = MetadataRead(ReadOutcome.PARTIAL)
    assert decide_engine_id("old", read, NO_BUGS).engine_id == "old"
    bugged = decide_engine_id("old", read, frozenset({PARTIAL_READ_CLEARS_ID}))
    assert (bugged.engine_id, bugged.confirmed, bugged.changed) == (None, False, True)
    # The bug is about partial reads only.
    assert (
        decide_engine_id(
            "old", MetadataRead(ReadOutcome.ERROR), frozenset({PARTIAL_READ_CLEARS_ID})
        ).engine_id
        == "old"
    )


def grpc_prefill() -> Worker:
    return Worker.new("w1", make_worker_spec("grpc://127.0.0.1:7000", "prefill"))


def test_apply_complete_read_learns_connector_dp_size_and_identity_baseline() -> None:
    w = grpc_prefill()
    read = MetadataRead(
        ReadOutcome.COMPLETE, engine_id="e1", connector="MooncakeConnector", dp_size=4, uptime_s=12.5
    )
    d = apply_metadata_read(w, read, now=3.0, cfg=HealthConfig())
    assert d.engine_id == "e1"
    assert w.connector is Connector.MOONCAKE and w.dp_size == 4
    assert (w.runtime.engine_id, w.runtime.engine_id_confirmed) == ("e1", True)
    assert (w.runtime.last_identity_check_at, w.runtime.last_uptime_s) == (3.0, 12.5)


@pytest.mark.parametrize(
    ("name", "want"),
    [("NixlConnector", Connector.NIXL), ("", Connector.NONE), ("LMCacheConnectorV1", Connector.NONE)],
)
def test_apply_learns_other_connectors(name: str, want: Connector) -> None:
    w = grpc_prefill()
    apply_metadata_read(w, MetadataRead(ReadOutcome.COMPLETE, connector=name), now=1.0, cfg=HealthConfig())
    assert w.connector is want


def test_configured_connector_is_not_overridden_by_a_read() -> None:
    w = Worker.new("w1", make_worker_spec("grpc://127.0.0.1:7000", "prefill", connector="mooncake"))
    apply_metadata_read(
        w, MetadataRead(ReadOutcome.COMPLETE, connector="NixlConnector"), now=1.0, cfg=HealthConfig()
    )
    assert w.connector is Connector.MOONCAKE


def test_failed_read_teaches_nothing_and_keeps_the_id_unconfirmed() -> None:
    w = grpc_prefill()
    apply_metadata_read(
        w, MetadataRead(ReadOutcome.COMPLETE, engine_id="e1", uptime_s=50.0), 1.0, HealthConfig()
    )
    d = apply_metadata_read(
        w, MetadataRead(ReadOutcome.PARTIAL, connector="NixlConnector", uptime_s=1.0), 2.0, HealthConfig()
    )
    assert d.event_outcome == "error"
    assert (w.runtime.engine_id, w.runtime.engine_id_confirmed) == ("e1", False)
    assert w.connector is None and w.runtime.last_uptime_s == 50.0 and w.runtime.last_identity_check_at == 1.0


def test_apply_partial_read_with_bug_clears_the_worker_id() -> None:
    w = grpc_prefill()
    cfg = HealthConfig(bugs=frozenset({PARTIAL_READ_CLEARS_ID}))
    apply_metadata_read(w, MetadataRead(ReadOutcome.COMPLETE, engine_id="e1"), 1.0, cfg)
    apply_metadata_read(w, MetadataRead(ReadOutcome.PARTIAL), 2.0, cfg)
    assert w.engine_id is None


def test_unknown_bug_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown bug"):
        HealthConfig(bugs=frozenset({"no_such_bug"}))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"failure_threshold": 0},
        {"success_threshold": 0},
        {"probe_timeout_s": 0},
        {"interval_s": -1},
        {"metadata_timeout_s": 0},
        {"identity_check_interval_s": 0},
        {"max_probes_in_flight": 0},
    ],
)
def test_bad_health_config(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        HealthConfig(**kwargs)  # type: ignore[arg-type]


def test_health_config_defaults() -> None:
    cfg = HealthConfig()
    assert (cfg.failure_threshold, cfg.success_threshold, cfg.probe_timeout_s, cfg.interval_s) == (
        3,
        2,
        5.0,
        60.0,
    )
    assert (cfg.max_probes_in_flight, cfg.metadata_timeout_s) == (128, 10.0)
    assert cfg.identity_check_interval_s == 30.0 and cfg.bugs == frozenset()
    assert (cfg.pending_probe_cap, cfg.not_ready_failure_cap, cfg.probe_slot_s) == (30, 9, 10.0)
    assert HealthConfig(bugs=["stale_engine_id"]).bugs == frozenset({"stale_engine_id"})  # type: ignore[arg-type]
