"""Chat prompt rendering: pure Python twin of the ``chat_template`` shipped in tokenizer_config.json.

A gateway renders the Jinja template itself; the fake engine (no Jinja) renders the same text with
``render_chat``. Both must agree byte for byte for string contents.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def message_text(content: Any) -> str:
    """A message's content as text: a string as is, OpenAI content parts joined (text parts only)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if (
                not isinstance(part, Mapping)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise ValueError(
        f"message content must be a string or a list of text parts, got {type(content).__name__}"
    )


def render_chat(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """OpenAI ``messages`` -> the prompt text the engine tokenizes. ValueError on malformed messages."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise ValueError(f"message {i} must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError(f"message {i} needs a string 'role'")
        out.append(f"{IM_START}{role}\n{message_text(msg.get('content'))}{IM_END}\n")
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return "".join(out)
