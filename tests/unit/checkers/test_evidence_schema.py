"""The engines' records are held to their documented shape: a record of another shape makes the run unknown
(damaged evidence), never a pass judged on a misread record."""

from __future__ import annotations

from typing import Any

import pytest
from test_checkers_builders import WALL0, restart_run

from fake_engines.core.calls import make_call
from fake_engines.core.records import make_record
from harness.checkers import check_run_complete
from harness.evidence_schema import CALL_FIELDS, HANDOFF_EXTENSIONS, HANDOFF_FIELDS, record_problems


def _handoff(**changes: Any) -> dict[str, Any]:
    rec = make_record(ts=WALL0 + 1.0, engine="prefill-0", engine_id="A", generation=1, role="prefill",
                      kind="prefill", request_id="r1-p", tag="[pdchaos:s0:1]", connector="mooncake",
                      prompt_digest="ab12", outcome="computed", duration_s=0.02, output_digest="cd34",
                      transfer_id="xfer-1")
    rec.update(changes)
    return rec


def test_the_documented_fields_are_exactly_what_the_engines_write() -> None:
    assert set(_handoff()) - {"ts"} == set(HANDOFF_FIELDS) | set(HANDOFF_EXTENSIONS)
    call = make_call(ts=WALL0, engine="decode-0", engine_id="B", generation=1, role="decode", call="health",
                     status=200, duration_s=0.001, caller="router", detail={"healthy": True})
    assert set(call) - {"ts", "record"} == set(CALL_FIELDS)
    assert record_problems("handoff", _handoff()) == [] and record_problems("engine_call", call) == []


@pytest.mark.parametrize(("change", "words"), [
    ({"connector": None}, "has connector=None"),
    ({"generation": "1"}, "has generation='1'"),
    ({"outcome": "done"}, "has outcome='done'"),
    ({"leg": "stream"}, "has leg='stream'"),
])
def test_a_handoff_record_of_another_shape_is_named(change: dict[str, Any], words: str) -> None:
    assert words in record_problems("handoff", _handoff(**change))


def test_a_missing_field_is_named() -> None:
    rec = _handoff()
    del rec["connector"]
    assert record_problems("handoff", rec) == ["lacks connector"]


def test_a_malformed_engine_record_makes_the_run_unknown_with_the_record_named() -> None:
    run = restart_run()
    bad = _handoff()
    del bad["generation"]
    run.at(2.0).handoff(bad)
    v = check_run_complete(run.history())
    assert v.status == "unknown" and "1 engine record(s) not of the documented shape" in v.reason
    assert v.evidence == ["handoff record of prefill-0 at t=2.000 lacks generation"]
    assert check_run_complete(restart_run().history()).status == "pass"
