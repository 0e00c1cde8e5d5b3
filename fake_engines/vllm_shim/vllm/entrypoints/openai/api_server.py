"""`python3 -m vllm.entrypoints.openai.api_server ...`: a fake engine serving vLLM's HTTP API."""

import sys

from fake_engines.vllm_cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], "api_server"))
