"""vLLM entry points, served by pdchaos fake engines."""
