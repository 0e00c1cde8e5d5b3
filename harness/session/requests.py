"""What each client request is: a tagged prompt, an endpoint, streaming or not (pure, seeded).

Every prompt starts with the tag `[pdchaos:<run>:<seq>]` so the engines' handoff records can be joined to
the request. `expected_text` is what a correct handoff (or a local run) answers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from fake_engines.core.generator import (
    chat_digest,
    expected_chat_completion,
    expected_completion,
    seed_for_length,
    text_digest,
)
from harness.scenario import Workload

MODEL = "pdchaos-fake"
# What a request with a client's mistake names instead (`Workload.mistake_fraction`).
UNKNOWN_MODEL = "pdchaos-no-such-model"
MISTAKE_UNKNOWN_MODEL = "unknown_model"
# A stop string no answer holds (answers are lowercase words), as a client's section marker.
ABSENT_STOP = "###"

# Plain words only: the fake engines' tokenizer round-trips them and the tag stays intact.
_WORDS = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
    "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
    "whiskey", "xray", "yankee", "zulu", "river", "stone", "cloud", "maple", "cedar", "ember",
)


@dataclass(frozen=True)
class RequestPlan:
    seq: int
    tag: str
    endpoint: str  # "/v1/completions" | "/v1/chat/completions"
    stream: bool
    prompt: str
    max_tokens: int
    deadline_s: float
    body: dict[str, Any]
    mistake: str | None = None  # the client's mistake it carries (None: a right request)

    @property
    def chat(self) -> bool:
        return self.endpoint.endswith("chat/completions")


def make_tag(run_id: str, seq: int) -> str:
    return f"[pdchaos:{run_id}:{seq}]"


def plan_request(seq: int, run_id: str, rng: random.Random, w: Workload, model: str = MODEL) -> RequestPlan:
    """The seq-th request of a run: endpoint and streaming by the workload's fractions, a tagged prompt."""
    tag = make_tag(run_id, seq)
    n = rng.randint(w.prompt_words[0], w.prompt_words[1])
    prompt = tag + " " + " ".join(rng.choices(_WORDS, k=n))
    chat = rng.random() < w.chat_fraction
    stream = rng.random() < w.stream_fraction
    body: dict[str, Any] = {"model": model, "max_tokens": w.max_tokens, "stream": stream}
    if chat:
        endpoint = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": prompt}]
        # Drawn only when asked for, as mistakes are.
        if w.completion_tokens_fraction > 0 and rng.random() < w.completion_tokens_fraction:
            body["max_completion_tokens"] = body.pop("max_tokens")
    else:
        endpoint = "/v1/completions"
        body["prompt"] = prompt
    mistake = None
    # Drawn only when asked for: a workload without mistakes draws what it always drew (same histories).
    if w.mistake_fraction > 0 and rng.random() < w.mistake_fraction:
        mistake = MISTAKE_UNKNOWN_MODEL
        body["model"] = UNKNOWN_MODEL
    plan = RequestPlan(seq, tag, endpoint, stream, prompt, w.max_tokens, w.deadline_s, body, mistake)
    # Each drawn only when asked for (same histories otherwise).
    if w.eos_fraction > 0 and rng.random() < w.eos_fraction:
        # The seed whose answer is end of sequence at once: an empty answer, finish reason "stop".
        digest = chat_digest(body["messages"]) if chat else text_digest(prompt)
        body["seed"] = seed_for_length(digest, 0)
    if w.stop_fraction > 0 and rng.random() < w.stop_fraction:
        words = expected_text(plan).split()
        # Half the answer's first word (the output ends at its first token, before the word), half a stop
        # string the answer never holds (the router holds back its length and must let it out at the end).
        body["stop"] = [words[0] if words and rng.random() < 0.5 else ABSENT_STOP]
    return plan


def expected_text(plan: RequestPlan) -> str:
    """What a correct handoff returns for this request (cut where a stop string of it begins)."""
    stop = plan.body.get("stop") or ()
    seed = plan.body.get("seed")
    if plan.chat:
        return expected_chat_completion(plan.body["messages"], plan.max_tokens, seed, stop)
    return expected_completion(plan.prompt, plan.max_tokens, seed, stop)
