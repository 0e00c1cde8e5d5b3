"""`pdchaos bisect`: the first release of a gateway where a scenario's verdict (or one checker's) changes.

`search` is the pure part (the releases between two ends, the binary search over them with any judge);
`release_run` judges one release by running the scenario's cell against it (installed into the gateway cache
on demand); `report` writes bisect.json / bisect.md and the text printed; `cli` is the command.
"""

from __future__ import annotations

from harness.bisect.search import BisectResult, Outcome, bisect_releases, release_chain

__all__ = ["BisectResult", "Outcome", "bisect_releases", "release_chain"]
