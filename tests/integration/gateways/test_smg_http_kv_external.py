"""smg over HTTP as its users configure it: workers registered with their KV transfer facts (the default smg
adapter) hand off for real; workers from `--prefill/--decode` only (`smg-flags`) pass through, the decode
computing the prompt. The cell is the #2491 scenario (`prefill_restart_mooncake`, 1p1d, Mooncake, HTTP).

Skipped unless PDCHAOS_EXTERNAL=1. Releases from `PDCHAOS_SMG_SPECS` (comma separated, default `smg`), e.g.
`PDCHAOS_SMG_SPECS=smg==1.10.1,smg==1.11.0,smg==1.12.0,smg==1.13.0` (installed into the gateway cache on
first use). Each test prints the handoff outcomes before and after the restart (`-s` shows them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from harness.history import History, load_history
from harness.routers.gateways import make_gateway_adapter
from harness.routers.gateways.adapters import GatewayAdapter
from harness.runner import run_scenario
from harness.suite import load_named

pytestmark = [
    pytest.mark.external,
    pytest.mark.skipif(os.environ.get("PDCHAOS_EXTERNAL") != "1",
                       reason="external gateway test: PDCHAOS_EXTERNAL=1"),
]

SPECS = [s.strip() for s in os.environ.get("PDCHAOS_SMG_SPECS", "smg").split(",") if s.strip()]
SCENARIO = "prefill_restart_mooncake"


def _adapter(spec: str) -> GatewayAdapter:
    try:
        return make_gateway_adapter(spec)
    except Exception as e:  # no binary and no index: this machine cannot run the gateway
        pytest.skip(f"{spec}: {e}")


def split_outcomes(h: History) -> tuple[dict[str, int], dict[str, int]]:
    """Decode-side handoff outcomes (`local` for a decode that computed the prompt itself) before and after
    the restart was applied, placed on the scenario clock by the engines' own timestamps (`Handoff.at`: the
    records are collected at the end of the run)."""
    restarts = [f.applied_t for f in h.faults.values() if f.kind == "restart" and f.applied_t is not None]
    assert restarts, "the restart was never applied"
    restart_t = min(restarts)
    before: dict[str, int] = {}
    after: dict[str, int] = {}
    for ho in h.handoffs:
        if ho.kind == "prefill":
            continue
        key = "local" if ho.kind == "local" else str(ho.outcome)
        side = before if ho.at < restart_t else after
        side[key] = side.get(key, 0) + 1
    return before, after


async def _run(spec: str, tmp_path: Path) -> tuple[Any, dict[str, int], dict[str, int]]:
    (scenario,) = load_named([SCENARIO])
    a = _adapter(spec)
    assert a.cannot_run(scenario, "1p1d", "mooncake", "http") is None
    res = await run_scenario(scenario, "1p1d", "mooncake", "http", a, tmp_path / "cell")
    assert res.run_reason == "done", (res.run_reason, res.reason)
    before, after = split_outcomes(load_history(res.history_path))
    checks = {v.name: v.status for v in res.verdicts}
    print(f"\n{res.router}: verdict {res.status}; before restart {before}; after {after}; checks {checks}")
    return res, before, after


@pytest.mark.parametrize("spec", SPECS)
async def test_registered_facts_hand_off_before_the_restart(spec: str, tmp_path: Path) -> None:
    res, before, _ = await _run(spec, tmp_path)
    assert res.router.startswith("smg") and "flags" not in res.router  # the report names the variant
    assert before.get("pulled", 0) > 0, before
    assert set(before) == {"pulled"}, before  # no local compute, no recompute before the restart


@pytest.mark.parametrize("spec", SPECS)
async def test_flags_only_passes_through(spec: str, tmp_path: Path) -> None:
    flags_spec = spec.replace("smg", "smg-flags", 1)
    res, before, after = await _run(flags_spec, tmp_path)
    assert res.router.startswith("smg-flags")
    assert before.get("local", 0) > 0 and before.get("pulled", 0) == 0, before
    assert after.get("pulled", 0) == 0, after
