"""The folder named in a pdchaos-started vLLM engine's PYTHONPATH (see sitecustomize.py)."""
