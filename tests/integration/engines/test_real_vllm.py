"""Real vLLM engines (`pdchaos engines install vllm` first): the fidelity probes against a real NIXL pair,
and the 1p1d NIXL outage scenarios on real vLLM with the reference router, over HTTP and gRPC, judged per
checker like the fakes. Minutes per test and about 2.5 GB of memory per engine: `real_engines` marker, run
with PDCHAOS_REAL_ENGINES=1 (never in the default run or CI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.fidelity.cli import EXIT_OK
from harness.fidelity.cli import main as fidelity_main
from harness.runner import run_scenario
from harness.scenario import load_scenarios
from harness.vllm import VllmNotInstalled, find_install


def _skip_reason() -> str | None:
    if os.environ.get("PDCHAOS_REAL_ENGINES") != "1":
        return "real vLLM engines: set PDCHAOS_REAL_ENGINES=1"
    try:
        find_install()
    except VllmNotInstalled as e:
        return f"real vLLM engines: {e}"
    return None


pytestmark = [pytest.mark.real_engines, pytest.mark.skipif(_skip_reason() is not None,
                                                             reason=_skip_reason() or "")]

SCENARIOS = ("prefill_restart_nixl", "prefill_process_frozen", "decode_crash", "sole_prefill_down")


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_fidelity_against_real_vllm_leaves_no_unexplained_difference(transport: str, tmp_path: Path) -> None:
    code = fidelity_main(["--transport", transport, "--out", str(tmp_path)])
    assert code == EXIT_OK, (tmp_path / "fidelity.md").read_text()


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("name", SCENARIOS)
async def test_scenario_gives_the_fakes_verdict_per_checker_on_real_vllm(name: str, transport: str,
                                                                          tmp_path: Path) -> None:
    (scenario,) = load_scenarios([name])
    fake = await run_scenario(scenario, "1p1d", "nixl", transport, "reference", tmp_path / "fake")
    real = await run_scenario(scenario, "1p1d", "nixl", transport, "reference", tmp_path / "vllm",
                              engines="vllm")
    on_fake = {v.name: v.status for v in fake.verdicts}
    on_real = {v.name: v.status for v in real.verdicts}
    # `output` is not judged on a random model (the adaptation says so); every other checker must agree.
    on_fake.pop("output", None)
    assert on_real == on_fake, real.to_dict()
