"""pdchaos: chaos test harness for prefill/decode disaggregated LLM serving."""
