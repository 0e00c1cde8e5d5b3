"""vLLM CLI entry point, served by a pdchaos fake engine."""
