"""`python3 -m vllm.entrypoints.grpc_server ...`: a fake engine serving vLLM's gRPC API."""

import sys

from fake_engines.vllm_cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], "grpc_server"))
