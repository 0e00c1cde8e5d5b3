"""junit.xml: one testcase per scenario x cell (topology-connector-transport), for CI dashboards.

pass -> plain testcase; fail -> `<failure>`; unknown -> `<error type="unknown">`. Unknown is reported as an
error, not `<skipped>`: CI treats skipped as green, and an unknown verdict (the harness could not tell) must
never read as a pass.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from harness.result import ScenarioResult, relative, summarize
from harness.text import clip
from pdchaos import __version__

JUNIT_XML = "junit.xml"


def _details(r: ScenarioResult) -> str:
    """Per-checker lines, then a little evidence for each checker that did not pass."""
    lines = [f"{v.status.upper():7} {v.name}: {v.reason}" for v in r.verdicts]
    for v in r.verdicts:
        if v.status != "pass" and v.evidence:
            lines.append(f"evidence ({v.name}): " + "; ".join(str(e) for e in v.evidence[:5]))
    return "\n".join(lines)


def _files(r: ScenarioResult, run_dir: Path) -> str:
    lines = []
    if r.history_path is not None:
        lines.append(f"history: {relative(r.history_path, run_dir)}")
    lines += [f"log: {relative(p, run_dir)}" for p in r.logs()]
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


def case_names(results: list[ScenarioResult]) -> list[str]:
    """Each result's test case name: `<cell>[<router>]`, with the world and settings added where that alone
    names two results of one scenario (a sweep over worlds), then the folder group (a sweep over engines): a
    CI system keys test cases by class and name, and would fold two into one."""

    def plain(r: ScenarioResult) -> str:
        return f"{r.cell}[{r.router}]" if r.router else r.cell

    def qualified(r: ScenarioResult) -> str:
        return f"{r.cell}[{', '.join(x for x in (r.router, r.world, r.settings) if x)}]"

    def grouped(r: ScenarioResult) -> str:
        folder = r.folder()
        return f"{qualified(r)} @ {folder.parent.name}" if folder is not None else qualified(r)

    names = [plain(r) for r in results]
    for better in (qualified, grouped):
        seen = Counter((r.scenario, n) for r, n in zip(results, names, strict=True))
        names = [better(r) if seen[(r.scenario, n)] > 1 else n for r, n in zip(results, names, strict=True)]
    return names


def junit_tree(results: list[ScenarioResult], run_dir: Path) -> ET.ElementTree:
    s = summarize(results)
    total_time = sum(r.duration_s or 0.0 for r in results)
    suites = ET.Element("testsuites", name="pdchaos", tests=str(s["total"]))
    suite = ET.SubElement(
        suites,
        "testsuite",
        # The same name every run: CI groups a suite's history by it (the run folder is a property).
        name="pdchaos",
        tests=str(s["total"]),
        failures=str(s["fail"]),
        errors=str(s["unknown"]),
        skipped="0",
        time=f"{total_time:.3f}",
    )
    ET.SubElement(ET.SubElement(suite, "properties"), "property", name="run_folder", value=run_dir.name)
    for r, name in zip(results, case_names(results), strict=True):
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"pdchaos.{r.scenario}",
            name=name,
            time=f"{r.duration_s or 0.0:.3f}",
        )
        props = ET.SubElement(case, "properties")
        for name, value in (("bugs", ",".join(r.bugs)), ("status", r.status or ""), ("world", r.world),
                            ("settings", r.settings), ("time_unit", r.time_unit), ("seed", str(r.seed)),
                            ("replay", r.replay),
                            ("pdchaos_version", __version__)):
            ET.SubElement(props, "property", name=name, value=value)
        reason = r.overall.reason or r.status or ""
        if r.status == "fail":
            el = ET.SubElement(case, "failure", message=clip(reason, 500), type="fail")
            el.text = _details(r)
        elif r.status == "race":
            # Surefire's form for a test that failed on some runs and passed on others: CI reads it as
            # flaky, neither a pass nor a plain failure. One element per failing run.
            for i, run in enumerate(r.runs, 1):
                if run.get("status") == "fail":
                    message = clip(f"run {i}: {run.get('reason')}", 500)
                    el = ET.SubElement(case, "flakyFailure", message=message, type="race")
                    el.text = _details(r)
        elif r.status != "pass":
            el = ET.SubElement(case, "error", message=clip(reason, 500), type="unknown")
            el.text = _details(r)
        out = ET.SubElement(case, "system-out")
        # Failing cases carry the checker lines in <failure>/<error>; passing ones here.
        head = _details(r) + "\n" if r.status in ("pass", "race") else ""
        out.text = head + _files(r, run_dir)
    _xml_safe(suites)
    ET.indent(suites)
    return ET.ElementTree(suites)


# Characters XML 1.0 cannot hold, even escaped (a router's stderr in a reason can carry them: BEL, NUL, a lone
# ESC); ElementTree writes them as they are and the file no longer parses.
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _clean(text: str) -> str:
    return _NOT_XML.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _xml_safe(root: ET.Element) -> None:
    """Every text and attribute value with the characters XML cannot hold written as Python escapes."""
    for el in root.iter():
        if el.text:
            el.text = _clean(el.text)
        for key, value in el.attrib.items():
            el.attrib[key] = _clean(value)


def write_junit(results: list[ScenarioResult], run_dir: Path, name: str = JUNIT_XML) -> Path:
    path = run_dir / name
    tmp = path.with_suffix(f".xml.{os.getpid()}.tmp")
    junit_tree(results, run_dir).write(tmp, encoding="utf-8", xml_declaration=True)
    os.replace(tmp, path)
    return path
