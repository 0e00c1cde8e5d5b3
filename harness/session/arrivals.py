"""When client requests are sent (pure, seeded): no sleeping load generator, a schedule the session follows.

Open loop: Poisson arrivals at the workload's rate over its duration, drawn from a numpy generator seeded
by the run's seed. Closed loop: `concurrency` clients, each sending its next request `think_time_s` after
its previous one ended, while the workload lasts (the session follows that rule as answers arrive).
"""

from __future__ import annotations

import numpy as np

from harness.scenario import Workload

# A separate stream from the prompts' draws: changing the prompt rules must not move the arrivals.
_ARRIVAL_STREAM = 0x617272


def open_loop_arrivals(w: Workload, seed: int) -> list[float]:
    """Send times (seconds from the load's start) of an open-loop workload: exponential gaps, the last
    arrival before `duration_s`."""
    if w.mode != "open" or w.rate_rps <= 0 or w.duration_s <= 0:
        return []
    rng = np.random.default_rng([_ARRIVAL_STREAM, seed & 0xFFFFFFFF])
    out: list[float] = []
    t = 0.0
    # Draw in blocks sized for the expected count: one or two draws cover a whole run.
    block = max(16, int(w.rate_rps * w.duration_s * 1.2) + 16)
    while True:
        for gap in rng.exponential(1.0 / w.rate_rps, block):
            t += float(gap)
            if t >= w.duration_s:
                return out
            out.append(t)
