"""Test-only switches that put a field bug back into the fake engines (off by default), so a harness user can
reproduce an engine bug and see the suite tell it apart from a router bug (`pdchaos-engine --inject-bug`,
`EngineSettings.inject_bugs`). Each switch is one `if NAME in bugs:` branch next to the correct code:
`kv_store` (KV freed while a decode may still read it), `engine_state` (graceful stop that drops pulls, an
engine healthy while it drains, an id reported from the first start), `handoff` (handshake cache keyed by
address)."""

from __future__ import annotations

from collections.abc import Iterable

from pdchaos.bugs import BugSwitch, catalog, validate_names

KV_FREED_WHILE_READ = "kv_freed_while_read"
SHUTDOWN_DROPS_PULLS = "shutdown_drops_pulls"
STALE_PEER_HANDSHAKE = "stale_peer_handshake"
HEALTHY_WHILE_DRAINING = "healthy_while_draining"
REPORTS_FIRST_ID = "reports_first_id"

ENGINE_BUGS: dict[str, BugSwitch] = catalog(
    [
        BugSwitch(
            name=KV_FREED_WHILE_READ,
            side="engine",
            zoo="field",
            reference="https://github.com/vllm-project/vllm/issues/52234 (a stale reference after the "
            "producer reused the blocks returns the previous prompt's answer with HTTP 200); abort timeout: "
            "https://github.com/vllm-project/vllm/pull/20139",
            symptom="prefill: KV not pulled within the KV abort timeout is freed and its blocks reused while "
            "a late decode still reads them: the decode answers 200 with another prompt's output "
            "(kv_digest != prompt_digest) instead of failing the load cleanly",
        ),
        BugSwitch(
            name=SHUTDOWN_DROPS_PULLS,
            side="engine",
            zoo="field",
            reference="https://github.com/ai-dynamo/dynamo/issues/4917 (a gracefully shut down prefill waits "
            "for in-flight prefills but not for the KV transfers)",
            symptom="prefill: a graceful stop (SIGTERM) waits for in-flight requests but not for the KV its "
            "decodes have yet to pull: the process exits and those pulls fail (NIXL) or wait out the "
            "transfer timeout (Mooncake)",
        ),
        BugSwitch(
            name=STALE_PEER_HANDSHAKE,
            side="engine",
            zoo="field",
            reference="https://github.com/sgl-project/sglang/pull/36029 (decode caches prefill bootstrap "
            "metadata by address; a prefill restarted on the same address is reached at its old ports), "
            "https://github.com/sgl-project/sglang/pull/34289 (NIXL stall after a prefill replacement)",
            symptom="decode: NIXL handshakes / Mooncake bootstrap lookups are cached by peer address, not "
            "engine id: after a prefill is replaced on the same address every pull goes to the dead peer and "
            "fails (NIXL) or times out (Mooncake), although the router sent the new engine id",
        ),
        BugSwitch(
            name=HEALTHY_WHILE_DRAINING,
            side="engine",
            zoo="field",
            reference="https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination (a "
            "terminating pod must fail its readiness so traffic stops; one that keeps passing it still gets "
            "requests it refuses)",
            symptom="any engine: after SIGTERM it drains but keeps answering its health checks healthy until "
            "the process exits: routers keep sending it requests, which it refuses with 503",
        ),
        BugSwitch(
            name=REPORTS_FIRST_ID,
            side="engine",
            zoo="field",
            reference="https://github.com/kvcache-ai/Mooncake/issues/2246 (metadata kept for a restarted "
            "engine names its earlier start: readers are sent to an endpoint that is gone)",
            symptom="prefill: after a restart in place its bootstrap /query and GetServerInfo still report "
            "the engine id of its first start: a correct router mints that dead id and the decode's pulls "
            "fail, and only the engines' records show the engine told it",
            connectors=("mooncake",),
        ),
    ]
)


def engine_bug_names() -> tuple[str, ...]:
    """The switch names, sorted (what `pdchaos run --inject-bug` may route to the engines)."""
    return tuple(sorted(ENGINE_BUGS))


def validate_engine_bugs(names: Iterable[str]) -> frozenset[str]:
    """The names as a frozenset; ValueError naming the unknown ones and listing the known."""
    return validate_names(names, ENGINE_BUGS, "engine")
