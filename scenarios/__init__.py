"""Scenario scripts (declarative)."""
