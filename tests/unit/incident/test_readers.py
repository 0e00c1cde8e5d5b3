"""The readers turn each log format into facts, citing file:line, and skip what is not theirs."""

from __future__ import annotations

import json

import pytest

from harness.incident.facts import IncidentError, epoch
from harness.incident.read_engines import read_engine_log
from harness.incident.read_gateway import parse_line, read_gateway_log
from harness.incident.read_notes import read_command, read_kube_events, read_timeline

pytestmark = pytest.mark.unit

SMG_TEXT = (
    "\x1b[2m2026-12-06 09:30:48\x1b[0m \x1b[32m INFO\x1b[0m http_request{method=POST path=/v1/completions "
    'version=HTTP/1.1 module="smg" request_id="cmpl-a" status_code=503 latency=382374}: smg::response: '
    "model_gateway/src/middleware/logging.rs:227: finished processing request"
)
SMG_START = (
    "2026-12-06 09:30:46  INFO smg::server: model_gateway/src/server.rs:1555: Starting router on "
    '127.0.0.1:30461 | mode: PrefillDecode { prefill_urls: [("grpc://127.0.0.1:23670", Some(27015)), '
    '("grpc://127.0.0.1:18867", None)], decode_urls: ["grpc://127.0.0.1:21092"], '
    "prefill_policy: Some(RoundRobin) } | policy: CacheAware"
)
SMG_JSON = json.dumps(
    {
        "timestamp": "2026-12-06 14:18:29",
        "level": "WARN",
        "message": "Health probe failed",
        "worker_url": "grpc://127.0.0.1:22245",
        "target": "smg::worker::manager",
        "span": {"name": "x"},
    }
)
VR_FAIL = (
    "2026-12-06 09:33:22 ERROR vllm_router_rs::routers::http::vllm_pd_router: "
    "src/routers/http/vllm_pd_router.rs:1900: Transparent proxy request failed: "
    "prefill=http://127.0.0.1:1, decode=http://127.0.0.1:2, "
    "error=Network error: Decode request failed to http://127.0.0.1:2/v1/completions: timed out"
)


def test_smg_text_line_gives_a_request_with_status_and_latency() -> None:
    facts, _ = read_gateway_log([SMG_TEXT], "gw.log")
    req = [f for f in facts if f.kind == "request"]
    assert len(req) == 1 and req[0].cite == "gw.log:1"
    assert req[0].data["status"] == 503 and req[0].data["latency_s"] == pytest.approx(0.382374)
    # A whole-second time is read as the middle of its second.
    assert req[0].t == epoch("2026-12-06 09:30:48") + 0.5


def test_start_line_gives_workers_with_bootstrap_ports() -> None:
    facts, _ = read_gateway_log([SMG_START], "gw.log")
    (w,) = [f for f in facts if f.kind == "workers_at_start"]
    assert w.data["prefills"] == [("grpc://127.0.0.1:23670", 27015), ("grpc://127.0.0.1:18867", None)]
    assert w.data["decodes"] == ["grpc://127.0.0.1:21092"]


def test_smg_json_line_reads_its_flattened_fields() -> None:
    parsed = parse_line(SMG_JSON)
    assert parsed is not None and parsed[2] == "smg::worker::manager"
    facts, _ = read_gateway_log([SMG_JSON], "gw.json")
    assert [f.data for f in facts if f.kind == "probe_failed"] == [{"url": "grpc://127.0.0.1:22245"}]


def test_vllm_router_failed_leg_names_the_decode() -> None:
    facts, _ = read_gateway_log([VR_FAIL], "vr.log")
    (leg,) = [f for f in facts if f.kind == "leg_error"]
    assert leg.data["role"] == "decode" and leg.data["url"] == "http://127.0.0.1:2"
    assert [f.data["gateway"] for f in facts if f.kind == "gateway"] == ["vllm-router"]


def test_lines_not_the_gateways_are_handed_back_with_their_numbers() -> None:
    _facts, others = read_gateway_log(
        ["banner", SMG_TEXT, "INFO 12-06 09:30:46 [api_server.py:1] x"], "mixed.log"
    )
    assert others == [(1, "banner"), (3, "INFO 12-06 09:30:46 [api_server.py:1] x")]


