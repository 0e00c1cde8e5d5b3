"""How many cells run at once (`--jobs N`): the default from the machine's CPUs, and the flag's parser.

Kept apart from `harness.parallel` (the pool) so that building a command line imports nothing heavy.
"""

from __future__ import annotations

import argparse
import os

# Beyond this many real cells at once the set-up bursts (engines importing, routers starting) pile up on any
# machine we have measured; a user may still ask for more.
MAX_DEFAULT_JOBS = 8

JOBS_HELP = ("cells run at once (default: one per CPU this process may use, at most "
             f"{MAX_DEFAULT_JOBS}; 1 runs them one after the other); verdicts do not depend on it")


def machine_cpus() -> int:
    """CPUs this process may run on (its affinity, not the machine's total: a container or taskset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_jobs(cpus: int | None = None) -> int:
    """One cell per CPU. A real cell keeps about half a core busy (engines, router, client: see
    bench/parallel_walltime.py), so one per core leaves headroom for the timing its checkers judge; a
    simulated cell keeps a whole core busy, so more would only queue."""
    n = machine_cpus() if cpus is None else cpus
    return max(1, min(MAX_DEFAULT_JOBS, n))


def jobs_arg(text: str) -> int:
    """argparse type for --jobs: a whole number, at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--jobs takes a whole number, not {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"--jobs must be at least 1, not {n}")
    return n
