"""The signatures each bug switch is known to produce, from a zoo run: a finding whose signature one of
them has matches that switch's symptom.

The catalogue (`known_signatures.json` beside this module) is derived from the committed zoo matrix
(`tests/data/zoo.json`); a test fails when the two disagree, so regenerating the matrix regenerates it:
`pdchaos zoo --rejudge DIR` writes `signatures.json` into the zoo folder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

CATALOGUE = Path(__file__).with_name("known_signatures.json")


def signatures_from_zoo(zoo: Mapping[str, Any]) -> dict[str, list[str]]:
    """switch -> the finding signatures of the verdicts that caught it, over every cell (sorted)."""
    out: dict[str, list[str]] = {}
    for name, info in sorted((zoo.get("switches") or {}).items()):
        sigs = {s for cell in (info.get("cells") or {}).values() if cell.get("caught")
                for s in cell.get("signatures") or []}
        out[name] = sorted(sigs)
    return out


@cache
def known_signatures() -> dict[str, tuple[str, ...]]:
    """The shipped catalogue; empty when it is missing or unreadable (findings then name no switch)."""
    try:
        data = json.loads(CATALOGUE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): tuple(str(s) for s in v) for k, v in data.items() if isinstance(v, list)}
