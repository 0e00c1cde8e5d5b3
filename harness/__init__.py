"""Harness: topologies, scenarios, load, faults, history, checkers."""

import os

# The harness talks gRPC (relays, probes) while it starts processes; every child execs at once, so gRPC's
# fork handlers have nothing to protect, and with them on gRPC logs a line per spawn ("Other threads are
# currently calling into gRPC, skipping fork() handlers"). Read when grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
