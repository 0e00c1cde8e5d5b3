"""The request fields vLLM's OpenAI server knows, and the ones a body carries that it would pass by.

vLLM's request models accept unknown fields (pydantic `extra="allow"`) and only log them: "The following
fields were present in the request but ignored: {...}" (a warning in 0.10 and 0.11, a debug line since).
So a router that misspells a field, or adds one vLLM does not read, loses that setting without an error.
The lists are the union of `CompletionRequest` and `ChatCompletionRequest` over vLLM 0.10.0, 0.10.2,
0.11.0 and 0.34.0 (the fields read from each release's `protocol.py`): a field any of them knows is known.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

IGNORED_FIELDS_LOG = "The following fields were present in the request but ignored: %s"

_SHARED = frozenset({
    "add_special_tokens", "allowed_token_ids", "bad_words", "best_of", "cache_salt", "ec_transfer_params",
    "echo", "frequency_penalty", "guided_choice", "guided_decoding_backend", "guided_grammar", "guided_json",
    "guided_regex", "guided_whitespace_pattern", "ignore_eos", "include_stop_str_in_output",
    "kv_transfer_params", "length_penalty", "logit_bias", "logits_processors", "logprob_token_ids",
    "logprobs", "max_tokens", "min_p", "min_tokens", "mm_payload", "model", "n", "presence_penalty",
    "priority", "prompt_logprobs", "repetition_detection", "repetition_penalty", "request_id",
    "response_format", "return_mm_kwargs", "return_token_ids", "return_token_offsets",
    "return_tokens_as_token_ids", "return_weight_versions", "routed_experts_prompt_start", "seed",
    "session_id", "skip_special_tokens", "spaces_between_special_tokens", "stop", "stop_token_ids", "stream",
    "stream_interval", "stream_options", "structured_outputs", "temperature", "thinking_token_budget",
    "top_k", "top_p", "truncate_prompt_tokens", "truncation_side", "use_beam_search", "user", "vllm_xargs",
    "watermarking",
})
COMPLETION_FIELDS = _SHARED | {"prompt", "prompt_embeds", "suffix"}
CHAT_FIELDS = _SHARED | {
    "add_generation_prompt", "chat_template", "chat_template_kwargs", "continue_final_message", "documents",
    "include_reasoning", "max_completion_tokens", "media_io_kwargs", "messages", "mm_processor_kwargs",
    "parallel_tool_calls", "reasoning_effort", "return_prompt_text", "structural_tag", "tool_choice", "tools",
    "top_logprobs",
}


def ignored_fields(body: Mapping[str, Any], chat: bool) -> list[str]:
    """The fields of an OpenAI body that vLLM's server would pass by, in the body's order."""
    known = CHAT_FIELDS if chat else COMPLETION_FIELDS
    return [k for k in body if k not in known]
