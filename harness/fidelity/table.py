"""The side-by-side fidelity table: probe | fact | fake | real | router-actionable? (pure).

A difference is "explained" when `EXPLAINED` names it with the reason it does not mislead a router's
tests (or why the fakes keep it on purpose); `pdchaos fidelity` exits non-zero on any router-actionable
difference that is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.fidelity.observe import SOURCE_ONLY, ProbeResult

# (probe, fact) -> why a difference there is known and accepted.
EXPLAINED: dict[tuple[str, str], str] = {
    ("never_computed", "decode for a request the prefill never computed"): (
        "vLLM 0.32's NIXL decode reads the block ids it is given without the prefill checking that they "
        "hold that request's KV, so it answers 200 with whatever the blocks hold; the fakes refuse, as a "
        "correct engine would, and reproduce vLLM's behaviour with the kv_freed_while_read engine switch. "
        "A router's part (no decode leg without a prefill) is judged from the legs either way"),
}


@dataclass(frozen=True)
class FidelityRow:
    probe: str
    fact: str
    fake: str
    real: str
    actionable: bool
    source: str | None = None
    explained: str | None = None

    @property
    def compared(self) -> bool:
        return self.probe != SOURCE_ONLY

    @property
    def agree(self) -> bool:
        return self.fake == self.real

    @property
    def verdict(self) -> str:
        if not self.compared:
            return "from source only (not compared)"
        if self.agree:
            return "same"
        if not self.actionable:
            return "differs (not router-actionable)"
        return "differs (explained)" if self.explained else "DIFFERS (router-actionable)"

    def to_json(self) -> dict[str, Any]:
        return {"probe": self.probe, "fact": self.fact, "fake": self.fake, "real": self.real,
                "actionable": self.actionable, "compared": self.compared, "agree": self.agree,
                "verdict": self.verdict, "source": self.source, "explained": self.explained}


def compare(fake: list[ProbeResult], real: list[ProbeResult]) -> list[FidelityRow]:
    """One row per fact either side reported, in probe order; a probe one side skipped shows why."""
    by_name = {r.probe: r for r in real}
    rows: list[FidelityRow] = []
    for f in fake:
        r = by_name.get(f.probe)
        names = [x.name for x in f.facts] + [x.name for x in (r.facts if r else []) if not f.fact(x.name)]
        for name in names:
            ff, rf = f.fact(name), (r.fact(name) if r else None)
            rv = rf.value if rf else (f"skipped: {r.skipped}" if r and r.skipped else "not reported")
            fv = ff.value if ff else "not reported"
            actionable = (ff or rf).actionable if (ff or rf) else True
            rows.append(FidelityRow(f.probe, name, fv, rv, actionable, rf.source if rf else None,
                            EXPLAINED.get((f.probe, name))))
    return rows


def unexplained(rows: list[FidelityRow]) -> list[FidelityRow]:
    return [r for r in rows if r.compared and not r.agree and r.actionable and not r.explained]


def render_text(rows: list[FidelityRow], real_label: str) -> str:
    widths = (18, 34, 40, 40)
    head = ("probe", "fact", "fake", real_label)
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + "  verdict"]
    for r in rows:
        cells = (r.probe, r.fact, r.fake, r.real)
        lines.append("  ".join(c[:w].ljust(w) for c, w in zip(cells, widths, strict=True)) + f"  {r.verdict}")
    return "\n".join(lines)


def render_markdown(rows: list[FidelityRow], real_label: str) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    out = [f"| probe | fact | fake | {real_label} | router-actionable? |", "|---|---|---|---|---|"]
    for r in rows:
        mark = "yes" if r.actionable else "no"
        if not r.compared:
            mark += " (from source only, not compared)"
        elif not r.agree:
            mark += f" ({r.explained})" if r.explained else " **differs**"
        real = r.real + (f" ({r.source})" if r.source else "")
        out.append(f"| {r.probe} | {esc(r.fact)} | {esc(r.fake)} | {esc(real)} | {esc(mark)} |")
    return "\n".join(out)
