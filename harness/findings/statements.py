"""What each checker's failure means, in a user's words: one sentence per mechanism."""

from __future__ import annotations

# A handoff failure is stated by its worst problem (the reason class `handoff` gives).
HANDOFF_STATEMENTS: dict[str, str] = {
    "digest_mismatch": "a decode received KV that was not its own request's",
    "stale_engine_id": "decodes were told a prefill engine id that was not the one in force, so their KV "
                       "pulls failed",
    "local_compute": "a decode computed a prompt itself instead of pulling the prefill's KV",
    "recomputed": "a prefill computed the same prompt again for one request",
    "pull_failed": "KV pulls failed or timed out on the decodes",
}

STATEMENTS: dict[str, str] = {
    "handoff_params": "decodes were handed KV parameters the contract does not derive from the prefill's id "
                      "in force",
    "no_local_compute": "a decode computed a prompt itself although the router gave it no reason to",
    "output": "clients got text their prompts do not produce",
    "legs_once": "a request's leg reached an engine more than once: the router ran the request again",
    "legs_sequenced": "a decode leg ran before its prefill leg had finished",
    "status_contract": "the router's worker status broke the health contract (thresholds and probe outcomes)",
    "breaker_contract": "the circuit breaker kept out or let in a worker against its contract",
    "probe_schedule": "a worker went unprobed for longer than the probe interval allows",
    "metadata_reads": "the router read engine metadata more or less often than the contract allows",
    "router_events": "the router's own events contradict the engines' records or the contract, or leave out "
                     "what it did",
    "engine_conduct": "an engine did not behave as vLLM does (engine side)",
    "request_contract": "requests were answered against the request contract (refused early, held past the "
                        "deadline, or a client's mistake not relayed)",
    "leg_shape": "a leg reached an engine in a shape the contract does not allow",
    "error_answers": "error answers did not carry the OpenAI error body (a JSON error object with a message "
                     "and a type)",
    "router_metrics": "the router's counters (/metrics) disagree with its own events",
    "call_deadlines": "a health probe or engine-id read was held open past the router's probe timeout: "
                      "a wait without a deadline",
    "probe_slots": "the router had more health probes or engine-id reads open at once than its "
                   "max_concurrent_health_checks allows",
    "worker_api": "the worker API did not refuse a mistaken call with a 4xx naming the field, or let it "
                  "change the worker",
    "reported_engine_id": "the router's worker list kept showing an old engine id after the engine's id "
                          "changed",
    "prompt_503": "an outage was not answered with a prompt 503",
    "workers_ready": "a worker never became Ready",
    "nothing_lost": "requests were lost: the client got no answer before its deadline",
    "availability": "too few requests succeeded during or after a fault",
    "recovery": "a worker was kept out after its fault healed",
    "latency": "successful requests were held up during a fault",
    "transfer_timeout": "requests waited out the KV transfer timeout",
    "balance": "load was not spread across the engines of a role",
}


def statement(checker: str, reason_class: str) -> str:
    if checker == "handoff" and reason_class in HANDOFF_STATEMENTS:
        return HANDOFF_STATEMENTS[reason_class]
    return STATEMENTS.get(checker, f"{checker} failed: {reason_class}")
