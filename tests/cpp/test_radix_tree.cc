// Unit tests for trillium::RadixTree (plain ctest executable, see check.h).
#include "trillium/radix_tree.h"

#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <map>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "check.h"

using trillium::BlockAllocator;
using trillium::InsertResult;
using trillium::MatchResult;
using trillium::NodeHandle;
using trillium::RadixTree;
using trillium::StatusCode;

namespace {

using Ids = std::vector<int32_t>;

Ids alloc(BlockAllocator& a, int32_t n) {
  Ids ids;
  CHECK_OK(a.allocate(n, &ids));
  return ids;
}

InsertResult insert(RadixTree& t, uint64_t ns, const Ids& tokens, const Ids& blocks) {
  InsertResult r;
  CHECK_OK(t.insert(ns, tokens, blocks, &r));
  CHECK_OK(t.check_invariants());
  return r;
}

int32_t evict(RadixTree& t, int32_t n) {
  int32_t freed = -1;
  CHECK_OK(t.evict(n, &freed));
  CHECK_OK(t.check_invariants());
  return freed;
}

void test_empty_tree_and_null_handle() {
  BlockAllocator a(4);
  RadixTree t(&a, 2);
  const MatchResult m = t.match(7, Ids{1, 2, 3, 4});
  CHECK(m.num_tokens == 0 && m.block_ids.empty() && m.handle.is_null());
  CHECK_OK(t.lock(m.handle));  // null handle: no-op
  CHECK_OK(t.unlock(m.handle));
  CHECK_OK(t.unlock(m.handle));
  CHECK(t.num_cached_blocks() == 0 && t.num_nodes() == 0 && t.num_evictable_blocks() == 0);
  CHECK(evict(t, 3) == 0);
  InsertResult r = insert(t, 7, Ids{1}, Ids{});  // no full block: nothing to cache
  CHECK(r.num_new_blocks == 0 && t.num_namespaces() == 0);
  CHECK_OK(t.check_invariants());
  bool threw = false;
  try {
    RadixTree bad(&a, 0);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
}

void test_insert_then_match_shares_blocks() {
  BlockAllocator a(8);
  RadixTree t(&a, 2);
  const Ids blocks = alloc(a, 3);
  const InsertResult r = insert(t, 1, Ids{1, 2, 3, 4, 5, 6, 7}, blocks);  // token 7: partial block
  CHECK(r.num_new_blocks == 3 && r.duplicate_block_ids.empty());
  for (int32_t b : blocks) CHECK(a.ref_count(b) == 2);  // the caller's and the tree's
  CHECK_OK(a.free(blocks));                               // the request finishes
  for (int32_t b : blocks) CHECK(a.ref_count(b) == 1);
  CHECK(t.num_cached_blocks() == 3 && t.num_evictable_blocks() == 3);

  MatchResult m = t.match(1, Ids{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(m.num_tokens == 6 && m.block_ids == blocks && !m.handle.is_null());
  m = t.match(1, Ids{1, 2, 3, 9});
  CHECK(m.num_tokens == 2 && (m.block_ids == Ids{blocks[0]}));
  m = t.match(1, Ids{1, 2, 3});  // the partial block never matches
  CHECK(m.num_tokens == 2);
  m = t.match(1, Ids{2, 1});
  CHECK(m.num_tokens == 0 && m.handle.is_null());
  CHECK(t.stats().num_queries == 4 && t.stats().num_query_tokens == 17 && t.stats().num_hit_tokens == 10);
  CHECK(t.stats().num_inserted_blocks == 3);
  CHECK_OK(t.check_invariants());
}

void test_split_on_insert_reports_duplicates() {
  BlockAllocator a(16);
  RadixTree t(&a, 2);
  const Ids first = alloc(a, 4);
  insert(t, 1, Ids{1, 1, 2, 2, 3, 3, 4, 4}, first);
  CHECK(t.num_nodes() == 2);  // root + one leaf
  // A second request computed the shared prefix itself (its own blocks) and diverges at block 2.
  const Ids second = alloc(a, 3);
  InsertResult r = insert(t, 1, Ids{1, 1, 2, 2, 9, 9}, second);
  CHECK(r.num_new_blocks == 1 && (r.duplicate_block_ids == Ids{second[0], second[1]}));
  CHECK(t.num_nodes() == 4);  // root, upper [b0 b1], lower [b2 b3], new [second[2]]
  CHECK(a.ref_count(second[0]) == 1 && a.ref_count(second[2]) == 2);  // duplicates not adopted
  CHECK((t.match(1, Ids{1, 1, 2, 2, 9, 9}).block_ids == Ids{first[0], first[1], second[2]}));
  CHECK((t.match(1, Ids{1, 1, 2, 2, 3, 3, 4, 4}).block_ids == first));
  // A request that reused the tree's blocks (after a match) reports no duplicates.
  const Ids third_tail = alloc(a, 1);
  r = insert(t, 1, Ids{1, 1, 2, 2, 3, 3, 5, 5}, Ids{first[0], first[1], first[2], third_tail[0]});
  CHECK(r.num_new_blocks == 1 && r.duplicate_block_ids.empty());
  CHECK(t.num_cached_blocks() == 6);
}

void test_match_inside_an_edge_splits_and_locks_only_the_match() {
  BlockAllocator a(8);
  RadixTree t(&a, 2);
  const Ids blocks = alloc(a, 4);
  insert(t, 1, Ids{1, 2, 3, 4, 5, 6, 7, 8}, blocks);
  CHECK_OK(a.free(blocks));
  const MatchResult m = t.match(1, Ids{1, 2, 3, 4, 0, 0});
  CHECK(m.num_tokens == 4 && t.num_nodes() == 3);
  CHECK_OK(t.lock(m.handle));
  CHECK(t.num_evictable_blocks() == 2);
  CHECK(evict(t, 10) == 2);  // only the unmatched tail goes
  CHECK(a.ref_count(blocks[0]) == 1 && a.ref_count(blocks[1]) == 1 && a.is_free(blocks[3]));
  CHECK(t.match(1, Ids{1, 2, 3, 4, 5, 6}).num_tokens == 4);
  CHECK_OK(t.unlock(m.handle));
  CHECK(t.unlock(m.handle).code() == StatusCode::kInvalidArgument);  // not locked any more
  CHECK(evict(t, 10) == 2 && t.num_nodes() == 0 && a.num_free_blocks() == 8);
}

void test_handle_survives_split_and_upper_part_inherits_lock() {
  BlockAllocator a(8);
  RadixTree t(&a, 2);
  const Ids blocks = alloc(a, 3);
  insert(t, 1, Ids{1, 2, 3, 4, 5, 6}, blocks);
  CHECK_OK(a.free(blocks));
  const MatchResult m = t.match(1, Ids{1, 2, 3, 4, 5, 6});
  CHECK(m.num_tokens == 6);
  CHECK_OK(t.lock(m.handle));
  CHECK_OK(t.lock(m.handle));  // two requests share the prefix
  // Another request splits the locked node after its first block.
  const Ids other = alloc(a, 2);
  insert(t, 1, Ids{1, 2, 9, 9}, Ids{blocks[0], other[1]});
  CHECK(t.num_nodes() == 4);
  CHECK_OK(a.free(other));
  CHECK(evict(t, 10) == 1);  // only the new unlocked leaf; the split-off upper part is locked
  CHECK(t.match(1, Ids{1, 2, 3, 4, 5, 6}).num_tokens == 6);
  CHECK_OK(t.unlock(m.handle));  // the old handle still names the lower part
  CHECK(evict(t, 10) == 0);      // still locked once
  CHECK_OK(t.unlock(m.handle));
  CHECK(evict(t, 10) == 3 && a.num_free_blocks() == 8);
  CHECK(t.lock(m.handle).code() == StatusCode::kInvalidArgument);  // evicted: stale
}

void test_namespaces_never_share() {
  BlockAllocator a(8);
  RadixTree t(&a, 2);
  const Ids tokens = {1, 2, 3, 4};
  const Ids x = alloc(a, 2);
  const Ids y = alloc(a, 2);
  insert(t, 1, tokens, x);
  const InsertResult r = insert(t, 0xffffffffffffffffULL, tokens, y);
  CHECK(r.num_new_blocks == 2 && r.duplicate_block_ids.empty());
  CHECK(t.match(1, tokens).block_ids == x);
  CHECK(t.match(0xffffffffffffffffULL, tokens).block_ids == y);
  CHECK(t.match(2, tokens).num_tokens == 0);
  CHECK(t.num_namespaces() == 2 && t.num_cached_blocks() == 4);
  InsertResult bad;
  CHECK(t.insert(2, tokens, x, &bad).code() == StatusCode::kInvalidArgument);  // x is cached in ns 1
  CHECK_OK(a.free(x));
  CHECK_OK(a.free(y));
  CHECK(evict(t, 2) == 2 && t.num_namespaces() == 1);  // an emptied namespace is dropped
}

void test_lru_order_and_tail_first() {
  BlockAllocator a(9);
  RadixTree t(&a, 1);
  const Ids p = alloc(a, 3), q = alloc(a, 3), r = alloc(a, 3);
  insert(t, 1, Ids{1, 1, 1}, p);
  insert(t, 1, Ids{2, 2, 2}, q);
  insert(t, 1, Ids{3, 3, 3}, r);
  CHECK_OK(a.free(p));
  CHECK_OK(a.free(q));
  CHECK_OK(a.free(r));
  CHECK(t.match(1, Ids{1, 1, 1}).num_tokens == 3);  // p is now the most recent; q the oldest
  CHECK(evict(t, 1) == 1);
  CHECK(a.is_free(q[2]) && !a.is_free(q[1]));  // tail first
  CHECK(evict(t, 3) == 3);                     // rest of q, then r's tail
  CHECK(a.is_free(q[0]) && a.is_free(r[2]) && !a.is_free(r[1]) && !a.is_free(p[2]));
  CHECK(t.match(1, Ids{2, 2, 2}).num_tokens == 0 && t.match(1, Ids{3, 3, 3}).num_tokens == 2);
  CHECK(evict(t, 2) == 2 && a.is_free(p[2]) && a.is_free(p[1]));  // r was just touched
  CHECK(t.stats().num_evicted_blocks == 6 && t.num_cached_blocks() == 3);
}

void test_shared_blocks_pin_their_leaf() {
  BlockAllocator a(8);
  RadixTree t(&a, 2);
  const Ids blocks = alloc(a, 3);
  insert(t, 1, Ids{1, 2, 3, 4, 5, 6}, blocks);
  CHECK_OK(a.free({blocks[0], blocks[2]}));  // a request still holds blocks[1] only
  CHECK(t.num_evictable_blocks() == 1);
  CHECK(evict(t, 5) == 1 && a.is_free(blocks[2]) && a.ref_count(blocks[1]) == 2);
  CHECK(evict(t, 5) == 0);
  CHECK_OK(a.free({blocks[1]}));
  CHECK(t.num_evictable_blocks() == 2 && evict(t, 5) == 2);
}

void test_bad_insert_changes_nothing() {
  BlockAllocator a(8);
  RadixTree t(&a, 2);
  const Ids blocks = alloc(a, 3);
  insert(t, 1, Ids{1, 2}, Ids{blocks[0]});
  InsertResult r;
  r.num_new_blocks = 42;
  CHECK(t.insert(1, Ids{1, 2, 3, 4}, Ids{blocks[0]}, &r).code() == StatusCode::kInvalidArgument);  // too few ids
  CHECK(t.insert(1, Ids{1, 2, 3, 4, 5, 6}, Ids{blocks[0], 8, blocks[1]}, &r).code() == StatusCode::kInvalidArgument);
  CHECK(t.insert(1, Ids{1, 2, 3, 4, 5, 6}, Ids{blocks[0], 7, blocks[1]}, &r).code() == StatusCode::kInvalidArgument);
  CHECK(t.insert(1, Ids{1, 2, 3, 4, 5, 6}, Ids{blocks[0], blocks[1], blocks[1]}, &r).code() ==
        StatusCode::kInvalidArgument);
  CHECK(t.insert(1, Ids{5, 6, 7, 8}, Ids{blocks[1], blocks[0]}, &r).code() == StatusCode::kInvalidArgument);
  CHECK(t.insert(1, Ids{1, 2}, Ids{blocks[0]}, nullptr).code() == StatusCode::kInvalidArgument);
  CHECK(r.num_new_blocks == 42);
  CHECK(t.num_cached_blocks() == 1 && a.ref_count(blocks[0]) == 2 && a.ref_count(blocks[1]) == 1);
  CHECK(t.stats().num_inserted_blocks == 1);
  int32_t freed = 0;
  CHECK(t.evict(-1, &freed).code() == StatusCode::kInvalidArgument);
  CHECK_OK(t.check_invariants());
}

void test_clear_keeps_locked_and_destructor_releases() {
  BlockAllocator a(8);
  {
    RadixTree t(&a, 2);
    const Ids x = alloc(a, 2), y = alloc(a, 2);
    insert(t, 1, Ids{1, 2, 3, 4}, x);
    insert(t, 2, Ids{1, 2, 3, 4}, y);
    CHECK_OK(a.free(y));  // x still held by its request
    const MatchResult m = t.match(1, Ids{1, 2});
    CHECK_OK(t.lock(m.handle));
    int32_t dropped = -1;
    CHECK_OK(t.clear(&dropped));
    CHECK(dropped == 3 && t.num_cached_blocks() == 1 && t.num_namespaces() == 1);
    CHECK(a.is_free(y[0]) && a.ref_count(x[1]) == 1 && a.ref_count(x[0]) == 2);
    CHECK_OK(t.check_invariants());
    CHECK_OK(a.free(x));
  }  // the tree still caches (and locks) x[0]; destruction drops its reference
  CHECK(a.num_free_blocks() == 8);
  CHECK_OK(a.check_invariants());
}

// Random operations against a map from (namespace, token prefix) to block id; key mask 0 puts
// every sibling into one hash-collision chain.
void test_random_against_model(uint64_t key_mask) {
  std::random_device rd;
  const uint32_t seed = rd();
  std::mt19937 rng(seed);
  const int32_t bs = 1 + static_cast<int32_t>(rng() % 3);
  BlockAllocator a(40);
  RadixTree t(&a, bs, key_mask);
  std::map<std::pair<uint64_t, Ids>, int32_t> model;
  std::vector<NodeHandle> locks;
  auto sync = [&] {  // blocks the tree dropped (evict frees only sole references) are free again
    for (auto it = model.begin(); it != model.end();) it = a.is_free(it->second) ? model.erase(it) : std::next(it);
  };
  const int before = trillium::test::failures();
  for (int step = 0; step < 1500 && trillium::test::failures() == before; ++step) {
    const uint64_t ns = rng() % 2;
    Ids tokens(rng() % (5 * bs + 1));
    for (auto& tok : tokens) tok = static_cast<int32_t>(rng() % 2);
    const int32_t n_full = static_cast<int32_t>(tokens.size()) / bs;
    auto prefix = [&](int32_t num_blocks) {
      return std::make_pair(ns, Ids(tokens.begin(), tokens.begin() + num_blocks * bs));
    };
    auto cached_prefix = [&] {  // longest cached prefix in the model, in blocks
      int32_t n = 0;
      while (n < n_full && model.count(prefix(n + 1))) ++n;
      return n;
    };
    const uint32_t op = rng() % 4;
    if (op == 0) {
      const int32_t expect = cached_prefix();
      const MatchResult m = t.match(ns, tokens);
      CHECK(m.num_tokens == expect * bs && static_cast<int32_t>(m.block_ids.size()) == expect);
      for (int32_t i = 0; i < expect && i < static_cast<int32_t>(m.block_ids.size()); ++i) {
        CHECK(m.block_ids[i] == model[prefix(i + 1)]);
      }
      if (rng() % 2 && !m.handle.is_null()) {
        CHECK_OK(t.lock(m.handle));
        locks.push_back(m.handle);
      }
    } else if (op == 1) {
      int32_t freed = 0;
      CHECK_OK(t.evict(n_full - cached_prefix(), &freed));  // make room, like a scheduler would
      sync();
      const int32_t expect = cached_prefix();
      Ids blocks;
      if (a.allocate(n_full, &blocks).ok()) {
        InsertResult r;
        CHECK_OK(t.insert(ns, tokens, blocks, &r));
        CHECK(r.num_new_blocks == n_full - expect && static_cast<int32_t>(r.duplicate_block_ids.size()) == expect);
        for (int32_t i = expect; i < n_full; ++i) model[prefix(i + 1)] = blocks[i];
        CHECK_OK(a.free(blocks));
      }
    } else if (op == 2 && !locks.empty()) {
      const size_t i = rng() % locks.size();
      CHECK_OK(t.unlock(locks[i]));
      locks.erase(locks.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      int32_t freed = 0;
      const int32_t want = static_cast<int32_t>(rng() % 6);
      const int32_t evictable = t.num_evictable_blocks();
      CHECK_OK(t.evict(want, &freed));
      CHECK(freed == std::min(want, evictable));
    }
    sync();
    CHECK(t.num_cached_blocks() == static_cast<int32_t>(model.size()));
    CHECK_OK(t.check_invariants());
    if (trillium::test::failures() != before) {
      std::fprintf(stderr, "random test failed at step %d, seed %u, block_size %d, mask %llx\n", step, seed, bs,
                   static_cast<unsigned long long>(key_mask));
    }
  }
}

// The journal: a stored suffix names the cached block before it; evict/clear report drops tail
// first; nothing is journalled while recording is off, and turning it off drops the journal.
void test_event_journal() {
  using Kind = trillium::CacheEvent::Kind;
  BlockAllocator a(8);
  RadixTree t(&a, 2);
  t.set_record_events(true);
  const Ids blocks = alloc(a, 3);
  insert(t, 1, {1, 2, 3, 4, 5, 6}, blocks);
  const Ids more = alloc(a, 1);
  insert(t, 1, {1, 2, 3, 4, 9, 9}, {blocks[0], blocks[1], more[0]});  // branches after 2 blocks
  std::vector<trillium::CacheEvent> events = t.take_events();
  CHECK(events.size() == 2);
  CHECK(events[0].kind == Kind::kStored && events[0].block_ids == blocks && events[0].parent_block_id == -1);
  CHECK(events[0].tokens == Ids({1, 2, 3, 4, 5, 6}) && events[0].ns == 1);
  CHECK(events[1].block_ids == more && events[1].parent_block_id == blocks[1] && events[1].tokens == Ids({9, 9}));
  CHECK(t.take_events().empty());  // taken
  t.journal_cached();  // the whole cache, parents first: what a late subscriber is sent
  events = t.take_events();
  CHECK(events.size() == 3 && events[0].parent_block_id == -1 && events[0].block_ids == Ids({blocks[0], blocks[1]}));
  CHECK(events[1].parent_block_id == blocks[1] && events[2].parent_block_id == blocks[1]);  // the two branches
  CHECK_OK(a.free(blocks));
  CHECK_OK(a.free(more));
  CHECK(evict(t, 1) == 1);
  events = t.take_events();
  CHECK(events.size() == 1 && events[0].kind == Kind::kRemoved && events[0].tokens.empty());
  int32_t dropped = 0;
  t.set_record_events(false);
  CHECK_OK(t.clear(&dropped));
  CHECK(dropped == 3 && t.take_events().empty());
}

}  // namespace

int main() {
  test_event_journal();
  test_empty_tree_and_null_handle();
  test_insert_then_match_shares_blocks();
  test_split_on_insert_reports_duplicates();
  test_match_inside_an_edge_splits_and_locks_only_the_match();
  test_handle_survives_split_and_upper_part_inherits_lock();
  test_namespaces_never_share();
  test_lru_order_and_tail_first();
  test_shared_blocks_pin_their_leaf();
  test_bad_insert_changes_nothing();
  test_clear_keeps_locked_and_destructor_releases();
  test_random_against_model(~uint64_t{0});
  test_random_against_model(0);
  return trillium::test::test_exit_code();
}
