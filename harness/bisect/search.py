"""The releases between a good and a bad end, and the binary search for the adjacent pair where the verdict
changes. Pure: the judge is any async callable (a real run, or a table in tests)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.routers.gateways.spec import version_key

UNKNOWN = "unknown"


@dataclass(frozen=True)
class Outcome:
    """One release judged: `status` is what is compared (`pass`, `fail`, or `unknown`: no verdict to compare),
    `reason` says why it is not a pass, `detail` is the judge's evidence (JSON-able)."""

    version: str
    status: str
    reason: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "status": self.status, "reason": self.reason, **self.detail}


Judge = Callable[[str], Awaitable[Outcome]]


@dataclass
class BisectResult:
    """`pair` (good side, bad side: adjacent in `chain`) when found; else `reason` says why there is none.
    `tested` in the order the releases were run; `chain` from the good end to the bad end."""

    chain: list[str]
    tested: list[Outcome]
    pair: tuple[Outcome, Outcome] | None = None
    reason: str = ""
    # Releases the change is known to lie between when the search stopped early (an unknown run).
    narrowed: tuple[str, str] | None = None

    @property
    def found(self) -> bool:
        return self.pair is not None


def release_chain(available: Sequence[str], good: str, bad: str) -> list[str]:
    """The releases from `good` to `bad`, both included, in that direction (either may be the newer).
    ValueError when an end is not among `available` or both ends are the same release."""
    if version_key(good) == version_key(bad):
        raise ValueError(f"--good and --bad name the same release ({good})")
    known = {version_key(v): v for v in available}
    missing = [v for v in (good, bad) if version_key(v) not in known]
    if missing:
        raise ValueError(f"release {', '.join(missing)} is not on the list of releases "
                         f"({', '.join(sorted(known.values(), key=version_key)) or 'none'})")
    lo, hi = sorted((version_key(good), version_key(bad)))
    between = sorted((v for k, v in known.items() if lo <= k <= hi), key=version_key)
    return between if version_key(good) == lo else between[::-1]


async def bisect_releases(chain: Sequence[str], judge: Judge,
                          res: BisectResult | None = None) -> BisectResult:
    """Judge both ends, then halve the releases between them until the two that differ are adjacent.
    Each release is judged at most once. An unknown outcome ends the search (its reason says why): a guess in
    its place could point at the wrong pair. `res`, when given, is filled as the search goes (what an
    interrupted search had judged)."""
    chain = list(chain)
    res = res if res is not None else BisectResult(chain, [])
    if len(chain) < 2:
        res.reason = "fewer than two releases to compare"
        return res
    seen: dict[int, Outcome] = {}

    async def at(i: int) -> Outcome:
        if i not in seen:
            seen[i] = await judge(chain[i])
            res.tested.append(seen[i])
        return seen[i]

    good, bad = await at(0), await at(len(chain) - 1)
    for end, o in (("good", good), ("bad", bad)):
        if o.status == UNKNOWN:
            res.reason = f"the {end} end {o.version} gave no verdict: {o.reason or 'unknown'}"
            return res
    if good.status == bad.status:
        res.reason = (f"the verdicts at both ends are the same ({good.version}: {good.status}, "
                      f"{bad.version}: {bad.status}): nothing changes between them")
        return res
    lo, hi = 0, len(chain) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        o = await at(mid)
        if o.status == UNKNOWN:
            res.reason = f"{o.version} gave no verdict: {o.reason or 'unknown'}"
            res.narrowed = (chain[lo], chain[hi])
            return res
        if o.status == good.status:
            lo = mid
        else:
            hi = mid
    res.pair = (seen[lo], seen[hi])
    return res


def max_runs(n: int) -> int:
    """Releases judged at most for a chain of n (both ends, then one per halving)."""
    if n < 2:
        return 0
    steps, span = 0, n - 1
    while span > 1:
        span = (span + 1) // 2
        steps += 1
    return 2 + steps
