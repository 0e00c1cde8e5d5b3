"""Mooncake bootstrap ``GET /query`` answers: building them (prefill) and reading them (decode)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fake_engines.core.identity import rank_engine_ids


@dataclass(frozen=True)
class RankEntry:
    """One dp rank of a bootstrap answer."""

    dp_rank: int
    engine_id: str
    # (tp_rank, pp_rank) -> (host, port)
    workers: dict[tuple[int, int], tuple[str, int]]


def build_query_answer(engine_id: str, host: str, side_channel_ports: list[int]) -> dict[str, Any]:
    """``{"<dp_rank>": {"engine_id", "worker_addr": {"0": {"0": "tcp://host:port"}}}}``, one rank per port.

    Rank ids follow ``rank_engine_ids``: the plain id for a single rank, ``<id>_dp<rank>`` otherwise.
    """
    if not side_channel_ports:
        raise ValueError("need at least one side-channel port")
    ids = rank_engine_ids(engine_id, len(side_channel_ports))
    return {
        str(rank): {"engine_id": ids[rank], "worker_addr": {"0": {"0": f"tcp://{host}:{port}"}}}
        for rank, port in enumerate(side_channel_ports)
    }


def query_engine_ids(answer: Any) -> list[str]:
    """The engine ids a ``/query`` answer names, by rank (nothing for a malformed answer): what a router
    that read it could have learnt."""
    if not isinstance(answer, Mapping):
        return []
    ranks = sorted((k for k in answer if str(k).isdigit()), key=lambda k: int(k))
    ids = [answer[k].get("engine_id") if isinstance(answer[k], Mapping) else None for k in ranks]
    return [i for i in ids if isinstance(i, str)]


def parse_tcp_addr(addr: str) -> tuple[str, int]:
    """``tcp://host:port`` -> (host, port); ValueError when malformed."""
    if not isinstance(addr, str) or not addr.startswith("tcp://"):
        raise ValueError(f"not a tcp:// address: {addr!r}")
    host, sep, port = addr[len("tcp://") :].rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad tcp:// address: {addr!r}")
    return host, int(port)


def parse_query_answer(answer: Any) -> list[RankEntry]:
    """Validate a decoded ``/query`` JSON answer into rank entries sorted by rank; ValueError if malformed."""
    if not isinstance(answer, Mapping):
        raise ValueError("bootstrap answer must be a JSON object")
    entries: list[RankEntry] = []
    for rank_key, value in answer.items():
        if not str(rank_key).isdigit():
            raise ValueError(f"bad dp rank key {rank_key!r}")
        if not isinstance(value, Mapping) or not isinstance(value.get("engine_id"), str):
            raise ValueError(f"rank {rank_key}: missing engine_id")
        addr_map = value.get("worker_addr")
        if not isinstance(addr_map, Mapping):
            raise ValueError(f"rank {rank_key}: missing worker_addr")
        workers: dict[tuple[int, int], tuple[str, int]] = {}
        for tp_key, pp_map in addr_map.items():
            if not str(tp_key).isdigit() or not isinstance(pp_map, Mapping):
                raise ValueError(f"rank {rank_key}: bad tp entry {tp_key!r}")
            for pp_key, addr in pp_map.items():
                if not str(pp_key).isdigit():
                    raise ValueError(f"rank {rank_key}: bad pp key {pp_key!r}")
                workers[(int(tp_key), int(pp_key))] = parse_tcp_addr(addr)
        entries.append(RankEntry(int(rank_key), value["engine_id"], workers))
    return sorted(entries, key=lambda e: e.dp_rank)


def find_engine_addr(answer: Any, engine_id: str) -> tuple[str, int] | None:
    """Side-channel address (tp 0, pp 0) of the rank whose engine id is ``engine_id``; None when not listed.

    ValueError when the answer is malformed.
    """
    for entry in parse_query_answer(answer):
        if entry.engine_id == engine_id:
            addr = entry.workers.get((0, 0))
            if addr is None and entry.workers:
                addr = entry.workers[min(entry.workers)]
            return addr
    return None
