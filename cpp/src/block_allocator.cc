#include "trillium/block_allocator.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace trillium {

BlockAllocator::BlockAllocator(int32_t num_blocks)
    : num_blocks_(num_blocks), num_free_(0), head_(num_blocks) {
  if (num_blocks < 0) {
    throw std::invalid_argument("num_blocks must be >= 0, got " + std::to_string(num_blocks));
  }
  ref_count_.assign(num_blocks, 0);
  prev_.assign(num_blocks + 1, kNotInList);
  next_.assign(num_blocks + 1, kNotInList);
  prev_[head_] = next_[head_] = head_;  // empty circular list
  for (int32_t id = 0; id < num_blocks; ++id) push_back(id);
}

void BlockAllocator::push_back(int32_t id) {
  const int32_t last = prev_[head_];
  prev_[id] = last;
  next_[id] = head_;
  next_[last] = id;
  prev_[head_] = id;
  ++num_free_;
}

void BlockAllocator::unlink(int32_t id) {
  next_[prev_[id]] = next_[id];
  prev_[next_[id]] = prev_[id];
  prev_[id] = next_[id] = kNotInList;
  --num_free_;
}

Status BlockAllocator::allocate(int32_t n, std::vector<int32_t>* out) {
  if (n < 0) return Status::InvalidArgument("cannot allocate a negative number of blocks: " + std::to_string(n));
  if (n > num_free_) {
    return Status::OutOfBlocks("requested " + std::to_string(n) + " blocks but only " +
                               std::to_string(num_free_) + " of " + std::to_string(num_blocks_) + " are free");
  }
  out->reserve(out->size() + n);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = next_[head_];
    unlink(id);
    ref_count_[id] = 1;
    out->push_back(id);
  }
  return Status::Ok();
}

Status BlockAllocator::incref(int32_t block_id) { return incref(std::vector<int32_t>{block_id}); }

Status BlockAllocator::incref(const std::vector<int32_t>& block_ids) {
  for (int32_t id : block_ids) {  // validate all first: all-or-nothing
    if (!valid_id(id)) {
      return Status::InvalidArgument("incref: block id " + std::to_string(id) + " is outside [0, " +
                                     std::to_string(num_blocks_) + ")");
    }
    if (ref_count_[id] == 0) return Status::InvalidArgument("incref: block " + std::to_string(id) + " is free");
  }
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const int32_t id = block_ids[i];
    if (ref_count_[id] == std::numeric_limits<int32_t>::max()) {
      for (size_t j = 0; j < i; ++j) --ref_count_[block_ids[j]];  // roll back
      return Status::InvalidArgument("incref: ref count of block " + std::to_string(id) + " would overflow");
    }
    ++ref_count_[id];
  }
  return Status::Ok();
}

Status BlockAllocator::free(const std::vector<int32_t>& block_ids) {
  // Pass 1 drops references and validates as it goes (so a block listed more often than it is
  // referenced is caught); on the first bad id it restores what it dropped. Free-list links are
  // only touched in pass 2, once the whole call is known to succeed.
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const int32_t id = block_ids[i];
    const bool bad_id = !valid_id(id);
    if (bad_id || ref_count_[id] == 0) {
      for (size_t j = 0; j < i; ++j) ++ref_count_[block_ids[j]];
      return Status::InvalidArgument(bad_id ? "free: block id " + std::to_string(id) + " is outside [0, " +
                                                  std::to_string(num_blocks_) + ")"
                                            : "free: block " + std::to_string(id) + " is already free (double free)");
    }
    --ref_count_[id];
  }
  for (auto it = block_ids.rbegin(); it != block_ids.rend(); ++it) {
    if (ref_count_[*it] == 0 && next_[*it] == kNotInList) push_back(*it);
  }
  return Status::Ok();
}

int32_t BlockAllocator::ref_count(int32_t block_id) const {
  return valid_id(block_id) ? ref_count_[block_id] : -1;
}

bool BlockAllocator::is_free(int32_t block_id) const {
  return valid_id(block_id) && next_[block_id] != kNotInList;
}

Status BlockAllocator::check_invariants() const {
  auto fail = [](const std::string& m) { return Status::Internal("BlockAllocator invariant violated: " + m); };
  // Walk the free list from the sentinel; a cycle or a stray link shows up as a repeat or a bad id.
  std::vector<char> seen(num_blocks_, 0);
  int32_t walked = 0;
  for (int32_t prev = head_, id = next_[head_]; id != head_; prev = id, id = next_[id]) {
    if (!valid_id(id)) return fail("free list links to bad id " + std::to_string(id));
    if (prev_[id] != prev) return fail("free list prev link of block " + std::to_string(id) + " is broken");
    if (seen[id]) return fail("block " + std::to_string(id) + " appears twice in the free list");
    seen[id] = 1;
    if (ref_count_[id] != 0) {
      return fail("free block " + std::to_string(id) + " has ref count " + std::to_string(ref_count_[id]));
    }
    ++walked;
  }
  if (walked != num_free_) {
    return fail("free list holds " + std::to_string(walked) + " blocks but num_free is " + std::to_string(num_free_));
  }
  int32_t used = 0;
  for (int32_t id = 0; id < num_blocks_; ++id) {
    if (ref_count_[id] < 0) return fail("block " + std::to_string(id) + " has negative ref count");
    if (ref_count_[id] > 0) {
      ++used;
      if (prev_[id] != kNotInList || next_[id] != kNotInList) {
        return fail("used block " + std::to_string(id) + " is still linked into the free list");
      }
    } else if (!seen[id]) {
      return fail("block " + std::to_string(id) + " has ref count 0 but is not in the free list");
    }
  }
  if (used + num_free_ != num_blocks_) {
    return fail("free (" + std::to_string(num_free_) + ") + used (" + std::to_string(used) + ") != total (" +
                std::to_string(num_blocks_) + ")");
  }
  return Status::Ok();
}

}  // namespace trillium
