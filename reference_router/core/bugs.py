"""Test-only switches that put a known outage bug back into the router, each off by default (DESIGN §6 and
bugs seen in released gateways). Each switch is a few visible lines next to the correct code it breaks;
`pdchaos zoo` runs the suite once per switch and shows which scenario catches it, with the evidence.

Where a switch acts: health and engine-id bugs in core.engine_id / identity / health / health_tick; dispatch
bugs in core.dispatch_flow / picking / connectors / breaker / answers; worker-API bugs in core.registry and
core.workers; two need the shells' concurrency (legs_joined, wedged_stalls_all): the asyncio dispatcher and
the simulated router both ask `core.dispatch_flow` whether to run them.
"""

from __future__ import annotations

from collections.abc import Iterable

from pdchaos.bugs import BugSwitch, catalog, validate_names

_DESIGN = "docs/DESIGN.md §6 #{n}"
_GATEWAYS = "docs/GATEWAYS.md (release matrix)"
_GRPC = ("grpc",)
_MOONCAKE = ("mooncake",)

STALE_ENGINE_ID = "stale_engine_id"
METADATA_NO_DEADLINE = "metadata_no_deadline"
PARTIAL_READ_CLEARS_ID = "partial_read_clears_id"
REREAD_NO_RETRY = "reread_no_retry"
REREAD_EVERY_PROBE = "reread_every_probe"
FAILED_TERMINAL = "failed_terminal"
PATCH_DROPS_KV_CONFIG = "patch_drops_kv_config"
NO_WORKER_404 = "no_worker_404"
LEGS_JOINED = "legs_joined"
SHARED_POLICY = "shared_policy"
NIXL_NOT_RELAYED = "nixl_not_relayed"
NO_REQUEST_TIMEOUT = "no_request_timeout"
NO_IDENTITY_CHECK = "no_identity_check"
API_REPORTS_FIRST_ID = "api_reports_first_id"
NO_PREFILL_RETRY = "no_prefill_retry"
BREAKER_CHARGES_KV_FAILURE = "breaker_charges_kv_failure"
BREAKER_NO_READMIT = "breaker_no_readmit"
ERROR_AS_200 = "error_as_200"
PREFILL_ON_DECODE = "prefill_on_decode"
WEDGED_STALLS_ALL = "wedged_stalls_all"
NO_OUTLIER_EJECTION = "no_outlier_ejection"
RETRY_FAILED_REQUESTS = "retry_failed_requests"
RETRY_TRANSPORT_FAILURES = "retry_transport_failures"
NO_SUSPECT_PROBE = "no_suspect_probe"

