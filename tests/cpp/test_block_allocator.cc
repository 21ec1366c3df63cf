// Unit tests for trillium::BlockAllocator (plain ctest executable, see check.h).
#include "trillium/block_allocator.h"

#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "check.h"

using trillium::BlockAllocator;
using trillium::StatusCode;

namespace {

void test_allocate_free_round_trip() {
  BlockAllocator a(8);
  CHECK(a.num_free_blocks() == 8 && a.num_used_blocks() == 0 && a.num_total_blocks() == 8);
  std::vector<int32_t> ids;
  CHECK_OK(a.allocate(3, &ids));
  CHECK((ids == std::vector<int32_t>{0, 1, 2}));  // fresh blocks come out in id order
  CHECK(a.num_free_blocks() == 5 && a.num_used_blocks() == 3);
  for (int32_t id : ids) CHECK(a.ref_count(id) == 1 && !a.is_free(id));
  CHECK_OK(a.check_invariants());
  CHECK_OK(a.free(ids));
  CHECK(a.num_free_blocks() == 8);
  CHECK_OK(a.check_invariants());
  std::vector<int32_t> none;
  CHECK_OK(a.allocate(0, &none));
  CHECK(none.empty());
}

void test_all_or_nothing() {
  BlockAllocator a(4);
  std::vector<int32_t> ids;
  CHECK_OK(a.allocate(3, &ids));
  std::vector<int32_t> more = {42};
  const auto st = a.allocate(2, &more);
  CHECK(st.code() == StatusCode::kOutOfBlocks);
  CHECK((more == std::vector<int32_t>{42}));
  CHECK(a.num_free_blocks() == 1 && !a.can_allocate(2) && a.can_allocate(1));
  CHECK(a.allocate(-1, &more).code() == StatusCode::kInvalidArgument);
  CHECK_OK(a.check_invariants());
}

void test_refcount_sharing() {
  BlockAllocator a(4);
  std::vector<int32_t> ids;
  CHECK_OK(a.allocate(2, &ids));
  CHECK_OK(a.incref(ids));
  CHECK(a.ref_count(ids[0]) == 2);
  CHECK_OK(a.free(ids));
  CHECK(a.num_free_blocks() == 2 && a.ref_count(ids[0]) == 1);
  CHECK_OK(a.free(ids));
  CHECK(a.num_free_blocks() == 4 && a.ref_count(ids[0]) == 0);
  CHECK_OK(a.check_invariants());
}

void test_bad_input_changes_nothing() {
  BlockAllocator a(4);
  std::vector<int32_t> ids;
  CHECK_OK(a.allocate(2, &ids));  // {0, 1}
  CHECK(a.free({0, 2}).code() == StatusCode::kInvalidArgument);  // 2 is free
  CHECK(a.ref_count(0) == 1);                                    // 0 was restored
  CHECK(a.free({0, 0}).code() == StatusCode::kInvalidArgument);  // listed more than referenced
  CHECK(a.ref_count(0) == 1);
  CHECK(a.free({7}).code() == StatusCode::kInvalidArgument);
  CHECK(a.free({-1}).code() == StatusCode::kInvalidArgument);
  CHECK(a.incref({0, 3}).code() == StatusCode::kInvalidArgument);  // 3 is free
  CHECK(a.ref_count(0) == 1);
  CHECK(a.incref(9).code() == StatusCode::kInvalidArgument);
  CHECK(a.ref_count(9) == -1 && a.ref_count(-3) == -1);
  CHECK(a.num_free_blocks() == 2);
  CHECK_OK(a.check_invariants());
  CHECK_OK(a.free(ids));
  CHECK(a.free(ids).code() == StatusCode::kInvalidArgument);  // double free
  CHECK_OK(a.check_invariants());
  bool threw = false;
  try {
    BlockAllocator bad(-1);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
}

void test_reverse_order_reuse() {
  BlockAllocator a(6);
  std::vector<int32_t> chain;
  CHECK_OK(a.allocate(6, &chain));  // the whole pool, so reuse order is all ours
  CHECK_OK(a.free({chain[0], chain[1], chain[2]}));
  std::vector<int32_t> next;
  CHECK_OK(a.allocate(3, &next));
  CHECK((next == std::vector<int32_t>{chain[2], chain[1], chain[0]}));  // tail first
  CHECK_OK(a.check_invariants());
}

void test_free_duplicates_with_enough_refs() {
  BlockAllocator a(3);
  std::vector<int32_t> ids;
  CHECK_OK(a.allocate(1, &ids));
  CHECK_OK(a.incref(ids[0]));
  CHECK_OK(a.free({ids[0], ids[0]}));  // two refs, listed twice: freed once, linked once
  CHECK(a.num_free_blocks() == 3);
  CHECK_OK(a.check_invariants());
}

void test_random_against_model() {
  std::random_device rd;
  const uint32_t seed = rd();
  std::mt19937 rng(seed);
  const int32_t n = 1 + static_cast<int32_t>(rng() % 64);
  BlockAllocator a(n);
  std::vector<int32_t> model(n, 0);
  std::vector<std::vector<int32_t>> held;  // each entry is one reference per listed id
  const int before = trillium::test::failures();
  for (int step = 0; step < 2000; ++step) {
    const uint32_t op = rng() % 3;
    if (op == 0) {
      const int32_t k = static_cast<int32_t>(rng() % 8);
      std::vector<int32_t> ids;
      int32_t free_in_model = 0;
      for (int32_t r : model) free_in_model += (r == 0);
      const auto st = a.allocate(k, &ids);
      CHECK(st.ok() == (k <= free_in_model));
      if (st.ok()) {
        for (int32_t id : ids) {
          CHECK(model[id] == 0);
          model[id] = 1;
        }
        held.push_back(ids);
      }
    } else if (op == 1 && !held.empty()) {
      const auto& ids = held[rng() % held.size()];
      CHECK_OK(a.incref(ids));
      for (int32_t id : ids) ++model[id];
      held.push_back(ids);
    } else if (!held.empty()) {
      const size_t i = rng() % held.size();
      CHECK_OK(a.free(held[i]));
      for (int32_t id : held[i]) --model[id];
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
    }
    for (int32_t id = 0; id < n; ++id) CHECK(a.ref_count(id) == model[id]);
    CHECK_OK(a.check_invariants());
    if (trillium::test::failures() != before) {
      std::fprintf(stderr, "random test failed at step %d, seed %u, num_blocks %d\n", step, seed, n);
      return;
    }
  }
}

}  // namespace

int main() {
  test_allocate_free_round_trip();
  test_all_or_nothing();
  test_refcount_sharing();
  test_bad_input_changes_nothing();
  test_reverse_order_reuse();
  test_free_duplicates_with_enough_refs();
  test_random_against_model();
  return trillium::test::test_exit_code();
}
