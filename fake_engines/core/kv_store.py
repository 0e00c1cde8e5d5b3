"""The prefill's KV store: blocks held for a remote decode until pulled or until the abort timeout."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, replace

from fake_engines.core.bugs import KV_FREED_WHILE_READ

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

    Entries leave when pulled or oldest-first when full; one older than ``abort_timeout_s`` is never served.
    A pull that comes after the abort timeout finds nothing (the decode fails the load cleanly): blocks are
    never handed to another request while a decode may still read them (block ids are never reused).
    """

    def __init__(
        self,
        abort_timeout_s: float = 480.0,
        max_entries: int = 4096,
        block_size: int = BLOCK_SIZE,
        bugs: Iterable[str] = (),
    ):
        if abort_timeout_s <= 0:
            raise ValueError(f"abort_timeout_s must be > 0, got {abort_timeout_s}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.abort_timeout_s = abort_timeout_s
        self.max_entries = max_entries
        self.block_size = block_size
        self._entries: OrderedDict[str, KvBlock] = OrderedDict()
        self._next_block = 0
        self.bugs = frozenset(bugs)
        # Only under the kv_freed_while_read switch: block ids freed at the abort timeout, waiting for reuse;
        # the keys already freed; the prompt whose KV a reused block holds now.
        self._free_ids: deque[int] = deque()
        self._freed_keys: set[str] = set()
        self._written: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def allocate(self, key: str, prompt_digest: str, n_tokens: int, now: float) -> KvBlock:
        """Make a KvBlock with fresh block ids for ``n_tokens`` and ``put`` it under ``key``."""
        count = n_blocks(n_tokens, self.block_size)
        reused: list[int] = []
        if KV_FREED_WHILE_READ in self.bugs:
            # BUG: timed-out KV is freed and its blocks go to the next request, although the decode it was
            # held for may still come and read them (they are not pinned for the reader).
            reused = self._reuse_freed(count, now)
            for i in reused:
                self._written[i] = prompt_digest
        fresh = count - len(reused)
        ids = (*reused, *range(self._next_block, self._next_block + fresh))
        self._next_block += fresh
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

    def pull(self, key: str, now: float) -> KvBlock | None:
        """Remove and return the block under ``key``; None when absent or expired (then dropped)."""
        block = self._entries.pop(key, None)
        if block is None:
            return None
        if self._expired(block, now):
            if KV_FREED_WHILE_READ in self.bugs:
                # BUG: the late reader is not refused: it reads whatever request's KV its blocks hold now.
                now_there = self._written.get(block.block_ids[0], block.prompt_digest)
                return replace(block, prompt_digest=now_there)
            return None
        return block

    def live(self, now: float) -> int:
        """How many blocks are held and not yet past the abort timeout (KV a decode may still pull)."""
        return sum(1 for b in self._entries.values() if not self._expired(b, now))

    def next_live_expiry(self, now: float) -> float | None:
        """When the next held, not yet expired block expires (a clock bound for a shell's wait), or None."""
        live = [b.created_at for b in self._entries.values() if not self._expired(b, now)]
        return min(live) + self.abort_timeout_s if live else None

    def clear(self) -> None:
        """Forget everything (engine restart)."""
        self._entries.clear()
        self._free_ids.clear()
        self._freed_keys.clear()
        self._written.clear()

    def _reuse_freed(self, count: int, now: float) -> list[int]:
        """(kv_freed_while_read only) Free the blocks of every entry past the abort timeout, keeping the entry
        itself as the decode's stale handle, and take up to ``count`` freed ids, the most recently freed first
        (as an allocator that hands out warm memory first does)."""
        for key, b in self._entries.items():
            if key not in self._freed_keys and self._expired(b, now):
                self._freed_keys.add(key)
                self._free_ids.extend(b.block_ids)
        self._freed_keys &= set(self._entries)
        return [self._free_ids.pop() for _ in range(min(count, len(self._free_ids)))]

    def _expired(self, block: KvBlock, now: float) -> bool:
        # The same sum next_live_expiry() gives a shell as its wake-up time, so at that time the block is
        # expired: `now - created >= timeout` can round the other way and wake the shell at `now` forever.
        return now >= block.created_at + self.abort_timeout_s