ROUTER_BUGS: dict[str, BugSwitch] = catalog([
    BugSwitch(
        STALE_ENGINE_ID, "router", "zoo-1",
        f"{_DESIGN.format(n=1)}; vllm-router 0.1.17 and smg 1.10.1 in {_GATEWAYS}",
        "the engine id is read only while none is known (never re-read, no identity check): after a Mooncake "
        "prefill restarts on the same address every decode waits out its KV transfer timeout (480 s in vLLM)",
        connectors=_MOONCAKE,
    ),
    BugSwitch(
        METADATA_NO_DEADLINE, "router", "zoo-2", _DESIGN.format(n=2),
        "the engine-id re-read inside a probe has no deadline: a metadata RPC that never answers holds the "
        "probe slot for good and the worker is never probed again",
        transports=_GRPC, connectors=_MOONCAKE,
    ),
    BugSwitch(
        PARTIAL_READ_CLEARS_ID, "router", "zoo-3", _DESIGN.format(n=3),
        "a partial metadata read (GetServerInfo fails, GetModelInfo answers) clears the known engine id: the "
        "router cannot mint and every decode recomputes the prompt",
        transports=_GRPC, connectors=_MOONCAKE,
    ),
    BugSwitch(
        REREAD_NO_RETRY, "router", "zoo-4", _DESIGN.format(n=4),
        "one failed engine-id re-read at promotion is taken as final: the id stays stale for life and every "
        "handoff to the restarted prefill times out",
        transports=_GRPC, connectors=_MOONCAKE,
    ),
    BugSwitch(
        REREAD_EVERY_PROBE, "router", "zoo-5", _DESIGN.format(n=5),
        "an engine that reports no engine id is re-read after every probe, forever (a metadata read per "
        "probe)",
        transports=_GRPC, connectors=_MOONCAKE,
    ),
    BugSwitch(
        FAILED_TERMINAL, "router", "zoo-6", _DESIGN.format(n=6),
        "Failed is terminal: a worker that was down long enough to be Failed never rejoins, even once it "
        "serves again on the same address",
    ),
    BugSwitch(
        PATCH_DROPS_KV_CONFIG, "router", "zoo-7", _DESIGN.format(n=7),
        "a worker property update (labels, priority) rebuilds the worker without its KV transfer config "
        "(connector, bootstrap port): its handoffs stop and decodes recompute",
    ),
    BugSwitch(
        NO_WORKER_404, "router", "zoo-8", f"{_DESIGN.format(n=8)}; smg 1.10.1 in {_GATEWAYS}",
        "a PD leg with no Ready worker answers 404 model_not_found instead of a prompt 503",
    ),
    BugSwitch(
        LEGS_JOINED, "router", "zoo-9",
        f"{_DESIGN.format(n=9)}; https://github.com/sgl-project/sglang/pull/40606",
        "the legs are not sequenced on the prefill's success: the decode leg is sent even when the prefill "
        "leg failed, so the failure surfaces only as the decode's (after it waited for KV that was never "
        "computed, the whole transfer timeout when the prefill is gone), or as a silent recompute",
    ),
    BugSwitch(
        SHARED_POLICY, "router", "zoo-10", _DESIGN.format(n=10),
        "one policy instance serves both legs: its round-robin cursor advances twice per request and every "
        "other worker of a role gets no traffic",
    ),
    BugSwitch(
        NIXL_NOT_RELAYED, "router", "zoo-11", _DESIGN.format(n=11),
        "the NIXL prefill's kv_transfer_params are not relayed to the decode: every decode silently "
        "recomputes the prompt (right text, nothing disaggregated)",
        connectors=("nixl",),
    ),
    BugSwitch(
        NO_REQUEST_TIMEOUT, "router", "zoo-12",
        f"{_DESIGN.format(n=12)}; https://github.com/vllm-project/production-stack/issues/749",
        "upstream calls of a request have no deadline: a wedged backend holds its requests until the client "
        "gives up",
    ),
    BugSwitch(
        NO_IDENTITY_CHECK, "router", "zoo-13", _DESIGN.format(n=13),
        "no identity check: a restart between two probes (no probe fails) is never noticed and the dead "
        "engine id is minted until the next outage",
        connectors=_MOONCAKE,
    ),
    BugSwitch(
        API_REPORTS_FIRST_ID, "router", "zoo-14", f"{_DESIGN.format(n=14)}; smg 1.13.0 in {_GATEWAYS}",
        "the worker API reports the engine id read at registration, not the one in force",
        connectors=_MOONCAKE,
    ),
    BugSwitch(
        NO_PREFILL_RETRY, "router", "field", f"vllm-router 0.1.17 in {_GATEWAYS}",
        "a prefill leg refused before anything was sent (connection refused) is not retried on another Ready "
        "prefill: the client gets a 5xx although another prefill could serve",
    ),
    BugSwitch(
        BREAKER_CHARGES_KV_FAILURE, "router", "field", f"every smg release in {_GATEWAYS}",
        "a decode's failed KV load (its prefill or the path broke) counts against the decode's circuit "
        "breaker: a healthy sole decode is taken out and every request gets 503",
    ),
    BugSwitch(
        RETRY_FAILED_REQUESTS, "router", "field",
        "gateway-level retries with these defaults: smg `launch --help` (--retry-max-retries 5, "
        "--retry-initial-backoff-ms 50, --retry-backoff-multiplier 1.5); retry amplification: "
        "https://aws.amazon.com/builders-library/timeouts-retries-and-backoff-with-jitter/",
        "a request whose leg failed with a 5xx is run again whole, up to 5 attempts: every attempt is "
        "charged to the worker's circuit breaker (one outage opens it five times sooner) and a failure that "
        "repeats (a stale engine id) costs each request five KV transfer timeouts instead of one",
    ),
    BugSwitch(
        RETRY_TRANSPORT_FAILURES, "router", "field",
        "smg 1.13.0 in docs/GATEWAYS.md, the whole first set (`pipeline attempt failed attempt=0..3`, then "
        "attempt 4 refused: no worker left)",
        "a request whose decode leg failed at the transport (connection refused, a stream that broke) is run "
        "again whole, up to 5 attempts, each running its prefill again; a decode's own error answer (a 500 "
        "\"KV load failed\") and a failed prefill leg are not: a decode crash costs every request caught on "
        "it 5 prefills",
    ),
    BugSwitch(
        BREAKER_NO_READMIT, "router", "field",
        f"smg 1.11.0/1.12.0 in {_GATEWAYS}; https://github.com/sgl-project/sglang/issues/31206",
        "a worker whose breaker opened is not re-admitted when its probes show it recovered: a recovered "
        "sole prefill stays out for the whole open period (every request 503)",
    ),
    BugSwitch(
        ERROR_AS_200, "router", "field", "https://github.com/decolua/9router/issues/2727",
        "an error is answered as HTTP 200 with finish_reason \"error\" and no content: clients count a "
        "failure as a success",
    ),
    BugSwitch(
        PREFILL_ON_DECODE, "router", "field", "https://github.com/sgl-project/sglang/issues/31206",
        "with no Ready prefill the request is run on a decode alone (it prefills itself) instead of a 503: "
        "nothing is disaggregated and the decode's capacity is spent on prefills",
    ),
    BugSwitch(
        WEDGED_STALLS_ALL, "router", "field", "https://github.com/vllm-project/production-stack/issues/749",
        "requests are dispatched one at a time behind a router-wide lock: one wedged backend stalls every "
        "request, also those for healthy workers",
    ),
    BugSwitch(
        NO_OUTLIER_EJECTION, "router", "field",
        "https://github.com/vllm-project/vllm/issues/39863; https://github.com/azrtydxb/Fastllm-proxy/issues/19",
        "request timeouts do not count against a worker: an engine that is hung but answers its health check "
        "stays in rotation and every request sent to it times out",
    ),
    BugSwitch(
        NO_SUSPECT_PROBE, "router", "field", f"every smg release in {_GATEWAYS} (prefill_link_blip)",
        "a leg its worker refused (connection refused) neither gets that worker probed early nor steers "
        "requests away from it: it stays in rotation until its regular probes fail, every request picked "
        "for it meanwhile fails there first (each charged to its circuit breaker), and a blip too short for "
        "the probes to see can open the breaker with no outage to recover from, so nothing re-admits the "
        "worker for the whole open period",
    ),
])

KNOWN_BUGS: frozenset[str] = frozenset(ROUTER_BUGS)


def validate_bugs(names: Iterable[str]) -> frozenset[str]:
    """The names as a frozenset; ValueError naming the unknown ones."""
    return validate_names(names, ROUTER_BUGS, "router")
