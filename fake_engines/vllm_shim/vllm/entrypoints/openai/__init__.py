"""vLLM OpenAI entry point, served by a pdchaos fake engine."""
