"""Harness: topologies, scenarios, load, faults, history, checkers."""
