"""The GitHub Actions workflow in examples/ci is complete and says only what pdchaos accepts: its structure is
that of a workflow, and each `pdchaos` command in it parses with pdchaos's own parser (a dry run)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from harness.cli import build_parser
from harness.routers.gateways.spec import parse_router_spec

yaml = pytest.importorskip("yaml")
WORKFLOW = Path(__file__).resolve().parents[3] / "examples" / "ci" / "github-actions.yml"


def _workflow() -> dict[Any, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def _steps() -> list[dict[str, Any]]:
    return [s for job in _workflow()["jobs"].values() for s in job["steps"]]


def test_it_has_the_shape_of_a_workflow() -> None:
    doc = _workflow()
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert set(triggers) == {"pull_request", "push"}
    for job in doc["jobs"].values():
        assert job["runs-on"] and isinstance(job["timeout-minutes"], int)
    for step in _steps():
        assert ("uses" in step) != ("run" in step), step
        if "uses" in step:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", step["uses"]), step["uses"]  # pinned to a major


def test_each_pdchaos_command_parses_and_names_a_router_pdchaos_knows() -> None:
    commands = [line for s in _steps() for line in str(s.get("run", "")).splitlines()
                if line.strip().startswith("pdchaos ")]
    assert commands
    routers = []
    for line in commands:
        args = build_parser().parse_args(shlex.split(line)[1:])
        if args.command == "run":
            routers.append(parse_router_spec(args.router))
    assert routers
    run_step = next(s for s in _steps() if "pdchaos run" in str(s.get("run", "")))
    # The gateway built in the job replaces a cached release: the variable its adapter reads is the one set.
    for spec in routers:
        assert spec.kind == "gateway" and spec.gateway is not None, spec
        assert spec.gateway.env_var in run_step["env"], spec


def test_the_reports_kept_are_where_the_run_writes_them() -> None:
    run = next(s["run"] for s in _steps() if "pdchaos run" in str(s.get("run", "")))
    out = shlex.split(run)[shlex.split(run).index("--out") + 1]
    paths = [str(s["with"].get(k)) for s in _steps() if "with" in s for k in ("path", "report_paths")
             if s["with"].get(k)]
    assert f"{out}/" in paths and f"{out}/junit.xml" in paths
