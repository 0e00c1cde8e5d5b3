"""Issue #41: smg's own PD end-to-end tests (e2e_test/router/test_pd_*.py from smg's repository), unchanged,
against the fake engines through the vLLM shim, with smg from PyPI: `examples/smg-e2e/run.sh` on a checkout
of smg, both of smg's vLLM legs (NIXL, Mooncake). Each test must end as examples/smg-e2e/README.md says:
the ones listed as passing pass; the ones that cannot run here did not pass (if one does, the note is stale).
A test smg added since is a failure here until the note says what it does.

    PDCHAOS_EXTERNAL=1 PDCHAOS_SMG_CHECKOUT=~/src/smg pytest tests/integration/engines/test_smg_e2e.py
"""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

CHECKOUT = os.environ.get("PDCHAOS_SMG_CHECKOUT", "")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.external,
    pytest.mark.skipif(
        os.environ.get("PDCHAOS_EXTERNAL") != "1" or not CHECKOUT,
        reason="external: PDCHAOS_EXTERNAL=1 and PDCHAOS_SMG_CHECKOUT=<a checkout of smg's repository>",
    ),
]

RUN_SH = Path(__file__).resolve().parents[3] / "examples" / "smg-e2e" / "run.sh"

NIXL = "test_pd_nixl.py::TestPDNixlKvTransfer::"
MOONCAKE = "test_pd_mooncake.py::TestPDMooncakeKvTransfer::"
MESSAGES = "test_pd_messages.py::TestPDMessagesGrpc::"
RESPONSES = "test_pd_responses.py::TestPDResponsesGrpc::"
MMLU = "test_pd_mmlu.py::"

# (leg, test) -> the outcome, as the note lists them.
PASS = {
    ("nixl", NIXL + "test_kv_transfer_params_relayed[pd_grpc]"),
    ("nixl", NIXL + "test_decode_worker_performed_nixl_handshake[pd_grpc]"),
    ("mooncake", MOONCAKE + "test_minted_params_injected[pd_grpc]"),
    ("mooncake", MOONCAKE + "test_workers_transferred_kv[pd_grpc]"),
} | {
    (leg, MESSAGES + f"{name}[pd_grpc]")
    for leg in ("nixl", "mooncake")
    for name in ("test_non_streaming_message", "test_streaming_message")
}
SKIPPED = {  # each KV check runs on its own leg only (smg's skipif)
    ("mooncake", NIXL + "test_kv_transfer_params_relayed[pd_grpc]"),
    ("mooncake", NIXL + "test_decode_worker_performed_nixl_handshake[pd_grpc]"),
    ("nixl", MOONCAKE + "test_minted_params_injected[pd_grpc]"),
    ("nixl", MOONCAKE + "test_workers_transferred_kv[pd_grpc]"),
}
CANNOT_RUN = {
    **{
        (leg, RESPONSES + f"{name}[{client}-pd_grpc]"): "a fake finishes on `length`: status incomplete"
        for leg in ("nixl", "mooncake")
        for client in ("openai", "smg")
        for name in (
            "test_basic_response_creation",
            "test_streaming_response",
            "test_store_false_not_retrievable",
        )
    },
    **{
        (leg, RESPONSES + f"test_previous_response_id_chaining[{client}-pd_grpc]"): "needs a model that reads"
        for leg in ("nixl", "mooncake")
        for client in ("openai", "smg")
    },
    **{
        (leg, MMLU + f"{cls}::test_pd_mmlu_basic[{mode}]"): "MMLU's CSV download and a 0.65 accuracy bar"
        for leg in ("nixl", "mooncake")
        for cls, mode in (("TestPDMMLUHttp", "pd_http"), ("TestPDMMLUGrpc", "pd_grpc"))
    },
}


def outcomes(junit: Path) -> dict[str, str]:
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-2]}.py::{case.get('classname', '').split('.')[-1]}::"
        name += case.get("name", "")
        kinds = {child.tag for child in case}
        out[name] = (
            "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        )
    return out


def test_smgs_pd_suite_through_the_shim(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    r = subprocess.run(
        ["bash", str(RUN_SH), CHECKOUT],
        env={**os.environ, "SMG_E2E_RUN_DIR": str(run_dir)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode != 3, f"run.sh could not set up:\n{tail}"
    seen = {
        (leg, test): outcome
        for leg in ("nixl", "mooncake")
        for test, outcome in outcomes(run_dir / leg / "junit.xml").items()
    }
    unlisted = sorted(set(seen) - PASS - SKIPPED - set(CANNOT_RUN))
    assert not unlisted, f"tests the note does not list: {unlisted}"
    wrong = {k: v for k, v in seen.items() if k in PASS and v != "passed"}
    wrong |= {k: v for k, v in seen.items() if k in SKIPPED and v != "skipped"}
    assert not wrong, f"{wrong}\n{tail}"
    now_pass = sorted(k for k, v in seen.items() if k in CANNOT_RUN and v == "passed")
    assert not now_pass, f"these pass now: update examples/smg-e2e/README.md and CANNOT_RUN: {now_pass}"
    missing = sorted(PASS - set(seen))
    assert not missing, f"expected to run but did not: {missing}"
