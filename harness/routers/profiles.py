"""Gateway profiles: the reference router with the bug switches that describe a real gateway release's known
behaviour (docs/GATEWAYS.md, docs/real-gateways.md), so a release can be explored
where the real one cannot go: in simulated time at production settings, or at scale.

`--router profile:NAME` runs the reference router with the profile's switches, in either world. A profile also
carries what the release does when a scenario says nothing (smg and vllm-router run a circuit breaker of 10
failures / 60 s by default; the reference router runs none unless told), and the transports on which it has
been compared with the release (smg: gRPC, and HTTP for 1.13.0 as its own profile, `smg-1.13.0-http`: over
HTTP smg hands off only when its workers are registered with their KV transfer facts, which its adapter does,
and it behaves differently there; the `smg-flags` variant sends no handoff parameters at all, which no switch
describes). `harness.profile_check` compares each profile with its release, checker by checker.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from harness.routers.reference import ReferenceRouter
from harness.scenario.bugs import split_bugs, with_bugs
from harness.scenario.settings import as_passed
from harness.topology import TRANSPORTS

if TYPE_CHECKING:
    from harness.scenario import Scenario

PREFIX = "profile:"
# smg's and vllm-router's circuit breaker when no flag says otherwise.
GATEWAY_BREAKER = (10, 60.0)

# No smg release probes a worker early when a leg to it was refused (its probes keep their interval), so
# a short outage opens the breaker while the probes still see the worker healthy (no_suspect_probe): every
# release then keeps a prefill out after a 0.4 s blip and a 2 s partition. Up to 1.12, which also keep a
# recovered worker out (breaker_no_readmit), a longer outage of one of two prefills is a race on both sides:
# in some runs the refused attempts reach the breaker's threshold before the probes take the worker out
# (harness.profile_check).
_SMG_ANY = ("api_reports_first_id", "no_identity_check", "breaker_charges_kv_failure", "no_suspect_probe")
# Seen in every smg release over gRPC: its --request-timeout-secs does not end a PD request whose decode hangs
# (hung_decode_ejected loses requests at a 1 s timeout that the reference router ends). Over HTTP (1.13.0) it
# does, and runs the request again whole.
_SMG = (*_SMG_ANY, "no_request_timeout")
# Up to 1.12: a request whose decode failed to load its KV runs again whole (`Retry backoff attempt=N` in its
# log; the releases fail `legs_once` where the reference passes). 1.13 runs a request again whole only when
# its decode leg failed at the transport (a crashed or restarting decode: `pipeline attempt failed
# attempt=0..3`), not when the engine answered the error itself, nor when the prefill leg failed.
_SMG_RETRY = (*_SMG, "retry_failed_requests")


@dataclass(frozen=True)
class GatewayProfile:
    name: str
    release: str  # the router spec of the real release (`--router` of `pdchaos run`/`matrix`)
    bugs: tuple[str, ...]
    description: str
    transports: tuple[str, ...] = TRANSPORTS
    breaker_default: tuple[int, float] | None = GATEWAY_BREAKER

    def apply(self, scenario: Scenario) -> Scenario:
        """The scenario as this release would run it: its switches on, its probe and request times as its
        adapter passes them (whole seconds, at least 1: a scaled 0.3 s probe interval is 1 s for the
        release), and its default circuit breaker where the scenario sets none (after the settings preset:
        the release's default is absolute)."""
        out = with_bugs(scenario, self.bugs)
        out = replace(out, router=as_passed(out.router))
        if self.breaker_default is not None and out.router.circuit_breaker_failures is None:
            failures, open_s = self.breaker_default
            out = replace(out, router=replace(out.router, circuit_breaker_failures=failures,
                                              circuit_breaker_open_s=open_s))
        return out


PROFILES: dict[str, GatewayProfile] = {
    p.name: p
    for p in (
        GatewayProfile(
            "smg-1.13.0", "smg==1.13.0", (*_SMG, "retry_transport_failures"),
            "re-reads the engine id after a restart its probes saw, but never notices one between probes; "
            "/workers keeps the id read at registration; a decode's failed KV load is charged to its "
            "breaker; a hung decode holds its requests past --request-timeout-secs; refused legs do not get "
            "their worker probed early: a short outage can open its breaker with no recovery to readmit it; "
            "a request whose decode leg failed at the transport (a crashed decode) runs again whole",
            transports=("grpc",),
        ),
        GatewayProfile(
            "smg-1.13.0-http", "smg==1.13.0", (*_SMG_ANY, "stale_engine_id", "retry_failed_requests"),
            "1.13.0 over HTTP, its workers registered with their KV transfer facts: as over gRPC, but the "
            "Mooncake engine id it was given is never read again (a restarted prefill's dead id is minted "
            "for good), its request timeout ends a request whose decode hangs, and a request whose leg "
            "failed or timed out runs again whole",
            transports=("http",),
        ),
        GatewayProfile(
            "smg-1.12.0", "smg==1.12.0", (*_SMG_RETRY, "breaker_no_readmit"),
            "as 1.13.0, runs a request whose decode failed again whole, and a recovered worker stays out "
            "until its breaker's open period ends (also one its refused legs took out while its probes "
            "saw it healthy)",
            transports=("grpc",),
        ),
        GatewayProfile(
            "smg-1.11.0", "smg==1.11.0", (*_SMG_RETRY, "breaker_no_readmit"),
            "as 1.12.0",
            transports=("grpc",),
        ),
        GatewayProfile(
            "smg-1.10.1", "smg==1.10.1",
            ("stale_engine_id", "api_reports_first_id", "breaker_charges_kv_failure", "breaker_no_readmit",
             "no_worker_404", "patch_drops_kv_config", "no_request_timeout", "retry_failed_requests",
             "no_suspect_probe"),
            "never re-reads the engine id after a restart (the #2491 hang), answers 404 for a leg with no "
            "worker, keeps recovered workers out for the breaker's open period, runs a failed request again "
            "whole, and loses a worker's KV transfer facts when its labels are updated",
            transports=("grpc",),
        ),
        GatewayProfile(
            "vllm-router-0.1.17", "vllm-router==0.1.17",
            ("stale_engine_id", "no_prefill_retry", "no_outlier_ejection"),
            "keeps the Mooncake engine ids read at startup for good, fails a refused prefill leg with 500 "
            "instead of retrying the other prefill, and keeps a hung decode in rotation (its request "
            "timeouts do not count against it)",
            transports=("http",),
        ),
    )
}


def profile_named(spec: str) -> GatewayProfile:
    """`profile:NAME` (or NAME) -> the profile; ValueError listing the known ones."""
    name = spec[len(PREFIX):] if spec.startswith(PREFIX) else spec
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown gateway profile {name!r} (known: {', '.join(PROFILES)})") from None


def check_profiles() -> None:
    """Every profile names known router switches (a programming error otherwise)."""
    for p in PROFILES.values():
        _router, engine = split_bugs(p.bugs)
        if engine:
            raise ValueError(f"profile {p.name} names engine switches {engine}")


class ProfileRouter(ReferenceRouter):
    """The reference router with a gateway profile's switches (they reach it through the scenario's
    RouterSettings.inject_bugs: see `GatewayProfile.apply`, which the runner calls in both worlds)."""

    def __init__(self, profile: GatewayProfile, api_key: str | None = "pdchaos-test-key") -> None:
        super().__init__(api_key)
        self.profile = profile
        self.name = PREFIX + profile.name

    def transport_problem(self, transport: str) -> str | None:
        """Why this profile does not model its release over `transport` (None: it does)."""
        if transport in self.profile.transports:
            return None
        return (f"profile {self.profile.name} models {self.profile.release} over "
                f"{'/'.join(self.profile.transports)} only (where harness.profile_check compares them)")


check_profiles()
