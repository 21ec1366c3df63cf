// A C++ host embedding trillium_core with no Python: the shape of a request's block life cycle.
// Exits nonzero if anything goes wrong, so ctest runs it as a smoke test.
#include <cstdio>
#include <vector>

#include "trillium/block_allocator.h"

namespace {

bool report(const trillium::Status& st, const char* what) {
  if (!st.ok()) std::fprintf(stderr, "%s: %s\n", what, st.message().c_str());
  return st.ok();
}

}  // namespace

int main() {
  trillium::BlockAllocator alloc(/*num_blocks=*/16);

  std::vector<int32_t> request_a;  // block table of request A: 5 blocks
  if (!report(alloc.allocate(5, &request_a), "allocate A")) return 1;

  // Request B shares A's first two blocks (a common prefix) and adds three of its own.
  std::vector<int32_t> request_b(request_a.begin(), request_a.begin() + 2);
  if (!report(alloc.incref(request_b), "incref shared prefix")) return 1;
  if (!report(alloc.allocate(3, &request_b), "allocate B")) return 1;

  std::vector<int32_t> too_many;
  if (alloc.allocate(100, &too_many).code() != trillium::StatusCode::kOutOfBlocks) return 1;

  if (!report(alloc.free(request_a), "free A")) return 1;
  std::printf("after A finished: %d used, %d free, shared block ref count %d\n", alloc.num_used_blocks(),
              alloc.num_free_blocks(), alloc.ref_count(request_b[0]));
  if (alloc.num_used_blocks() != 5 || alloc.ref_count(request_b[0]) != 1) return 1;

  if (!report(alloc.free(request_b), "free B")) return 1;
  if (!report(alloc.check_invariants(), "invariants")) return 1;
  return alloc.num_free_blocks() == alloc.num_total_blocks() ? 0 : 1;
}
