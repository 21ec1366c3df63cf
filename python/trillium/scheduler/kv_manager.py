"""KV block bookkeeping for the scheduler: allocation, prefix-cache reuse and eviction.

Wraps ``_core.BlockAllocator`` and (optionally) ``_core.RadixTree``. Reference ownership:

- a request holds one reference on every block in its table, matched or freshly allocated;
- the prefix cache holds one reference on every block it caches, so a cached block outlives
  the request that computed it, and ``evict`` returns it to the free list when nobody else
  holds it;
- a request locks the tree node it matched, so its cached prefix is not evicted under it.

Only tokens whose K/V are computed (``num_computed_tokens``) are ever inserted: no
speculative drafts, and never after a failed step.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from trillium import _core
from trillium.scheduler.request import Request

if TYPE_CHECKING:
    from trillium._core import BlockAllocator, RadixTree


def cache_namespace(model: str, cache_salt: str | None) -> int:
    """A 64-bit prefix-cache namespace: different models or salts never share blocks."""
    digest = hashlib.blake2b(f"{model}\0{cache_salt or ''}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # fits a signed int64 too


class KVBlockManager:
    """The only writer of block references. Runs on the scheduler's thread."""

    def __init__(self, allocator: BlockAllocator, block_size: int, prefix_cache: RadixTree | None = None) -> None:
        self.allocator = allocator
        self.block_size = block_size
        self.tree = prefix_cache  # a _core.RadixTree over ``allocator``, or None (disabled)

    # ---- accounting ----------------------------------------------------------------------------

    @property
    def num_total_blocks(self) -> int:
        return self.allocator.num_total_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return self.tree.num_cached_blocks if self.tree is not None else 0

    @property
    def num_reclaimable_blocks(self) -> int:
        """Free blocks plus cached blocks that eviction would free."""
        evictable = self.tree.num_evictable_blocks if self.tree is not None else 0
        return self.allocator.num_free_blocks + evictable

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- per request ---------------------------------------------------------------------------

    def match_prefix(self, request: Request) -> None:
        """Reuse the longest cached prefix for a request that holds no blocks yet.

        The hit is capped at ``num_tokens - 1`` so that the last token is always computed and
        its logits sampled. Sets ``block_ids``, ``num_computed_tokens`` and, on first admission,
        ``num_cached_tokens``. A request still owed prompt logprobs reuses nothing: it must
        compute every prompt position's logits (its blocks are still cached as it computes them).
        """
        if self.tree is None or request.block_ids or request.pending_prompt_logprobs is not None:
            return
        tokens = request.token_ids_slice(0, request.num_tokens - 1)
        match = self.tree.match(request.cache_namespace, tokens, lock=True)
        if match.num_tokens == 0:
            return
        block_ids = match.block_ids  # a fresh list per access
        self.allocator.incref(block_ids)
        request.cache_handle = match.handle
        request.block_ids = block_ids
        request.num_computed_tokens = match.num_tokens
        request.num_inserted_blocks = len(block_ids)
        if request.num_cached_tokens is None:
            request.num_cached_tokens = match.num_tokens

    def grow(self, request: Request, num_new_tokens: int) -> bool:
        """Give ``request`` blocks for ``num_new_tokens`` more tokens, evicting cached blocks if
        the free list is short. All-or-nothing: False (and no change) when it cannot."""
        needed = self.blocks_for(request.num_computed_tokens + num_new_tokens) - len(request.block_ids)
        if needed <= 0:
            return True
        short = needed - self.allocator.num_free_blocks
        if short > 0 and self.tree is not None:
            self.tree.evict(short)
        if not self.allocator.can_allocate(needed):
            return False
        request.block_ids.extend(self.allocator.allocate(needed))
        return True

    def commit(self, request: Request) -> None:
        """Insert the request's newly completed full blocks of computed tokens into the cache."""
        if self.tree is None:
            return
        num_full = request.num_computed_tokens // self.block_size
        if num_full <= request.num_inserted_blocks:
            return
        tokens = request.token_ids_slice(0, num_full * self.block_size)
        self.tree.insert(request.cache_namespace, tokens, request.block_ids[:num_full])
        request.num_inserted_blocks = num_full

    def trim(self, request: Request) -> None:
        """Free the blocks past what ``request.num_tokens`` needs (rejected draft positions).
        Those blocks hold no computed token, so the prefix cache never has them."""
        keep = self.blocks_for(request.num_tokens)
        if len(request.block_ids) > keep:
            self.allocator.free(request.block_ids[keep:])
            del request.block_ids[keep:]

    def truncate(self, request: Request) -> None:
        """The request's tokens were cut back (output rolled back): K/V counts as computed only
        below ``num_tokens - 1``, and blocks past what ``num_tokens`` needs are freed. A block the
        prefix cache shares is never written again: if the next K/V would go into one, the
        request gives back its references from there and computes those positions again in
        fresh blocks (the cached ones still hold the K/V of the tokens they were cached for)."""
        request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens - 1)
        first = request.num_computed_tokens // self.block_size  # the block the next K/V goes into
        if first < request.num_inserted_blocks:
            self.allocator.free(request.block_ids[first:])
            del request.block_ids[first:]
            request.num_computed_tokens = first * self.block_size
            request.num_inserted_blocks = first
        self.trim(request)

    def release(self, request: Request, *, cache: bool = True) -> None:
        """Drop the request's references (after caching its computed blocks unless ``cache`` is
        False, e.g. after a failed step whose K/V cannot be trusted). Resets its progress."""
        if cache:
            self.commit(request)
        if request.cache_handle is not None:
            assert self.tree is not None  # handles come only from the tree
            self.tree.unlock(request.cache_handle)
            request.cache_handle = None
        if request.block_ids:
            self.allocator.free(request.block_ids)
        request.block_ids = []
        request.num_computed_tokens = 0
        request.num_inserted_blocks = 0

    def flush(self) -> int:
        """Drop every cached prefix that no request holds; returns the blocks freed (0 without a
        prefix cache)."""
        return self.tree.clear() if self.tree is not None else 0

    def rebuilt(self) -> KVBlockManager:
        """A manager over a fresh allocator (and prefix cache, if this one has one) of the same
        size: every reference and cached prefix dropped. For recovery after a failed step; the
        old allocator and tree are left to the requests' bookkeeping that still points at them."""
        allocator = _core.BlockAllocator(self.num_total_blocks)
        tree = None
        if self.tree is not None:
            tree = _core.RadixTree(allocator, self.block_size)
            tree.record_events = self.tree.record_events
        return KVBlockManager(allocator, self.block_size, tree)

    def check_invariants(self) -> None:
        self.allocator.check_invariants()
        if self.tree is not None:
            self.tree.check_invariants()
