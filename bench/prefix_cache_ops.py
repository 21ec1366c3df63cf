"""Prefix-cache operations per second: the C++ radix tree (trillium._core.RadixTree) against a
plain-Python block trie (dict of children per block, the same LRU/lock/eviction policy), in
the same run, on the same request stream and the same kind of allocator.

    python bench/prefix_cache_ops.py            # 100 system prompts x continuations, 2k tokens
    python bench/prefix_cache_ops.py --quick    # smoke mode, a second or two

Workload: ``--num-prompts`` system prompts of ``--prompt-len`` tokens; each request is one of
them (Zipf-ish popularity) plus a continuation of ``--continuation-len`` tokens, fresh or (30%)
a repeat of an earlier one. Every request does what the scheduler will do:

    match(seq[:-1], lock) -> incref hits -> evict if short -> allocate the rest
    -> insert(seq, blocks) -> unlock -> free the request's references

under a block pool smaller than the working set, so eviction runs all the time. A second phase
times match() alone on a warm cache (full 2k-token hits). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import heapq
import json
import time

import numpy as np

from trillium._core import BlockAllocator, RadixTree


class _PyNode:
    __slots__ = ("children", "parent", "key", "block", "lock", "last", "seq")

    def __init__(self, parent, key, block, seq):
        self.children: dict = {}
        self.parent = parent
        self.key = key
        self.block = block
        self.lock = 0
        self.last = 0
        self.seq = seq


class PyBlockTrie:
    """The baseline: one Python node per block, children keyed by the block's token tuple."""

    def __init__(self, allocator: BlockAllocator, block_size: int) -> None:
        self.alloc = allocator
        self.bs = block_size
        self.roots: dict[int, _PyNode] = {}
        self.nodes: set[_PyNode] = set()
        self.clock = 0
        self.seq = 0

    def match(self, ns, tokens, lock=False):
        node = self.roots.get(ns)
        blocks: list[int] = []
        if node is None:
            return blocks, None
        self.clock += 1
        bs = self.bs
        for i in range(0, len(tokens) // bs * bs, bs):
            child = node.children.get(tuple(tokens[i : i + bs]))
            if child is None:
                break
            child.last = self.clock
            blocks.append(child.block)
            node = child
        handle = node if blocks else None
        if lock:
            self.lock(handle)
        return blocks, handle

    def lock(self, node, delta=1):
        while node is not None and node.parent is not None:
            node.lock += delta
            node = node.parent

    def unlock(self, node):
        self.lock(node, -1)

    def insert(self, ns, tokens, block_ids):
        node = self.roots.get(ns)
        if node is None:
            node = self.roots[ns] = _PyNode(None, None, -1, 0)
        self.clock += 1
        bs = self.bs
        new: list[int] = []
        for k, i in enumerate(range(0, len(tokens) // bs * bs, bs)):
            key = tuple(tokens[i : i + bs])
            child = node.children.get(key)
            if child is None:
                self.seq += 1
                child = node.children[key] = _PyNode(node, key, block_ids[k], self.seq)
                self.nodes.add(child)
                new.append(block_ids[k])
            child.last = self.clock
            node = child
        self.alloc.incref(new)
        return len(new)

    def evict(self, num_blocks):
        heap = [(n.last, n.seq, n) for n in self.nodes if not n.children and n.lock == 0]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < num_blocks:
            _, _, n = heapq.heappop(heap)
            if self.alloc.ref_count(n.block) != 1:
                continue
            freed.append(n.block)
            self.nodes.discard(n)
            parent = n.parent
            del parent.children[n.key]
            if parent.parent is not None and not parent.children and parent.lock == 0:
                heapq.heappush(heap, (parent.last, parent.seq, parent))
        self.alloc.free(freed)
        return len(freed)


class RadixAdapter:
    def __init__(self, allocator: BlockAllocator, block_size: int) -> None:
        self.tree = RadixTree(allocator, block_size)

    def match(self, ns, tokens, lock=False):
        m = self.tree.match(ns, tokens, lock=lock)
        return m.block_ids, m.handle

    def unlock(self, handle):
        self.tree.unlock(handle)

    def insert(self, ns, tokens, block_ids):
        return self.tree.insert(ns, tokens, block_ids).num_new_blocks

    def evict(self, num_blocks):
        return self.tree.evict(num_blocks)


def make_requests(args) -> list[list[int]]:
    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(0, args.vocab, size=(args.num_prompts, args.prompt_len), dtype=np.int32).tolist()
    weights = 1.0 / np.arange(1, args.num_prompts + 1)
    weights /= weights.sum()
    which = rng.choice(args.num_prompts, size=args.num_requests, p=weights)
    past: dict[int, list[list[int]]] = {}
    requests = []
    for p in which.tolist():
        if past.get(p) and rng.random() < 0.3:
            cont = past[p][int(rng.integers(len(past[p])))]
        else:
            cont = rng.integers(0, args.vocab, size=args.continuation_len, dtype=np.int32).tolist()
            past.setdefault(p, []).append(cont)
        requests.append(prompts[p] + cont)
    return requests


def run_cycles(impl_cls, requests, args) -> dict:
    alloc = BlockAllocator(args.num_blocks)
    cache = impl_cls(alloc, args.block_size)
    bs = args.block_size
    t_match = t_insert = t_evict = 0.0
    hit_tokens = query_tokens = 0
    start = time.perf_counter()
    for seq in requests:
        t0 = time.perf_counter()
        hits, handle = cache.match(0, seq[:-1], lock=True)
        t1 = time.perf_counter()
        alloc.incref(hits)
        need = -(-len(seq) // bs) - len(hits)
        if not alloc.can_allocate(need):
            cache.evict(need - alloc.num_free_blocks)
        t2 = time.perf_counter()
        blocks = hits + alloc.allocate(need)
        t3 = time.perf_counter()
        cache.insert(0, seq, blocks)
        cache.unlock(handle)
        t4 = time.perf_counter()
        alloc.free(blocks)
        t_match += t1 - t0
        t_evict += t2 - t1
        t_insert += t4 - t3
        hit_tokens += len(hits) * bs
        query_tokens += len(seq) - 1
    wall = time.perf_counter() - start
    n = len(requests)
    return {
        "requests_per_s": round(n / wall, 1),
        "ops_per_s": round(2 * n / (t_match + t_insert), 1),  # match + insert calls
        "match_us": round(1e6 * t_match / n, 2),
        "insert_us": round(1e6 * t_insert / n, 2),
        "evict_us_per_request": round(1e6 * t_evict / n, 2),
        "hit_tokens": hit_tokens,
        "hit_rate": round(hit_tokens / max(query_tokens, 1), 4),
    }


def run_match_only(impl_cls, requests, args) -> dict:
    """Warm cache holding one full sequence per prompt, then timed full-length matches."""
    alloc = BlockAllocator(args.num_blocks * 4)
    cache = impl_cls(alloc, args.block_size)
    warm = {}
    for seq in requests:
        warm.setdefault(tuple(seq[: args.prompt_len]), seq)
    seqs = list(warm.values())
    for seq in seqs:
        blocks = alloc.allocate(len(seq) // args.block_size)
        cache.insert(0, seq, blocks)
        alloc.free(blocks)
    reps = max(1, args.num_match_only // len(seqs))
    hit_tokens = 0
    start = time.perf_counter()
    for _ in range(reps):
        for seq in seqs:
            hit_tokens += len(cache.match(0, seq)[0]) * args.block_size
    wall = time.perf_counter() - start
    n = reps * len(seqs)
    return {"match_per_s": round(n / wall, 1), "match_us": round(1e6 * wall / n, 2), "hit_tokens": hit_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-prompts", type=int, default=100)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--continuation-len", type=int, default=1024)
    ap.add_argument("--num-requests", type=int, default=3000)
    ap.add_argument("--num-match-only", type=int, default=3000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=8192, help="pool; smaller than the working set")
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke mode: small sizes")
    args = ap.parse_args()
    if args.quick:
        args.num_prompts, args.prompt_len, args.continuation_len = 10, 256, 256
        args.num_requests, args.num_match_only, args.num_blocks = 200, 200, 256

    requests = make_requests(args)
    result: dict = {"bench": "prefix_cache_ops", "config": dict(vars(args).items())}
    for name, impl in (("radix", RadixAdapter), ("python_dict", PyBlockTrie)):
        result[name] = run_cycles(impl, requests, args)
        result[name]["match_only"] = run_match_only(impl, requests, args)
    radix, py = result["radix"], result["python_dict"]
    if radix["match_only"]["hit_tokens"] != py["match_only"]["hit_tokens"]:
        raise SystemExit("radix and python baseline disagree on a warm cache: " + json.dumps(result))
    result["speedup"] = {
        "requests": round(radix["requests_per_s"] / py["requests_per_s"], 2),
        "ops": round(radix["ops_per_s"] / py["ops_per_s"], 2),
        "match_only": round(radix["match_only"]["match_per_s"] / py["match_only"]["match_per_s"], 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
