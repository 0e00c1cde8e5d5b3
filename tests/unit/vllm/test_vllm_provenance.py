"""Provenance records of real vLLM engines: the relay's legs joined with the decode's NIXL log, and the
`generate` calls of the legs the engines refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from fake_engines.core.calls import is_call_record
from harness.vllm.provenance import NIXL_LOGGER, NixlLog, leg_call, leg_record, logging_config, records_from

# Lines as vLLM 0.32 writes them (from a run of this repository's vLLM backend).
ALLOC = ("DEBUG 2026-12-01 08:26:48,904 [vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler] "
         "NIXLConnector update_state_after_alloc: num_external_tokens={n}, kv_transfer_params="
         "{{'do_remote_prefill': True, 'do_remote_decode': False, 'remote_block_ids': [[2]], "
         "'remote_engine_id': 'prefill-0-g2-f9b50d24', 'remote_request_id': '{rid}', "
         "'remote_host': '127.0.0.1', 'remote_port': 25714, 'tp_size': 1}}")
FAILURE = ("ERROR 2026-12-01 08:26:01,063 [vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker] "
           "NIXL transfer failure: handshake_failed | Context: {'failure_type': 'handshake_failed', "
           "'request_id': 'cmpl-91ddb0664c83f55f-0-b9d1f253', 'engine_id': 'decode-0-g1-49d63d6b'}")


def _leg(kind: str, **kw) -> dict:
    role = "prefill" if kind == "prefill" else "decode"
    leg = {"ts": 1.0, "engine": f"{role}-0", "role": role,
           "connector": "nixl", "engine_id": "e-1", "generation": 1, "kind": kind, "request_id": "cmpl-aa",
           "prompt": "[pdchaos:run:7] hello", "stream": False, "status": 200, "error": None,
           "duration_s": 0.1, "told": None, "answered": None}
    leg.update(kw)
    return leg


def test_the_log_gives_the_largest_planned_pull_and_failures_by_answer_id() -> None:
    log = NixlLog().read([ALLOC.format(n=81, rid="r-1"), ALLOC.format(n=0, rid="r-1"),
                          ALLOC.format(n=0, rid="r-2"), FAILURE, "unrelated line"])
    assert log.pulled == {"r-1": 81, "r-2": 0}  # vLLM logs 0 again once the KV is in
    assert log.failed == {"cmpl-91ddb0664c83f55f": "handshake_failed"}


def test_prefill_leg_is_computed_under_the_id_the_decode_is_told() -> None:
    rec = leg_record(_leg("prefill", answered={"remote_request_id": "cmpl-aa-0-ff", "remote_engine_id": "p"}),
                     NixlLog())
    assert rec is not None
    assert (rec["kind"], rec["outcome"], rec["request_id"]) == ("prefill", "computed", "cmpl-aa-0-ff")
    assert rec["tag"] == "[pdchaos:run:7]" and rec["kv_digest"] is None


def test_prefill_leg_without_params_or_with_an_error_failed() -> None:
    assert leg_record(_leg("prefill"), NixlLog())["outcome"] == "failed"
    rec = leg_record(_leg("prefill", status=500, error="boom", answered={"x": 1}), NixlLog())
    assert rec["outcome"] == "failed" and rec["error"] == "boom"


@pytest.mark.parametrize(("n", "outcome"), [(81, "pulled"), (0, "recomputed")])
def test_decode_leg_outcome_comes_from_the_log(n: int, outcome: str) -> None:
    log = NixlLog().read([ALLOC.format(n=n, rid="r-9")])
    rec = leg_record(_leg("decode", told={"remote_request_id": "r-9", "remote_engine_id": "p-g1"}), log)
    assert rec["outcome"] == outcome
    assert rec["remote_engine_id"] == "p-g1" and rec["remote_request_id"] == "r-9"


def test_decode_leg_with_no_log_line_has_no_record_rather_than_a_guess() -> None:
    assert leg_record(_leg("decode", told={"remote_request_id": "r-unseen"}), NixlLog()) is None


def test_decode_leg_errors_fail_and_a_200_after_a_failed_load_recomputed() -> None:
    log = NixlLog().read([FAILURE, ALLOC.format(n=40, rid="r-3")])
    failed = leg_record(_leg("decode", status=500, error="EngineCore", request_id="cmpl-91ddb0664c83f55f",
                             told={"remote_request_id": "r-3"}), log)
    assert failed["outcome"] == "failed" and "handshake_failed" in failed["error"]
    recomputed = leg_record(_leg("decode", request_id="cmpl-91ddb0664c83f55f",
                                 told={"remote_request_id": "r-3"}), log)
    assert recomputed["outcome"] == "recomputed"


def test_local_requests_and_records_from_a_mix() -> None:
    legs = [_leg("local"), _leg("decode", told={"remote_request_id": "none"}),
            _leg("prefill", answered={"remote_request_id": "r"})]
    recs = records_from(legs, NixlLog())
    assert [(r["kind"], r["outcome"]) for r in recs] == [("local", "computed"), ("prefill", "computed")]


def test_logging_config_sends_only_the_nixl_debug_lines_to_the_file(tmp_path: Path) -> None:
    cfg = logging_config(tmp_path / "n.log")
    assert cfg["handlers"]["nixl"]["filename"] == str(tmp_path / "n.log")
    assert cfg["loggers"][NIXL_LOGGER] == {"handlers": ["nixl"], "level": "DEBUG", "propagate": True}
    assert cfg["loggers"]["vllm"]["level"] == "INFO"
    assert cfg["handlers"]["console"]["level"] == "INFO"  # DEBUG never reaches the engine's own log


SHAPE = {"stream": False, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}


def test_a_served_leg_s_record_carries_its_shape_and_makes_no_call() -> None:
    leg = _leg("prefill", answered={"remote_request_id": "r"}, leg=SHAPE, tag="[pdchaos:run:7]",
               caller="router")
    (rec,) = records_from([leg], NixlLog())
    assert rec["leg"] == SHAPE and leg_call(leg, NixlLog()) is None


@pytest.mark.parametrize(("status", "error"), [(400, "max_tokens must be at least 1"), (499, None)])
def test_a_refused_or_cut_leg_is_a_generate_call_beside_its_failed_record(status: int,
                                                                          error: str | None) -> None:
    leg = _leg("prefill", ts=11.0, duration_s=0.5, status=status, error=error, leg=SHAPE, caller="harness")
    rec, call = records_from([leg], NixlLog())
    # The failed record stays for the handoff and legs checkers; the shape is on the call only.
    assert rec["outcome"] == "failed" and rec["leg"] is None and rec["tag"] == "[pdchaos:run:7]"
    assert is_call_record(call) and call["call"] == "generate" and call["status"] == status
    assert call["ts"] == 10.5 and call["duration_s"] == 0.5  # stamped when the leg arrived
    assert (call["engine"], call["engine_id"], call["generation"], call["role"]) == ("prefill-0", "e-1", 1,
                                                                                      "prefill")
    assert call["caller"] == "harness"
    assert call["detail"] == {"request_id": "cmpl-aa", "tag": "[pdchaos:run:7]", "leg": SHAPE,
                              "error": error or f"HTTP {status}"}


def test_unreachable_engines_failed_streams_and_failed_pulls_are_no_calls() -> None:
    log = NixlLog().read([FAILURE])
    unreachable = _leg("decode", status=0, error="ClientConnectorError", told={"remote_request_id": "r"})
    stream_error = _leg("local", status=200, error="EngineCore died")
    failed_pull = _leg("decode", status=500, error="EngineCore", request_id="cmpl-91ddb0664c83f55f",
                       told={"remote_request_id": "r-3"}, leg=SHAPE)
    for leg in (unreachable, stream_error, failed_pull):
        assert leg_call(leg, log) is None
    rec = leg_record(failed_pull, log)
    assert rec["outcome"] == "failed" and rec["leg"] == SHAPE  # it ran: its record keeps the shape


def test_legs_written_before_the_relay_kept_shape_tag_and_caller_still_read() -> None:
    rec, call = records_from([_leg("local", status=503, error="busy")], NixlLog())
    assert rec["leg"] is None and rec["tag"] == "[pdchaos:run:7]"
    assert call["caller"] == "router" and call["detail"]["leg"] is None
    assert call["detail"]["tag"] == "[pdchaos:run:7]"
