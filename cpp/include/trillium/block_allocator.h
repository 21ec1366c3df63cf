// trillium::BlockAllocator: ref-counted KV block ids with an O(1) free list.
//
// Blocks are plain integer ids in [0, num_blocks); the allocator owns metadata only, never memory.
// A block is *used* while its ref count is > 0 and *free* (in the free list) when it is 0.
//
// The free list is intrusive: prev/next links live in two vectors indexed by block id, with one
// sentinel node at index num_blocks, so any block can be unlinked in O(1). That is what lets the
// prefix cache (later) keep freed-but-cached blocks in the list as evictable, and take one back
// out when a new request hits it.
//
//   head (sentinel) <-> b_first <-> ... <-> b_last <-> head      allocate() pops from the front,
//                       ^ reused/evicted first                   free() appends at the back.
//
// free() appends in REVERSE order of the ids it is given: for a request's block chain
// [b0, b1, b2] the tail b2 lands nearest the front, so tails are reused (evicted) before the
// prefix blocks that other requests are more likely to share.
//
// Not thread-safe: one owner (the scheduler) at a time; the Python binding adds a mutex.
#pragma once

#include <cstdint>
#include <vector>

#include "trillium/status.h"

namespace trillium {

class BlockAllocator {
 public:
  // All blocks start free, in id order. Throws std::invalid_argument if num_blocks < 0.
  explicit BlockAllocator(int32_t num_blocks);

  // Takes n free blocks (ref count 0 -> 1) from the front of the free list and appends their ids
  // to *out in allocation order. All-or-nothing: if fewer than n blocks are free, returns
  // kOutOfBlocks and changes neither the allocator nor *out. n < 0 -> kInvalidArgument.
  Status allocate(int32_t n, std::vector<int32_t>* out);

  // True iff allocate(n) would succeed now.
  bool can_allocate(int32_t n) const { return n >= 0 && n <= num_free_; }

  // Adds one reference to a used block (sharing it with another request). A bad id or a free
  // block -> kInvalidArgument. The list form validates every id first and changes nothing on
  // failure; a block listed k times gains k references.
  Status incref(int32_t block_id);
  Status incref(const std::vector<int32_t>& block_ids);

  // Drops one reference per listed id; a block whose ref count reaches 0 goes to the back of the
  // free list, in reverse order of block_ids (see the header comment). All-or-nothing: a bad id or
  // a free (double free) -> kInvalidArgument and nothing changes, including when one id is listed
  // more times than it has references.
  Status free(const std::vector<int32_t>& block_ids);

  // Ref count of a block, or -1 for an id outside [0, num_blocks).
  int32_t ref_count(int32_t block_id) const;
  // True iff the block is in the free list (ref count 0). False for a bad id.
  bool is_free(int32_t block_id) const;

  int32_t num_free_blocks() const { return num_free_; }
  int32_t num_total_blocks() const { return num_blocks_; }
  int32_t num_used_blocks() const { return num_blocks_ - num_free_; }

  // O(num_blocks) self-check; kInternal naming the first violation found:
  // free + used == total; the free list is well linked, has no repeats, and holds exactly the
  // blocks whose ref count is 0; no ref count is negative.
  Status check_invariants() const;

 private:
  static constexpr int32_t kNotInList = -1;

  bool valid_id(int32_t id) const { return id >= 0 && id < num_blocks_; }
  void push_back(int32_t id);  // link a block at the back of the free list
  void unlink(int32_t id);     // remove a block from the free list

  int32_t num_blocks_;
  int32_t num_free_;
  int32_t head_;                   // sentinel index == num_blocks_
  std::vector<int32_t> ref_count_;  // [num_blocks]
  std::vector<int32_t> prev_;       // [num_blocks + 1], kNotInList while used
  std::vector<int32_t> next_;       // [num_blocks + 1], kNotInList while used
};

}  // namespace trillium
