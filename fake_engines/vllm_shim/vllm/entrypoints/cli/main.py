"""`python3 -m vllm.entrypoints.cli.main serve MODEL ...` (what `vllm serve` runs): a fake engine."""

import sys

from fake_engines.vllm_cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], "serve"))
