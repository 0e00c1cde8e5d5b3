"""A vLLM worker's KV transfer facts, as an operator hands them to smg's worker API over HTTP.

smg (1.10.0 and later) runs vLLM PD over `http://` workers (`routers/http/pd_router.rs`) and picks the KV
handoff from the prefill worker's metadata (`routers/common/kv_transfer.rs`): `kv_connector`
`MooncakeConnector` mints Mooncake params from `kv_engine_id` and the bootstrap host/port,
`NixlConnector` relays the prefill's params, anything else (absent included) is a passthrough and the decode
computes the prompt itself. Its HTTP discovery (the `--prefill/--decode` flags) does not read these facts:
the operator supplies them with the worker. 1.10.x takes them as labels (`kv_connector`, `kv_role`,
`kv_engine_id`, lifted out of the labels when the worker is created: `workflow/steps/local/create_worker.rs`)
and ignores them as spec fields (runs: 1.10.1 with spec fields registers no engine id, every decode computes);
1.11+ documents them as fields of the worker spec in `POST /workers` (runs: 1.11.0-1.13.0 hand off with
either spelling). The bootstrap port is a spec field in every release.

Where the facts come from, as an operator has them: the connector and the role are the engine's own
`--kv-transfer-config` (what the harness started it with); the Mooncake engine id is only known once the
engine runs, from its bootstrap server's `GET /query` (what vllm-router reads at startup too).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from fake_engines.core.calls import CALLER_HEADER, HARNESS
from harness.routers.gateways.spec import version_key

# vLLM's names (`kv_transfer_config.kv_connector` / `kv_role`) for the connectors and roles the harness runs.
CONNECTOR_NAMES = {"mooncake": "MooncakeConnector", "nixl": "NixlConnector"}
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
# First release whose worker spec takes the facts as fields; before it they travel as labels.
SPEC_FIELDS_SINCE = "1.11.0"

Style = Literal["labels", "spec", "both"]


@dataclass(frozen=True)
class KvFacts:
    """What smg needs to hand off KV for one worker (None: not known / not applicable)."""

    kv_connector: str
    kv_role: str
    kv_engine_id: str | None = None
    bootstrap_port: int | None = None
    dp_size: int | None = None


def facts_style(version: str | None) -> Style:
    """How a release takes the facts: its documented spelling. An unknown release (a binary from PATH) gets
    both: 1.10.x ignores the spec fields and reads the labels, 1.11+ reads either (seen with 1.10.1 to
    1.13.0)."""
    if version is None:
        return "both"
    return "spec" if version_key(version) >= version_key(SPEC_FIELDS_SINCE) else "labels"


def engine_facts(connector: str, role: str, bootstrap_port: int | None = None,
                 query_answer: Any = None) -> KvFacts:
    """The facts of one engine: connector and role from its config; for a Mooncake prefill the bootstrap
    port it was given and the engine id its `/query` answered (None when it could not be read)."""
    name = CONNECTOR_NAMES.get(connector)
    kv_role = KV_ROLES.get(role)
    if name is None or kv_role is None:
        raise ValueError(f"no vLLM KV facts for connector {connector!r}, role {role!r}")
    if connector != "mooncake" or role != "prefill":
        # NIXL carries the engine id in the prefill's answer, and a decode's id is never minted.
        return KvFacts(name, kv_role)
    engine_id, dp_size = engine_id_from_query(query_answer) if query_answer is not None else (None, None)
    return KvFacts(name, kv_role, engine_id, bootstrap_port, dp_size)


def engine_id_from_query(answer: Any) -> tuple[str | None, int | None]:
    """The engine id to register from a Mooncake bootstrap `/query` answer
    (`{"<dp_rank>": {"engine_id": ..., "worker_addr": ...}}`), and the DP size when there are several ranks.
    With DP, ranks answer `<base>_dp<rank>` and smg appends `_dp<rank>` itself, so the base is registered."""
    if not isinstance(answer, dict) or not answer:
        return None, None
    ranks: dict[int, str] = {}
    for k, v in answer.items():
        if not (isinstance(k, str) and k.isdigit() and isinstance(v, dict)):
            return None, None
        eid = v.get("engine_id")
        if not isinstance(eid, str) or not eid:
            return None, None
        ranks[int(k)] = eid
    if sorted(ranks) != list(range(len(ranks))):
        return None, None
    if len(ranks) == 1:
        return ranks[0], None
    suffix = "_dp0"
    first = ranks[0]
    if not first.endswith(suffix):
        return None, None
    base = first[: -len(suffix)]
    if any(ranks[r] != f"{base}_dp{r}" for r in ranks):
        return None, None
    return base, len(ranks)


def registration_body(url: str, role: str, facts: KvFacts | None, style: Style) -> dict[str, Any]:
    """The `POST /workers` body for one worker with its facts, spelled the way that release reads them."""
    body: dict[str, Any] = {"url": url, "worker_type": role}
    if facts is None:
        return body
    if facts.bootstrap_port is not None:
        body["bootstrap_port"] = facts.bootstrap_port
    fields: dict[str, str] = {"kv_connector": facts.kv_connector, "kv_role": facts.kv_role}
    if facts.kv_engine_id:
        fields["kv_engine_id"] = facts.kv_engine_id
    labels: dict[str, str] = {}
    if facts.dp_size is not None:
        # smg reads a DP prefill's size from its `dp_size` label (kv_transfer.rs), to suffix the engine id.
        labels["dp_size"] = str(facts.dp_size)
    if style in ("spec", "both"):
        body.update(fields)
    if style in ("labels", "both"):
        labels.update(fields)
    if labels:
        body["labels"] = labels
    return body


async def read_query(session: aiohttp.ClientSession, host: str, port: int, timeout_s: float) -> Any:
    """A Mooncake bootstrap server's `GET /query` answer (decoded JSON), retried until `timeout_s`; None when
    no usable answer came (the engine is down, or still loading). The harness reads it for the router's
    registration, so the read says it is the harness's (the engine's call records)."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    while True:
        left = deadline - time.monotonic()
        try:
            async with session.get(f"http://{host}:{port}/query", headers={CALLER_HEADER: HARNESS},
                                   timeout=aiohttp.ClientTimeout(total=max(0.2, min(1.0, left)))) as resp:
                if resp.status == 200:
                    answer = await resp.json(content_type=None)
                    if engine_id_from_query(answer)[0] is not None:
                        return answer
        except (aiohttp.ClientError, TimeoutError, ValueError):
            pass
        if time.monotonic() + 0.1 >= deadline:
            return None
        await asyncio.sleep(0.1)
