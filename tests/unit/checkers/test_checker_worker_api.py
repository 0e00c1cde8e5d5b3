"""The worker API's answers to a client's mistaken calls (harness.checkers.worker_api)."""

from __future__ import annotations

from typing import Any

import pytest
from test_checkers_builders import HB

from harness.checkers import check_worker_api
from reference_router.core import ErrorAnswer

W = {"id": "w1", "url": "http://d0", "labels": {}, "priority": 0, "connector": "mooncake"}
REFUSED = ErrorAnswer(400, "invalid_update", "priority must be an integer, got 'high'").body()


def _history(status: int, answer: Any, after: dict[str, Any] | None = None) -> Any:
    hb = HB()
    hb.at(1.0).fault_applied("f1", "patch_worker", "decode-0", {"priority": "high"},
                             {"status": status, "answer": answer, "refused": "priority"})
    hb.at(1.0).fault_verified("f1", True, {"status": status, "before": W, "after": after or W})
    hb.end(2.0)
    return hb.history()


def test_a_mistake_refused_with_a_4xx_naming_the_field_and_nothing_changed_passes() -> None:
    v = check_worker_api(_history(400, REFUSED))
    assert v.status == "pass" and v.numbers["mistakes"] == 1, v.evidence


@pytest.mark.parametrize(("status", "answer", "after", "words"), [
    (200, W, None, "was 200, not a 4xx"),
    (500, REFUSED, None, "was 500, not a 4xx"),
    (400, {"detail": "bad"}, None, "says nothing of what is wrong"),
    (400, {"error": "bad value"}, None, "does not name priority"),
    (400, ErrorAnswer(400, "invalid_update", "None").body(), None, "does not name priority"),
    (400, REFUSED, {**W, "priority": 5}, "changed the worker's priority"),
])
def test_a_mistake_not_refused_as_the_contract_says_is_a_violation(
    status: int, answer: Any, after: dict[str, Any] | None, words: str
) -> None:
    v = check_worker_api(_history(status, answer, after))
    assert v.status == "fail" and words in v.evidence[0], v.evidence


def test_a_management_api_s_own_error_shape_naming_the_field_passes() -> None:
    answer = {"code": "BAD_REQUEST", "error": "priority: invalid type: string \"high\", expected u32"}
    assert check_worker_api(_history(400, answer)).status == "pass"


def test_without_a_mistaken_call_there_is_nothing_to_judge() -> None:
    hb = HB()
    hb.end(2.0)
    assert check_worker_api(hb.history()).status == "unknown"


def _add_history(status: int, answer: Any, after: dict[str, Any] | None, later: int) -> Any:
    hb = HB()
    hb.at(1.0).fault_applied("f2", "add_worker", "prefill-1", {"url": "http://127.0.0.1:99999"},
                             {"status": status, "answer": answer, "refused": "url"})
    hb.at(1.0).fault_verified("f2", True, {"status": status, "before": None, "after": after,
                                           "workers_before": 2, "workers_after": later})
    hb.end(2.0)
    return hb.history()


def test_a_refused_registration_naming_the_field_in_any_case_passes() -> None:
    answer = {"error": "Invalid URL: port out of range", "code": "BAD_REQUEST"}
    v = check_worker_api(_add_history(400, answer, None, 2))
    assert v.status == "pass", v.evidence


@pytest.mark.parametrize(("status", "after", "later", "words"), [
    (201, {"url": "http://127.0.0.1:99999"}, 3, "was 201, not a 4xx"),
    (400, {"url": "http://127.0.0.1:8100"}, 3, "registered the worker"),
    (400, None, 3, "listed 2 worker(s) before the refused call, 3 after it"),
])
def test_a_registration_mistake_that_adds_a_worker_is_a_violation(
    status: int, after: dict[str, Any] | None, later: int, words: str
) -> None:
    answer = ErrorAnswer(400, "invalid_worker", "url has a bad port").body()
    v = check_worker_api(_add_history(status, answer, after, later))
    assert v.status == "fail" and any(words in e for e in v.evidence), v.evidence
