"""The argument parser of every `pdchaos` command: a bad flag is a usage error, exit 3.

argparse's own status for one is 2, which here means an unknown verdict: a CI job reading the exit status
would take a typo for a run that could not tell.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

EXIT_USAGE = 3


class UsageParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# Seeds are 32-bit: the workload's draws take 32 bits of a seed, so a larger one would repeat a smaller one's
# run.
SEED_MAX = 2**32 - 1


def seed_problem(value: object) -> str | None:
    """Why `value` is not a seed (None: it is one)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        return f"a seed is a whole number from 0 to {SEED_MAX}, not {value!r}"
    return None


def seed_arg(text: str) -> int:
    """argparse type of a --seed flag."""
    try:
        value: object = int(text)
    except ValueError:
        value = text
    problem = seed_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return int(text)


def at_least_one(flag: str) -> Callable[[str], int]:
    """argparse type of a count flag (`--jobs`, `--repeat`): a whole number, at least 1."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes a whole number, not {text!r}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be at least 1, not {n}")
        return n

    return parse
