"""A real-vLLM restart starts the new engine only once every process of the previous start is gone (vLLM's
workers can outlive their API server after a SIGKILL); no vLLM needed: a shell stands in for the group."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.topology import allocate
from harness.vllm import VllmInstall
from harness.worlds.real.processes import ProcessSupervisor
from harness.worlds.real.vllm_engines import VllmFleet


def _fleet(sup: ProcessSupervisor, tmp_path: Path) -> VllmFleet:
    install = VllmInstall(home=tmp_path, python=Path(sys.executable), model_dir=tmp_path, versions={})
    return VllmFleet(allocate("1p1d", "nixl", "http"), None, sup, tmp_path, token=None, ready_timeout_s=1.0,
                     install=install)


async def test_a_restart_waits_until_the_previous_starts_workers_are_gone(tmp_path: Path) -> None:
    async with ProcessSupervisor(tmp_path / "logs") as sup:
        fleet = _fleet(sup, tmp_path)
        # The previous start: its leader is gone, a "worker" is left behind in its process group.
        old = await sup.spawn("prefill-0", ["sh", "-c", "sleep 60 & exit 0"])
        assert await old.wait(5.0) == 0
        assert old.signal(0), "the left-behind worker should still be in the group"
        fleet.procs["prefill-0"] = old
        await fleet._wait_gone("prefill-0")
        assert not old.signal(0)
        await fleet._wait_gone("decode-0")  # never started: nothing to wait for