def test_fake_engine_ready_and_fault_lines() -> None:
    ready = (
        'PDCHAOS_ENGINE_READY {"name":"prefill-0","pid":7,"role":"prefill","connector":"mooncake",'
        '"engine_id":"a","started_at":100.5,"http_port":1,"grpc_port":2,"bootstrap_port":3,'
        '"transfer_timeout_s":2.0}'
    )
    fault = (
        "2026-12-06 14:18:21,856 prefill-0 WARNING fake_engines.control: pdchaos fault restart: "
        '{"down_s": 0.6, "started_at": {"new": 102.0, "old": 100.5}}'
    )
    facts, unread = read_engine_log(
        [(1, ready), (2, fault), (3, "Traceback (most recent call last):")], "p.log"
    )
    start, f = facts
    assert start.kind == "engine_start" and start.t == 100.5 and start.data["ports"] == [1, 2]
    assert f.kind == "engine_fault" and f.data["action"] == "restart" and f.data["changed"]["down_s"] == 0.6
    assert unread == 0


# vLLM's wording (0.12-0.19: logger.py's format, the connectors' messages).
VLLM = [
    "(APIServer pid=42) INFO 12-06 14:20:10 [utils.py:253] non-default args: {'kv_transfer_config': "
    "KVTransferConfig(kv_connector='NixlConnector', engine_id=None, kv_role='kv_producer')}",
    "(APIServer pid=42) INFO 12-06 14:20:26 [api_server.py:1847] Starting vLLM API server 0 on http://0.0.0.0:8100",
    "(EngineCore_DP0 pid=81) INFO 12-06 14:20:40 [factory.py:64] Creating v1 connector with name: "
    "MooncakeConnector and engine_id: 3f0c1234-aaaa",
    "(EngineCore_DP0 pid=81) WARNING 12-06 14:30:02 [mooncake_connector.py:1308] Request cmpl-1 timed out "
    "after 480 seconds without being sent. Freeing its blocks on the producer side.",
    "ERROR 12-06 14:22:07 [nixl_connector.py:2408] NIXL transfer failure: transfer_failed | Context: {}",
    "(APIServer pid=42) ERROR 12-06 14:40:00 [core_client.py:600] Engine core proc EngineCore_DP0 died "
    "unexpectedly, shutting down client.",
    "INFO 12-06 14:20:30 [grpc_server.py:113] vLLM gRPC server started on 0.0.0.0:50051",
]


def test_vllm_lines() -> None:
    facts, unread = read_engine_log(list(enumerate(VLLM, 1)), "v.log", year=2026)
    kinds = [f.kind for f in facts]
    assert kinds == [
        "engine_kv",
        "engine_start",
        "engine_kv",
        "kv_timeout",
        "kv_failure",
        "engine_stop",
        "engine_start",
    ]
    assert facts[0].data["role"] == "prefill" and facts[0].data["connector"] == "nixl"
    assert facts[1].data["ports"] == [8100] and facts[6].data["ports"] == [50051]
    assert facts[2].data["engine_id"] == "3f0c1234-aaaa" and facts[3].data["abort_timeout_s"] == 480.0
    assert facts[1].t == epoch("2026-12-06 14:20:26") + 0.5 and unread == 0


def test_vllm_with_a_logging_config_that_names_the_logger() -> None:
    """vLLM 0.32 under a logging config (the harness's): a full date, milliseconds, the logger's name."""
    lines = [
        "INFO 2026-12-06 14:41:47,743 [vllm.entrypoints.launchers.api_server.entry] Starting vLLM server on "
        "http://127.0.0.1:27327",
        "INFO 2026-12-06 14:41:45,900 [vllm.distributed.kv_transfer.kv_connector.factory] Creating v1 "
        "connector with name: NixlPullConnector and engine_id: prefill-0-g1-c2a1317a",
    ]
    facts, _ = read_engine_log(list(enumerate(lines, 1)), "p.log")
    assert facts[0].kind == "engine_start" and facts[0].t == pytest.approx(epoch("2026-12-06 14:41:47.743"))
    assert facts[1].data["connector"] == "nixl"


