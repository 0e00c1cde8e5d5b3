"""Findings: each distinct problem of a run once, with the cells that show it (`compute_findings`)."""

from harness.findings.delta import FindingChange, delta_lines, findings_delta, findings_of, findings_of_folder
from harness.findings.group import (
    Finding,
    cell_label,
    compute_findings,
    evidence_text,
    leads,
    sided_first,
    verdict_signature,
)
from harness.findings.known import known_signatures, signatures_from_zoo

__all__ = [
    "Finding",
    "FindingChange",
    "cell_label",
    "compute_findings",
    "delta_lines",
    "evidence_text",
    "findings_delta",
    "findings_of",
    "findings_of_folder",
    "known_signatures",
    "leads",
    "sided_first",
    "signatures_from_zoo",
    "verdict_signature",
]
