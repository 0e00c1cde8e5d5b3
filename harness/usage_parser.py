"""The argument parser of every `pdchaos` command: a bad flag is a usage error, exit 3.

argparse's own status for one is 2, which here means an unknown verdict: a CI job reading the exit status
would take a typo for a run that could not tell.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

EXIT_USAGE = 3


class UsageParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
