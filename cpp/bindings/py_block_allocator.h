// PyBlockAllocator: the Python-facing wrapper of trillium::BlockAllocator, shared by every binding
// that touches the allocator (block_allocator.cc, radix_tree.cc). Shared because the prefix cache
// mutates the allocator: it must reach the same BlockAllocator and serialize on the same mutex.
// Errors go through status.h.
#pragma once

#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "status.h"
#include "trillium/block_allocator.h"

namespace trillium::bindings {

class PyBlockAllocator {
 public:
  explicit PyBlockAllocator(int32_t num_blocks) : alloc_(num_blocks) {}

  std::vector<int32_t> allocate(int32_t n) {
    std::vector<int32_t> out;
    std::lock_guard<std::mutex> lock(mu_);
    raise_if_error(alloc_.allocate(n, &out));
    return out;
  }
  void incref(const std::vector<int32_t>& ids) {
    std::lock_guard<std::mutex> lock(mu_);
    raise_if_error(alloc_.incref(ids));
  }
  void free(const std::vector<int32_t>& ids) {
    std::lock_guard<std::mutex> lock(mu_);
    raise_if_error(alloc_.free(ids));
  }
  void check_invariants() {
    std::lock_guard<std::mutex> lock(mu_);
    raise_if_error(alloc_.check_invariants());
  }
  bool can_allocate(int32_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    return alloc_.can_allocate(n);
  }
  int32_t ref_count(int32_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    const int32_t rc = alloc_.ref_count(id);
    if (rc < 0) {
      throw std::invalid_argument("block id " + std::to_string(id) + " is outside [0, " +
                                  std::to_string(alloc_.num_total_blocks()) + ")");
    }
    return rc;
  }
  int32_t num_free_blocks() {
    std::lock_guard<std::mutex> lock(mu_);
    return alloc_.num_free_blocks();
  }
  int32_t num_used_blocks() {
    std::lock_guard<std::mutex> lock(mu_);
    return alloc_.num_used_blocks();
  }
  int32_t num_total_blocks() const { return alloc_.num_total_blocks(); }  // immutable

  // For bindings that mutate the allocator themselves (the prefix cache): hold mutex() around
  // every use of core(), and never wait for the GIL while holding it.
  std::mutex& mutex() { return mu_; }
  BlockAllocator& core() { return alloc_; }

 private:
  std::mutex mu_;
  BlockAllocator alloc_;
};

}  // namespace trillium::bindings
