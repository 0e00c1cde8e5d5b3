"""KV handoff parameters per connector, and the sanitised prefill leg (DESIGN §2, PD dispatch).

Mooncake: the router mints a transfer id per request and tells the decode where to pull from (the prefill's
engine id in force and its bootstrap address). With no known id it cannot mint: `mint_skipped` says why, the
decode gets no handoff params and recomputes. NIXL: the prefill is tagged `do_remote_decode`, and its
response's kv_transfer_params go to the decode verbatim (bug #11). Connector none: no params on either leg.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .workers import Connector, Worker

UuidFactory = Callable[[], uuid.UUID]

MINT_NO_ENGINE_ID = "no_engine_id"
MINT_CONNECTOR_UNKNOWN = "connector_unknown"
MINT_NO_BOOTSTRAP_PORT = "no_bootstrap_port"
NIXL_NO_PARAMS = "prefill_returned_no_kv_transfer_params"


def mint_transfer_id(new_uuid: UuidFactory = uuid.uuid4) -> str:
    """A Mooncake transfer id: "xfer-<uuid4 hex>"."""
    return f"xfer-{new_uuid().hex}"


def ranked_engine_id(engine_id: str, dp_size: int, dp_rank: int) -> str:
    """The engine id of one data-parallel rank: `<id>_dp<rank>` when dp_size > 1, else the id itself."""
    if dp_size <= 1:
        return engine_id
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank {dp_rank} out of range for dp_size {dp_size}")
    return f"{engine_id}_dp{dp_rank}"


@dataclass(frozen=True)
class HandoffPlan:
    """The KV params of one PD request. `decode_params()` gives the decode leg's params once the prefill
    answered (NIXL needs its response); `mint_skipped` is the reason when Mooncake could not mint."""

    connector: Connector | None
    prefill_params: dict[str, Any] | None
    transfer_id: str | None = None
    remote_engine_id: str | None = None
    remote_bootstrap_addr: str | None = None
    mint_skipped: str | None = None

    def decode_params(
        self, prefill_response_params: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """Mooncake: the minted params (None when not minted). NIXL: the prefill response's params verbatim
        (None when it carried none). Otherwise None."""
        if self.connector is Connector.MOONCAKE:
            if self.transfer_id is None:
                return None
            return {
                "do_remote_decode": False,
                "do_remote_prefill": True,
                "transfer_id": self.transfer_id,
                "remote_engine_id": self.remote_engine_id,
                "remote_bootstrap_addr": self.remote_bootstrap_addr,
            }
        if self.connector is Connector.NIXL:
            return dict(prefill_response_params) if prefill_response_params else None
        return None

    @staticmethod
    def nixl_relay_problem(prefill_response_params: Mapping[str, Any] | None) -> str | None:
        """The reason a NIXL decode would recompute (no params from the prefill), or None."""
        return None if prefill_response_params else NIXL_NO_PARAMS


def plan_handoff(
    prefill: Worker,
    *,
    dp_rank: int = 0,
    transfer_id: str | None = None,
    new_uuid: UuidFactory = uuid.uuid4,
) -> HandoffPlan:
    """The handoff for a request whose prefill leg goes to `prefill` (its connector decides the mode).

    transfer_id: use this one instead of minting (tests); new_uuid: the uuid source when minting.
    """
    conn = prefill.connector
    if conn is Connector.NIXL:
        return HandoffPlan(conn, {"do_remote_decode": True, "do_remote_prefill": False})
    if conn is Connector.NONE:
        return HandoffPlan(conn, None)
    if conn is None:
        return HandoffPlan(None, None, mint_skipped=MINT_CONNECTOR_UNKNOWN)
    engine_id = prefill.engine_id
    if not engine_id:
        return HandoffPlan(conn, None, mint_skipped=MINT_NO_ENGINE_ID)
    port = prefill.bootstrap_port
    if port is None:
        return HandoffPlan(conn, None, mint_skipped=MINT_NO_BOOTSTRAP_PORT)
    tid = transfer_id if transfer_id is not None else mint_transfer_id(new_uuid)
    host = prefill.spec.host
    if ":" in host:  # an IPv6 literal goes in brackets in a URL
        host = f"[{host}]"
    return HandoffPlan(
        conn,
        {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": tid},
        transfer_id=tid,
        remote_engine_id=ranked_engine_id(engine_id, prefill.dp_size, dp_rank),
        remote_bootstrap_addr=f"http://{host}:{port}",
    )


# A stop condition could end the prefill before its one-token length cap, and vLLM's prefill then frees its
# KV at once (a Mooncake decode waits out its transfer timeout for it; a NIXL decode gets no params and
# computes the prompt again): the decode leg keeps the client's stop strings and applies them. End of
# sequence is such a stop too (vLLM checks it before the length cap): `ignore_eos` keeps the prefill going.
_PREFILL_DROP = ("min_tokens", "stream_options", "stop", "stop_token_ids")


def sanitize_prefill_body(
    body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A copy of the client's request body for the prefill leg: one token, not streamed, one choice, no
    min_tokens/stream_options/stop strings, end of sequence ignored, max_completion_tokens 1 when present,
    and the prefill's KV params (or none)."""
    out = {k: v for k, v in body.items() if k not in _PREFILL_DROP}
    out["stream"] = False
    out["max_tokens"] = 1
    out["n"] = 1
    out["ignore_eos"] = True
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("kv_transfer_params", None)
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = dict(kv_transfer_params)
    return out


def decode_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of the client's request body for the decode leg, carrying the handoff params (or none)."""
    out = dict(body)
    out.pop("kv_transfer_params", None)
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = dict(kv_transfer_params)
    return out