def test_vllm_time_without_a_year_needs_one() -> None:
    facts, _ = read_engine_log([(1, VLLM[1])], "v.log", year=None)
    assert facts[0].t is None


def test_command_line_flags() -> None:
    facts = read_command(
        "smg launch --pd-disaggregation --prefill grpc://h:1 9000 --prefill http://h:2 none "
        "--decode grpc://h:3 --health-check-interval-secs 60 --request-timeout-secs 1800",
        "c:1",
    )
    workers = next(f for f in facts if f.kind == "workers_at_start")
    assert workers.data == {
        "prefills": [("grpc://h:1", 9000), ("http://h:2", None)],
        "decodes": ["grpc://h:3"],
    }
    settings = next(f for f in facts if f.kind == "setting").data
    assert settings == {"health_interval_s": 60.0, "request_timeout_s": 1800.0}
    with pytest.raises(IncidentError, match="not a number"):
        read_command("smg launch --health-check-interval-secs soon", "c:1")


def test_kube_events() -> None:
    events = {
        "kind": "EventList",
        "items": [
            {
                "kind": "Event",
                "reason": "Killing",
                "involvedObject": {"kind": "Pod", "name": "pd-prefill-0-abc"},
                "lastTimestamp": "2026-12-06T09:30:48Z",
                "message": "Stopping container vllm",
            },
            {
                "kind": "Event",
                "reason": "Started",
                "involvedObject": {"kind": "Pod", "name": "pd-prefill-0-abc"},
                "lastTimestamp": "2026-12-06T09:31:10Z",
                "message": "Started container vllm",
            },
            {
                "kind": "Event",
                "reason": "Scheduled",
                "involvedObject": {"kind": "Pod", "name": "x"},
                "lastTimestamp": "2026-12-06T09:00:00Z",
            },
        ],
    }
    facts, unread = read_kube_events(events, "ev.json")
    assert [f.data["reason"] for f in facts] == ["Killing", "Started"] and unread == 1
    assert facts[1].t - facts[0].t == 22.0


def test_timeline_toml_and_its_errors() -> None:
    facts, options = read_timeline(
        'utc_offset = "+02:00"\n[gateway]\nrelease = "smg==1.10.1"\n[[event]]\nat = 12.5\n'
        'engine = "prefill-0"\n'
        'what = "restart"\ndown_s = 30\n[symptom]\nclients_saw = ["hang"]\n',
        "incident.toml",
    )
    assert options == {"utc_offset": "+02:00"}
    assert [f.kind for f in facts] == ["release", "event", "symptom"]
    with pytest.raises(IncidentError, match="clients_saw"):
        read_timeline('[symptom]\nclients_saw = ["sad"]\n', "incident.toml")
    with pytest.raises(IncidentError, match="needs at, engine and what"):
        read_timeline('[[event]]\nat = 1\nwhat = "explode"\n', "incident.toml")
    with pytest.raises(IncidentError, match="not valid TOML"):
        read_timeline("[[event]\n", "incident.toml")


def test_fake_decode_kv_failures_read_as_vllm_would() -> None:
    """The fakes log a failed KV load in vLLM's wording; the reader takes it as it takes vLLM's."""
    from fake_engines.engine import kv_load_failure_line

    def line(connector: str, outcome: str) -> str:
        rec = {
            "request_id": "cmpl-1",
            "outcome": outcome,
            "error": "stale engine id",
            "connector": connector,
            "remote_engine_id": "e1",
        }
        return f"2026-12-06 14:18:21,856 decode-0 WARNING fake_engines.engine: {kv_load_failure_line(rec)}"

    numbered = list(
        enumerate([line("mooncake", "timed_out"), line("nixl", "failed"), line("mooncake", "failed")], 1)
    )
    facts, unread = read_engine_log(numbered, "d.log")
    assert [f.kind for f in facts] == ["kv_timeout", "kv_failure", "kv_failure"] and unread == 0
    assert facts[0].t == epoch("2026-12-06 14:18:21.856")
