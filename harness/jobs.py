"""How many cells run at once (`--jobs N`): the default from the machine's CPUs, and the flag's parser.

Kept apart from `harness.parallel` (the pool) so that building a command line imports nothing heavy.
"""

from __future__ import annotations

import os

from harness.usage_parser import at_least_one

# Beyond this many real cells at once the set-up bursts (engines importing, routers starting) pile up on any
# machine we have measured; a user may still ask for more.
MAX_DEFAULT_JOBS = 8

JOBS_HELP = ("cells run at once (default: two per CPU this process may use for real-time cells of fake "
             f"engines, one per CPU for simulated ones, at most {MAX_DEFAULT_JOBS}; 1 runs them one after "
             "the other); verdicts do not depend on it")


def machine_cpus() -> int:
    """CPUs this process may run on (its affinity, not the machine's total: a container or taskset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# A real cell of fake engines keeps about a third of a core busy (2.4 CPU-s over its ~7 s, the router and
# engines forked from a preloaded server: bench/parallel_walltime.py), so two per core still leave headroom
# for the timing its checkers judge; the default suite gave the same verdicts at 1, 2 and 4 cells on 2 cores.
REAL_CELLS_PER_CPU = 2


def default_jobs(cpus: int | None = None, real_time: bool = False) -> int:
    """Cells at once by default: one per CPU for simulated cells (each keeps a whole core busy, so more
    would only queue), `REAL_CELLS_PER_CPU` per CPU for real-time cells of fake engines (mostly waiting);
    at most `MAX_DEFAULT_JOBS` either way."""
    n = machine_cpus() if cpus is None else cpus
    per_cpu = REAL_CELLS_PER_CPU if real_time else 1
    return max(1, min(MAX_DEFAULT_JOBS, n * per_cpu))


jobs_arg = at_least_one("--jobs")
