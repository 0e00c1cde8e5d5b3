"""Fake vLLM-like engines with KV handoff emulation and fault controls."""
