"""Tests of the trillium._core.RadixTree binding (the prefix cache), and a stateful property test
against a Python reference model. The C++ logic has its own ctest units (tests/cpp)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trillium._core import BlockAllocator, InvariantError, RadixTree

ROOT = Path(__file__).resolve().parents[2]


def test_insert_match_lock_evict_round_trip():
    a = BlockAllocator(8)
    t = RadixTree(a, 2)
    assert (t.block_size, t.num_cached_blocks, t.num_nodes, t.num_namespaces) == (2, 0, 0, 0)
    blocks = a.allocate(3)
    r = t.insert(1, [1, 2, 3, 4, 5, 6, 7], blocks)  # token 7 is a partial block: not cached
    assert (r.num_new_blocks, r.duplicate_block_ids) == (3, [])
    assert [a.ref_count(b) for b in blocks] == [2, 2, 2]  # the request's and the tree's
    a.free(blocks)  # the request finishes; the tree keeps the blocks
    assert t.num_cached_blocks == 3 and t.num_evictable_blocks == 3

    m = t.match(1, [1, 2, 3, 4, 9, 9], lock=True)
    assert (m.num_tokens, m.block_ids) == (4, blocks[:2]) and m.handle != 0
    assert t.num_evictable_blocks == 1  # the locked prefix is protected
    assert t.evict(10) == 1 and a.ref_count(blocks[2]) == 0
    t.unlock(m.handle)
    with pytest.raises(ValueError, match="not locked"):
        t.unlock(m.handle)
    assert t.evict(10) == 2 and a.num_free_blocks == 8
    with pytest.raises(ValueError, match="stale"):
        t.lock(m.handle)  # its node was evicted
    assert (t.num_queries, t.num_query_tokens, t.num_hit_tokens) == (1, 6, 4)
    assert (t.num_inserted_blocks, t.num_evicted_blocks) == (3, 3)
    t.check_invariants()


def test_zero_block_match_returns_null_handle():
    t = RadixTree(BlockAllocator(4), 4)
    m = t.match(5, [1, 2, 3])
    assert (m.num_tokens, m.block_ids, m.handle) == (0, [], 0)
    t.lock(0)  # the null (root) handle: lock/unlock are no-ops
    t.unlock(0)
    t.unlock(0)
    assert "num_tokens=0" in repr(m)


def test_duplicates_split_and_handle_survives_split():
    a = BlockAllocator(16)
    t = RadixTree(a, 2)
    first = a.allocate(3)
    t.insert(0, [1, 1, 2, 2, 3, 3], first)
    a.free(first)
    held = t.match(0, [1, 1, 2, 2, 3, 3], lock=True)
    # Another request computed the first block itself and diverges inside the locked node.
    second = a.allocate(2)
    r = t.insert(0, [1, 1, 9, 9], second)
    assert (r.num_new_blocks, r.duplicate_block_ids) == (1, [second[0]])
    assert a.ref_count(second[0]) == 1  # not adopted: the caller decides what to do with it
    a.free(second)
    assert t.num_nodes == 4  # root, [1 1] split off, [2 2 3 3], [9 9]
    assert t.evict(10) == 1  # the split-off upper part inherited the lock
    t.unlock(held.handle)  # the old handle still names the lower part
    assert t.evict(10) == 3 and a.num_free_blocks == 16
    # Reusing the tree's own blocks (match, then insert the longer sequence) is no duplicate.
    b = a.allocate(1)
    t.insert(0, [4, 4], b)
    m = t.match(0, [4, 4, 5, 5])
    a.incref(m.block_ids)
    r = t.insert(0, [4, 4, 5, 5], m.block_ids + a.allocate(1))
    assert (r.num_new_blocks, r.duplicate_block_ids) == (1, [])
    t.check_invariants()


def test_namespaces_are_separate_and_taken_mod_2_64():
    a = BlockAllocator(8)
    t = RadixTree(a, 2)
    x, y = a.allocate(1), a.allocate(1)
    t.insert(-1, [1, 2], x)
    t.insert(2, [1, 2], y)
    assert t.match(2**64 - 1, [1, 2]).block_ids == x  # -1 and 2**64 - 1 are one namespace
    assert t.match(2, [1, 2]).block_ids == y
    assert t.match(3, [1, 2]).num_tokens == 0
    assert t.num_namespaces == 2


def test_bad_input_raises_value_error_and_changes_nothing():
    a = BlockAllocator(8)
    t = RadixTree(a, 2)
    b = a.allocate(2)
    t.insert(1, [1, 2], b[:1])
    with pytest.raises(ValueError, match="only 1 block ids"):
        t.insert(1, [1, 2, 3, 4], b[:1])
    with pytest.raises(ValueError, match="outside"):
        t.insert(1, [1, 2, 3, 4], [b[0], 8])
    with pytest.raises(ValueError, match="free"):
        t.insert(1, [1, 2, 3, 4], [b[0], 5])
    with pytest.raises(ValueError, match="already cached"):
        t.insert(1, [7, 7], [b[0]])
    with pytest.raises(ValueError, match="twice"):
        t.insert(1, [1, 2, 3, 4, 5, 6], [b[0], b[1], b[1]])
    with pytest.raises(ValueError):
        t.evict(-1)
    with pytest.raises(ValueError):
        RadixTree(a, 0)
    with pytest.raises(ValueError, match="1099511627776 at index 1 does not fit int32"):
        t.match(1, [1, 2**40])
    with pytest.raises(TypeError):
        t.match(1, 5)  # not a sequence
    with pytest.raises(TypeError):
        t.insert(1, [1, 2], ["x"])
    assert t.num_cached_blocks == 1 and [a.ref_count(i) for i in b] == [2, 1]
    t.check_invariants()


def test_check_invariants_sees_a_block_freed_behind_the_trees_back():
    a = BlockAllocator(4)
    t = RadixTree(a, 2)
    b = a.allocate(1)
    t.insert(1, [1, 2], b)
    a.free(b)
    a.free(b)  # drops the tree's reference too: a caller bug
    with pytest.raises(InvariantError, match="free"):
        t.check_invariants()


def test_clear_keeps_locked_content_and_dropping_the_tree_releases_blocks():
    a = BlockAllocator(8)
    t = RadixTree(a, 2)
    b = a.allocate(4)
    t.insert(1, [1, 1, 2, 2], b[:2])
    t.insert(2, [1, 1, 2, 2], b[2:])
    a.free(b)
    m = t.match(1, [1, 1], lock=True)
    assert t.clear() == 3 and t.num_cached_blocks == 1 and m.block_ids == [b[0]]
    t.check_invariants()
    del t
    gc.collect()
    assert a.num_free_blocks == 8
    a.check_invariants()


def test_tree_keeps_its_allocator_alive():
    t = RadixTree(BlockAllocator(4), 2)
    gc.collect()
    assert t.evict(1) == 0
    t.check_invariants()


def test_threads_share_the_allocator_mutex():
    a = BlockAllocator(64)
    t = RadixTree(a, 4)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            for i in range(200):
                tokens = [seed, i % 7] * 32  # 64 tokens, 16 blocks
                m = t.match(0, tokens, lock=True)
                need = 16 - len(m.block_ids)
                if not a.can_allocate(need):
                    t.evict(need)
                try:
                    own = a.allocate(need)
                except MemoryError:
                    t.unlock(m.handle)
                    continue
                a.incref(m.block_ids)
                t.insert(0, tokens, m.block_ids + own)
                t.unlock(m.handle)
                a.free(m.block_ids + own)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    t.check_invariants()
    assert a.num_used_blocks == t.num_cached_blocks


def test_benchmark_quick_mode_runs():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "prefix_cache_ops.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["radix"]["requests_per_s"] > 0 and result["python_dict"]["requests_per_s"] > 0
    assert result["radix"]["hit_tokens"] == result["python_dict"]["hit_tokens"]


# ---- stateful property test --------------------------------------------------------------------

NUM_BLOCKS = 24
NAMESPACES = st.sampled_from([0, 7])
TOKENS = st.lists(st.integers(0, 1), max_size=14)  # two symbols: prefixes collide a lot


class RadixTreeMachine(RuleBasedStateMachine):
    """Random match/insert/lock/unlock/evict/clear against a model that maps every cached
    (namespace, block-aligned token prefix) to its block and its last access tick."""

    def __init__(self) -> None:
        super().__init__()
        self.tree: RadixTree | None = None

    @initialize(block_size=st.integers(2, 4))
    def setup(self, block_size: int) -> None:
        self.bs = block_size
        self.alloc = BlockAllocator(NUM_BLOCKS)
        self.tree = RadixTree(self.alloc, block_size)
        self.tree.record_events = True
        self.seen: dict[int, tuple[int, tuple[int, ...]]] = {}  # a subscriber's view: block -> (ns, prefix)
        self.cache: dict[tuple[int, tuple[int, ...]], int] = {}
        self.stamp: dict[tuple[int, tuple[int, ...]], int] = {}
        self.tick = 0
        self.locks: list[tuple[int, int, tuple[int, ...]]] = []  # (handle, namespace, locked prefix)
        self.requests: list[list[int]] = []  # block references held by "running requests"

    # -- model helpers ---------------------------------------------------------------------------

    def _key(self, ns: int, tokens: list[int], num_blocks: int) -> tuple[int, tuple[int, ...]]:
        return ns, tuple(tokens[: num_blocks * self.bs])

    def _cached_blocks(self, ns: int, tokens: list[int]) -> int:
        n = 0
        while n < len(tokens) // self.bs and self._key(ns, tokens, n + 1) in self.cache:
            n += 1
        return n

    def _touch(self, ns: int, tokens: list[int], num_blocks: int) -> None:
        if num_blocks:
            self.tick += 1
            for k in range(1, num_blocks + 1):
                self.stamp[self._key(ns, tokens, k)] = self.tick

    def _locked(self, key) -> bool:
        ns, prefix = key
        return any(lns == ns and lp[: len(prefix)] == prefix and len(lp) >= len(prefix) for _, lns, lp in self.locks)

    def _children(self) -> dict:
        kids: dict = {key: [] for key in self.cache}
        for ns, prefix in self.cache:
            if len(prefix) > self.bs:
                kids[(ns, prefix[: -self.bs])].append((ns, prefix))
        return kids

    def _evictable(self) -> set:
        """Keys evict(infinity) would free: unlocked, only the tree references the block, and
        every extension is evictable too (leaves first)."""
        kids = self._children()
        out: set = set()
        for key in sorted(self.cache, key=lambda k: -len(k[1])):
            if (
                not self._locked(key)
                and self.alloc.ref_count(self.cache[key]) == 1
                and all(c in out for c in kids[key])
            ):
                out.add(key)
        return out

    def _evict(self, n: int) -> int:
        before = self._evictable()
        freed = self.tree.evict(n)
        assert freed == min(n, len(before))
        removed = {k for k, b in self.cache.items() if self.alloc.ref_count(b) == 0}
        assert len(removed) == freed and removed <= before
        for k in removed:
            del self.cache[k]
        kids = self._children()
        frontier = [k for k in self._evictable() if not kids[k]]
        if removed and frontier:  # LRU: nothing left at the frontier is older than what went
            assert max(self.stamp[k] for k in removed) <= min(self.stamp[k] for k in frontier)
        for k in removed:
            del self.stamp[k]
        return freed

    # -- rules -----------------------------------------------------------------------------------

    @rule(ns=NAMESPACES, tokens=TOKENS, lock=st.booleans())
    def match(self, ns: int, tokens: list[int], lock: bool) -> None:
        expect = self._cached_blocks(ns, tokens)
        m = self.tree.match(ns, tokens, lock=lock)
        assert m.num_tokens == expect * self.bs
        assert m.block_ids == [self.cache[self._key(ns, tokens, k)] for k in range(1, expect + 1)]
        assert (m.handle == 0) == (expect == 0)
        self._touch(ns, tokens, expect)
        if lock and m.handle:
            self.locks.append((m.handle, ns, tuple(tokens[: expect * self.bs])))

    @rule(ns=NAMESPACES, tokens=TOKENS, reuse=st.booleans(), keep=st.booleans())
    def insert(self, ns: int, tokens: list[int], reuse: bool, keep: bool) -> None:
        """A request computed ``tokens``: it either reused the cached prefix (match + incref, as
        the scheduler does) or computed everything in its own blocks; ``keep``: still running."""
        n = len(tokens) // self.bs
        prefix: list[int] = []
        if reuse:
            prefix = self.tree.match(ns, tokens).block_ids
            self._touch(ns, tokens, len(prefix))
            self.alloc.incref(prefix)
        need = n - len(prefix)
        if not self.alloc.can_allocate(need):
            self._evict(need - self.alloc.num_free_blocks)
        if not self.alloc.can_allocate(need):
            self.alloc.free(prefix)
            return
        blocks = prefix + self.alloc.allocate(need)
        cached = self._cached_blocks(ns, tokens)
        assert cached >= len(prefix)
        r = self.tree.insert(ns, tokens, blocks)
        assert r.num_new_blocks == n - cached
        tree_blocks = [self.cache[self._key(ns, tokens, k + 1)] for k in range(cached)]
        assert r.duplicate_block_ids == [b for b, tb in zip(blocks, tree_blocks) if b != tb]
        for k in range(cached, n):
            self.cache[self._key(ns, tokens, k + 1)] = blocks[k]
        self._touch(ns, tokens, n)
        if keep:
            self.requests.append(blocks)
        else:
            self.alloc.free(blocks)

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data) -> None:
        handle, _, _ = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.tree.unlock(handle)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def finish_request(self, data) -> None:
        self.alloc.free(self.requests.pop(data.draw(st.integers(0, len(self.requests) - 1))))

    @rule(n=st.integers(0, 8))
    def evict(self, n: int) -> None:
        self._evict(n)

    @rule()
    def clear(self) -> None:
        unlocked = [k for k in self.cache if not self._locked(k)]
        assert self.tree.clear() == len(unlocked)
        for k in unlocked:
            del self.cache[k]
            del self.stamp[k]

    # -- checked after every step ----------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        if self.tree is None:
            return
        self.tree.check_invariants()
        self.alloc.check_invariants()
        assert self.tree.num_cached_blocks == len(self.cache)
        assert self.tree.num_evictable_blocks == len(self._evictable())
        for ns, prefix in self.cache:  # prefix-closed: blocks only ever leave from the tails
            assert len(prefix) == self.bs or (ns, prefix[: -self.bs]) in self.cache
        refs = [0] * NUM_BLOCKS
        for b in self.cache.values():
            refs[b] += 1
        for blocks in self.requests:
            for b in blocks:
                refs[b] += 1
        assert [self.alloc.ref_count(b) for b in range(NUM_BLOCKS)] == refs
        self._replay_events()

    def _replay_events(self) -> None:
        """What a subscriber rebuilds from the event journal alone (as a cache-aware router does
        from the published KV events) is exactly the cache: every block with its full prefix."""
        for event in self.tree.take_events():
            if event.kind == "stored":
                assert len(event.tokens) == len(event.block_ids) * self.bs
                prefix: tuple[int, ...] = ()
                if event.parent_block_id != -1:
                    parent_ns, prefix = self.seen[event.parent_block_id]
                    assert parent_ns == event.namespace
                for i, block in enumerate(event.block_ids):
                    assert block not in self.seen
                    prefix += tuple(event.tokens[i * self.bs : (i + 1) * self.bs])
                    self.seen[block] = (event.namespace, prefix)
            else:
                assert event.kind == "removed" and not event.tokens
                for block in event.block_ids:
                    del self.seen[block]
        assert {key: block for block, key in self.seen.items()} == self.cache
        # A subscriber that joins now is sent the whole cache: it rebuilds the same view.
        self.tree.journal_cached()
        late: dict[int, tuple[int, tuple[int, ...]]] = {}
        for event in self.tree.take_events():
            prefix = late[event.parent_block_id][1] if event.parent_block_id != -1 else ()
            for i, block in enumerate(event.block_ids):
                prefix += tuple(event.tokens[i * self.bs : (i + 1) * self.bs])
                late[block] = (event.namespace, prefix)
        assert late == self.seen


TestRadixTreeMachine = RadixTreeMachine.TestCase
TestRadixTreeMachine.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
