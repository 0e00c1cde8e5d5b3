"""The prefill's KV store: blocks held for a remote decode until pulled or until the abort timeout."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

BLOCK_SIZE = 16


@dataclass(frozen=True)
class KvBlock:
    """What a prefill computed for one request: enough to prove which prompt the KV belongs to."""

    prompt_digest: str
    n_tokens: int
    block_ids: tuple[int, ...]
    created_at: float


def n_blocks(n_tokens: int, block_size: int = BLOCK_SIZE) -> int:
    """Blocks needed for ``n_tokens`` (at least one, as an engine always holds the first block)."""
    return max(1, -(-n_tokens // block_size))


class KvStore:
    """Transfer key (Mooncake ``transfer_id`` / NIXL ``remote_request_id``) -> KvBlock, bounded in entries.

    Entries leave when pulled, when older than ``abort_timeout_s`` (``expire``), or oldest-first when full.
    """

    def __init__(self, abort_timeout_s: float = 480.0, max_entries: int = 4096, block_size: int = BLOCK_SIZE):
        if abort_timeout_s <= 0:
            raise ValueError(f"abort_timeout_s must be > 0, got {abort_timeout_s}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.abort_timeout_s = abort_timeout_s
        self.max_entries = max_entries
        self.block_size = block_size
        self._entries: OrderedDict[str, KvBlock] = OrderedDict()
        self._next_block = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def allocate(self, key: str, prompt_digest: str, n_tokens: int, now: float) -> KvBlock:
        """Make a KvBlock with fresh block ids for ``n_tokens`` and ``put`` it under ``key``."""
        count = n_blocks(n_tokens, self.block_size)
        ids = tuple(range(self._next_block, self._next_block + count))
        self._next_block += count
        block = KvBlock(prompt_digest, n_tokens, ids, now)
        self.put(key, block)
        return block

    def put(self, key: str, block: KvBlock) -> list[str]:
        """Hold ``block`` under ``key`` (replacing any previous one); returns keys evicted to stay bounded."""
        if not key:
            raise ValueError("transfer key must not be empty")
        self._entries.pop(key, None)
        self._entries[key] = block
        evicted: list[str] = []
        while len(self._entries) > self.max_entries:
            old_key, _ = self._entries.popitem(last=False)
            evicted.append(old_key)
        return evicted

    def peek(self, key: str, now: float) -> KvBlock | None:
        """The live block under ``key`` without removing it; None when absent or past the abort timeout."""
        block = self._entries.get(key)
        if block is None or self._expired(block, now):
            return None
        return block

    def pull(self, key: str, now: float) -> KvBlock | None:
        """Remove and return the block under ``key``; None when absent or expired (then dropped)."""
        block = self._entries.pop(key, None)
        if block is None or self._expired(block, now):
            return None
        return block

    def expire(self, now: float) -> list[str]:
        """Drop every block older than the abort timeout; returns the dropped keys."""
        dropped = [k for k, b in self._entries.items() if self._expired(b, now)]
        for k in dropped:
            del self._entries[k]
        return dropped

    def next_expiry(self) -> float | None:
        """When the oldest held block expires (for the shell's timer), or None when empty."""
        if not self._entries:
            return None
        return min(b.created_at for b in self._entries.values()) + self.abort_timeout_s

    def clear(self) -> None:
        """Forget everything (engine restart)."""
        self._entries.clear()

    def _expired(self, block: KvBlock, now: float) -> bool:
        return now - block.created_at >= self.abort_timeout_s
