"""Small HTML pieces every report page shares: escaping, a verdict badge, seconds."""

from __future__ import annotations

import html
from typing import Any


def esc(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def badge(status: str | None) -> str:
    s = status or "unknown"
    return f'<span class="badge {esc(s)}">{esc(s.upper())}</span>'


def fmt_s(x: Any) -> str:
    return f"{x:.2f}s" if isinstance(x, int | float) and not isinstance(x, bool) else "-"
