"""KV block bookkeeping for the scheduler: allocation, prefix-cache reuse and eviction.

Wraps ``_core.BlockAllocator`` and (optionally) ``_core.RadixTree``. Reference ownership:

- a request holds one reference on every block in its table, matched or freshly allocated;
- the prefix cache holds one reference on every block it caches, so a cached block outlives
  the request that computed it, and ``evict`` returns it to the free list when nobody else
  holds it;
- a request locks the tree node it matched, so its cached prefix is not evicted under it.

Only tokens whose K/V are computed (``num_computed_tokens``) are ever inserted: no
speculative drafts, and never after a failed step.

Namespaces: a request looks up and inserts in its own namespace (model, tenant scope, salt:
:func:`cache_namespace`), so tenants never share a block; with one exception, declared public
prefixes (``[prefix_cache] public_prefixes`` under ``--config``). A request whose first
``Request.public_len`` tokens (whole blocks) are a public text's keeps them in the model's
public namespace, shared by every tenant, and the rest of its sequence in a namespace derived
from its own and from those public tokens (:func:`derived_namespace`): the same tokens after a
different public prefix are a different K/V. A block lives under one node of one namespace, as
the tree requires, and eviction stays one LRU over every namespace::

    public ns (model):          [P0 P1 P2]                  tokens [0, A): every tenant
    derived(ns(acme), P..):     [a3 a4]                     tokens [A, ...): acme's alone
    derived(ns(globex), P..):   [g3]
"""

from __future__ import annotations

import array
import hashlib
from typing import TYPE_CHECKING

from trillium import _core
from trillium.scheduler.request import Request

if TYPE_CHECKING:
    from trillium._core import BlockAllocator, RadixTree


def cache_namespace(model: str, cache_salt: str | None, scope: str | None = None) -> int:
    """A 64-bit prefix-cache namespace: different models, tenant scopes (``AddRequest.
    cache_scope``) or salts never share blocks. ``scope=None`` (an open server) keeps the
    namespace every request had before tenants had scopes."""
    key = f"{model}\0{cache_salt or ''}" if scope is None else f"{model}\0{cache_salt or ''}\0{scope}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # fits a signed int64 too


def public_namespace(model: str) -> int:
    """The namespace of ``model``'s public prefixes (tenant scopes are ``tenant:``/``group:``)."""
    return cache_namespace(model, None, "public")


def derived_namespace(namespace: int, public_tokens: list[int]) -> int:
    """Where a request of ``namespace`` keeps what follows the public tokens it starts with."""
    digest = hashlib.blake2b(namespace.to_bytes(8, "little"), digest_size=8)
    digest.update(array.array("i", public_tokens).tobytes())
    return int.from_bytes(digest.digest(), "little") >> 1


class KVBlockManager:
    """The only writer of block references. Runs on the scheduler's thread."""

    def __init__(self, allocator: BlockAllocator, block_size: int, prefix_cache: RadixTree | None = None) -> None:
        self.allocator = allocator
        self.block_size = block_size
        self.tree = prefix_cache  # a _core.RadixTree over ``allocator``, or None (disabled)
        # derived namespace -> the public block its sequence continues (the last one the request
        # that inserted it had): where a router chains a derived namespace's first block.
        self.chain_parents: dict[int, int] = {}

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

    def set_public_prefix(self, request: Request, public_namespace: int, num_public_tokens: int) -> None:
        """Mark ``request``'s first ``num_public_tokens`` prompt tokens (a declared public text's, as
        the frontend counted them) public: their whole blocks, short of the last prompt token, go
        in ``public_namespace`` (the module docstring). Before the request's first admission."""
        public_len = min(num_public_tokens, request.num_prompt_tokens - 1) // self.block_size * self.block_size
        if self.tree is None or public_len == 0:
            return
        request.public_len = public_len
        request.public_namespace = public_namespace
        request.rest_namespace = derived_namespace(request.cache_namespace, request.prompt_token_ids[:public_len])

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
        public_len = request.public_len
        if public_len == 0:
            match = self.tree.match(request.cache_namespace, tokens, lock=True)
            block_ids, num_tokens = match.block_ids, match.num_tokens  # a fresh list per access
        else:
            match = self.tree.match(request.public_namespace, tokens[:public_len], lock=True)
            block_ids, num_tokens = match.block_ids, match.num_tokens
            if num_tokens == public_len:  # the whole public part: then the request's own rest
                rest = self.tree.match(request.rest_namespace, tokens[public_len:], lock=True)
                request.rest_handle = rest.handle
                block_ids += rest.block_ids
                num_tokens += rest.num_tokens
        request.cache_handle = match.handle
        if num_tokens == 0:
            return
        self.allocator.incref(block_ids)
        request.block_ids = block_ids
        request.num_computed_tokens = num_tokens
        request.num_inserted_blocks = len(block_ids)
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_tokens

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
        num_public = request.public_len // self.block_size
        if num_public == 0:
            self.tree.insert(request.cache_namespace, tokens, request.block_ids[:num_full])
        else:
            if request.num_inserted_blocks < num_public:
                head = min(num_full, num_public)
                self.tree.insert(request.public_namespace, tokens[: head * self.block_size], request.block_ids[:head])
            if num_full > num_public:
                rest = tokens[request.public_len :]
                self.tree.insert(request.rest_namespace, rest, request.block_ids[num_public:num_full])
                self.chain_parents[request.rest_namespace] = request.block_ids[num_public - 1]
        request.num_inserted_blocks = num_full

    def trim(self, request: Request) -> None:
        """Free the blocks past what ``request.num_tokens`` needs (rejected draft positions).
        Those blocks hold no computed token, so the prefix cache never has them."""
        keep = self.blocks_for(request.num_tokens)
        if len(request.block_ids) > keep:
            self.allocator.free(request.block_ids[keep:])
            del request.block_ids[keep:]

    def truncate(self, request: Request, num_tokens: int | None = None) -> None:
        """The request's tokens were cut back (output rolled back) to ``num_tokens`` (default: as
        many as it has now; it may have grown again since): K/V counts as computed only below
        ``num_tokens - 1``, and blocks past what ``request.num_tokens`` needs are freed. A block the
        prefix cache shares is never written again: if the next K/V would go into one, the
        request gives back its references from there and computes those positions again in
        fresh blocks (the cached ones still hold the K/V of the tokens they were cached for). A
        no-op when nothing past the computed tokens was cut."""
        cut = request.num_tokens if num_tokens is None else min(num_tokens, request.num_tokens)
        request.num_computed_tokens = min(request.num_computed_tokens, cut - 1)
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
        if request.cache_handle is not None or request.rest_handle is not None:
            assert self.tree is not None  # handles come only from the tree
            for handle in (request.cache_handle, request.rest_handle):
                if handle is not None:
                    self.tree.unlock(handle)
            request.cache_handle = request.rest_handle = None
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
