"""A fault is verified by what the harness sees of the process, never by the engine's word alone."""

from __future__ import annotations

from harness.worlds.base import graceful_stop_verified


def test_a_graceful_stop_is_in_place_once_its_signal_reached_the_process() -> None:
    ok = graceful_stop_verified("stop", True, "ok:503", 42)
    assert ok.ok and ok.engine_finding is None and ok.evidence["signal"] == "SIGTERM"
    gone = graceful_stop_verified("stop", True, "refused", 42)
    assert gone.ok and gone.engine_finding is None


def test_an_engine_still_healthy_after_sigterm_is_a_finding_not_an_unverified_fault() -> None:
    v = graceful_stop_verified("stop", True, "ok:200", 42)
    assert v.ok and v.engine_finding is not None and "healthy" in v.engine_finding
    assert v.evidence["health"] == "ok:200"


def test_a_signal_no_process_took_leaves_the_fault_unverified() -> None:
    v = graceful_stop_verified("stop", False, "refused", None)
    assert not v.ok and v.engine_finding is None
