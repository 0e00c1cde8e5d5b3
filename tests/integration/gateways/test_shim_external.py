"""Issue #41's #2491 criterion through the shim: the fake engines started as smg's e2e suite starts vLLM, an
outage added with `pdchaos fault prefill-0 restart --new-id`, judged by the requests after it. smg 1.10.1
never re-reads the engine id (its requests hang); 1.13.0 does (they are answered)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.routers.gateways.cache import ReleaseCache
from harness.routers.gateways.spec import parse_router_spec

pytestmark = [
    pytest.mark.integration,
    pytest.mark.external,
    pytest.mark.skipif(
        os.environ.get("PDCHAOS_EXTERNAL") != "1", reason="external gateway test: PDCHAOS_EXTERNAL=1"
    ),
]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "shim" / "gateway_restart.py"


@pytest.mark.parametrize("version, expected", [("1.10.1", 1), ("1.13.0", 0)])
def test_restart_with_a_new_id_through_the_shim(version: str, expected: int, tmp_path: Path) -> None:
    smg = ReleaseCache().resolve(parse_router_spec(f"smg=={version}")).executable
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), "--gateway", str(smg), "--keep", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == expected, r.stdout + r.stderr
