// trillium::RadixTree: the prefix cache, a block-aligned radix tree over token ids.
//
// Every namespace (model + adapter + tenant salt, hashed by the caller into a uint64) has its own
// root; namespaces never share nodes or blocks. A node's edge covers whole blocks of block_size
// tokens, and each block of the edge names the KV block that holds those tokens:
//
//   root(ns) ── A: tokens [0, 32)  blocks [7, 2] ──┬── B: tokens [32, 48) blocks [11]
//                                                  └── C: tokens [32, 64) blocks [4, 9]
//
//   the sequence A+C = 64 tokens lives in blocks [7, 2, 4, 9]; only full blocks are ever cached.
//
// Ownership. The tree holds exactly ONE allocator reference on every block it caches: insert()
// increfs the caller's blocks for the new suffix (the caller keeps its own reference), evict() and
// clear() drop it again through BlockAllocator::free(). A block leaves the tree only through them.
//
// Locks. lock(handle) adds one to the lock count of the handle's node and of all its ancestors, so
// the ancestors of a locked node are always locked, and a parent's count is >= the sum of its
// children's. evict() never touches a locked node; clear() drops only unlocked nodes.
//
// Handles. A NodeHandle is (slot generation << 32 | slot index). It stays valid while its node
// exists: a split keeps the LOWER part in the original slot (same handle) and gives the upper part
// a new slot that inherits the node's lock count and timestamp, so a held lock protects exactly the
// same blocks before and after the split. A node is removed only by evict()/clear() and only while
// unlocked; a handle to a removed node is stale and lock()/unlock() reject it (kInvalidArgument).
// Lock right after match() (the binding's match(lock=True) does both under one mutex). The null
// handle (value 0) stands for every namespace root: match() returns it for 0 matched blocks, and
// lock()/unlock() on it are no-ops (a root holds no blocks and is never evicted while it has
// children).
//
// LRU. A logical clock ticks once per match()/insert(); every node on the matched/inserted path gets
// the tick, so a parent is never older than its children. evict() frees the least recently used
// unlocked leaves first, tail blocks first, and skips blocks that someone else still references
// (allocator ref count > 1): dropping those would free nothing and lose a prefix in active use.
//
// Events. With set_record_events(true) the tree journals every change to what it caches, in order:
// kStored when insert() adopts a suffix (its blocks, their tokens, and the cached block just before
// it, so a subscriber can chain the sequence), kRemoved when evict()/clear() drops blocks (a tail
// of one edge per event). take_events() hands the journal over and empties it. A host publishes
// these (e.g. vLLM's KV-event wire format for a cache-aware router); splits change no block and
// journal nothing. Off by default: a tree nobody watches pays nothing.
//
// Not thread-safe: one owner at a time; the Python binding serializes every call on the
// allocator's mutex (the tree mutates the allocator). The allocator must outlive the tree; the
// destructor drops the tree's references.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "trillium/block_allocator.h"
#include "trillium/status.h"

namespace trillium {

using TokenId = int32_t;
using BlockId = int32_t;
using NamespaceId = uint64_t;

// Names one tree node; see "Handles" above. Value 0 is the null (root) handle.
class [[nodiscard]] NodeHandle {
 public:
  constexpr NodeHandle() = default;
  static constexpr NodeHandle from_value(uint64_t value) { return NodeHandle(value); }
  constexpr uint64_t value() const { return value_; }
  constexpr bool is_null() const { return value_ == 0; }
  friend constexpr bool operator==(NodeHandle a, NodeHandle b) { return a.value_ == b.value_; }
  friend constexpr bool operator!=(NodeHandle a, NodeHandle b) { return a.value_ != b.value_; }

 private:
  constexpr explicit NodeHandle(uint64_t value) : value_(value) {}
  uint64_t value_ = 0;
};

struct MatchResult {
  std::vector<BlockId> block_ids;  // [num_tokens / block_size] the cached blocks, in order
  int32_t num_tokens = 0;          // matched tokens, a multiple of block_size
  NodeHandle handle;               // deepest matched node; null when nothing matched
};

struct InsertResult {
  int32_t num_new_blocks = 0;  // caller blocks the tree adopted (incref'd) for the new suffix
  // Caller blocks for positions the tree had already cached under a DIFFERENT block id; the tree
  // keeps its own block there. A position whose caller block IS the tree's block is not listed.
  std::vector<BlockId> duplicate_block_ids;
};

// One journalled change (see "Events" above).
struct CacheEvent {
  enum class Kind : uint8_t { kStored = 0, kRemoved = 1 };
  Kind kind = Kind::kStored;
  NamespaceId ns = 0;
  std::vector<BlockId> block_ids;  // in sequence order
  BlockId parent_block_id = -1;    // kStored: the cached block before block_ids[0]; -1 at the start
  std::vector<TokenId> tokens;     // kStored: block_ids.size() * block_size tokens; empty for kRemoved
};

// Cumulative counters; never reset (clear() keeps them).
struct RadixTreeStats {
  uint64_t num_queries = 0;          // match() calls
  uint64_t num_query_tokens = 0;     // tokens passed to match(), partial blocks included
  uint64_t num_hit_tokens = 0;       // tokens match() found cached
  uint64_t num_inserted_blocks = 0;  // blocks insert() adopted
  uint64_t num_evicted_blocks = 0;   // blocks evict() or clear() dropped from the tree
};

class RadixTree {
 public:
  // allocator: not owned, must outlive the tree. Throws std::invalid_argument if allocator is null
  // or block_size < 1. child_key_mask is for tests only: masking the child-key hash (e.g. to 0)
  // forces every sibling into one collision chain.
  RadixTree(BlockAllocator* allocator, int32_t block_size, uint64_t child_key_mask = ~uint64_t{0});
  ~RadixTree();
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  // Longest cached prefix of tokens[0, num_tokens) in namespace ns, whole blocks only. Mutates:
  // the matched path's LRU timestamps, and splits the last matched node when the match ends inside
  // its edge (so the handle names exactly the matched blocks). Adds no reference and no lock: the
  // blocks stay safe to use only while the handle is locked (or the caller holds its own refs).
  [[nodiscard]] MatchResult match(NamespaceId ns, const TokenId* tokens, size_t num_tokens);
  [[nodiscard]] MatchResult match(NamespaceId ns, const std::vector<TokenId>& tokens) {
    return match(ns, tokens.data(), tokens.size());
  }

  // +1 / -1 on the lock count of the handle's node and every ancestor. Null handle: no-op.
  // kInvalidArgument (and no change) for a stale handle, or unlock() of a node that is not locked.
  Status lock(NodeHandle handle);
  Status unlock(NodeHandle handle);

  // Caches the full blocks of tokens[0, num_tokens): n = num_tokens / block_size blocks, where
  // block_ids[i] holds tokens [i*bs, (i+1)*bs); needs num_block_ids >= n (extra ids are ignored).
  // The cached prefix keeps the tree's blocks (differing caller ids -> duplicate_block_ids); the
  // rest becomes one new leaf whose blocks the tree increfs. Touches the path's timestamps; splits
  // a node where the sequence diverges inside its edge. All-or-nothing: kInvalidArgument, and no
  // change, if a new-suffix block is out of range, free, listed twice, or cached elsewhere.
  Status insert(NamespaceId ns, const TokenId* tokens, size_t num_tokens, const BlockId* block_ids,
                size_t num_block_ids, InsertResult* out);
  Status insert(NamespaceId ns, const std::vector<TokenId>& tokens, const std::vector<BlockId>& block_ids,
                InsertResult* out) {
    return insert(ns, tokens.data(), tokens.size(), block_ids.data(), block_ids.size(), out);
  }

  // Returns up to num_blocks blocks to the allocator's free list: least recently used unlocked
  // leaves first, each from its tail (a leaf may be trimmed rather than removed); a block with
  // allocator ref count > 1 pins its leaf. *num_freed = blocks freed (< num_blocks when nothing
  // else is evictable). O(nodes + freed * log nodes). kInvalidArgument if num_blocks < 0.
  Status evict(int32_t num_blocks, int32_t* num_freed);

  // Drops every unlocked node (whatever its blocks' ref counts) and namespaces left empty.
  // *num_dropped = blocks the tree released (those still referenced elsewhere stay allocated).
  Status clear(int32_t* num_dropped);

  int32_t block_size() const { return block_size_; }
  int32_t num_cached_blocks() const { return num_cached_blocks_; }
  int32_t num_nodes() const { return num_live_nodes_; }  // roots included
  int32_t num_namespaces() const { return static_cast<int32_t>(roots_.size()); }
  // What evict(infinity) would free now. O(nodes).
  int32_t num_evictable_blocks() const;
  const RadixTreeStats& stats() const { return stats_; }

  // Journal changes from now on (true) or stop and drop the journal (false).
  void set_record_events(bool on);
  bool record_events() const { return record_events_; }
  // The journal since the last call, oldest first; leaves it empty.
  std::vector<CacheEvent> take_events();
  // Journals the whole cache as kStored events, parents before children (one per node), after
  // what is already journalled: a subscriber that starts from an empty view (it joined late, or
  // was told everything was cleared) then holds exactly the cache. No-op unless recording.
  void journal_cached();

  // O(nodes + blocks) self-check, then the allocator's own check; kInternal naming the first
  // violation: tree shape and child keys, edge lengths, lock counts (parent >= sum of children),
  // timestamps (parent >= child), no block cached twice, every cached block referenced, counters.
  Status check_invariants() const;

 private:
  using NodeIndex = int32_t;
  static constexpr NodeIndex kNone = -1;

  struct Node {
    std::vector<TokenId> tokens;  // the edge: blocks.size() * block_size tokens (empty for a root)
    std::vector<BlockId> blocks;  // blocks[i] holds tokens [i*bs, (i+1)*bs)
    std::unordered_map<uint64_t, NodeIndex> children;  // child key -> first child of that key
    NodeIndex parent = kNone;
    NodeIndex next_same_key = kNone;  // next sibling with the same key (hash collision chain)
    int32_t num_children = 0;
    int32_t lock_count = 0;
    uint64_t key = 0;  // hash of the edge's first block (masked), the parent's map key
    uint64_t last_access = 0;
    NamespaceId ns = 0;
    uint32_t generation = 1;  // bumped when the slot is released, so old handles go stale
    bool live = false;
    bool is_root = false;
  };

  uint64_t block_key(const TokenId* block) const;
  bool same_block(const TokenId* a, const TokenId* b) const;
  NodeIndex find_child(NodeIndex parent, const TokenId* block) const;
  void link_child(NodeIndex parent, NodeIndex child);
  void unlink_child(NodeIndex parent, NodeIndex child);
  NodeIndex new_node(NamespaceId ns);
  void release_node(NodeIndex n);
  NodeIndex find_root(NamespaceId ns) const;
  NodeIndex get_or_create_root(NamespaceId ns);
  NodeHandle handle_of(NodeIndex n) const;
  NodeIndex resolve(NodeHandle h) const;

  // Read-only walk from root over n_full blocks. Appends the visited nodes to *path; *last_matched
  // is how many blocks of the last one matched (maybe fewer than its edge). Returns blocks matched.
  int32_t descend(NodeIndex root, const TokenId* tokens, int32_t n_full, std::vector<NodeIndex>* path,
                  int32_t* last_matched) const;
  // Splits the partially matched last node of a path, stamps the path with tick, returns the
  // deepest node (root if the path is empty).
  NodeIndex commit_path(NodeIndex root, std::vector<NodeIndex>* path, int32_t last_matched, uint64_t tick);
  // Splits n after its first k blocks (0 < k < blocks); returns the new upper node.
  NodeIndex split(NodeIndex n, int32_t k);
  // Moves n's last count blocks into *out and forgets them (no allocator call).
  void drop_tail(NodeIndex n, int32_t count, std::vector<BlockId>* out);
  // Journals n's whole edge as one kStored event, its parent's last block as the parent block.
  void journal_stored(NodeIndex n);
  // Detaches an empty leaf from its parent and releases it; an empty root goes too.
  void remove_leaf(NodeIndex n);
  // Number of trailing blocks of n whose allocator ref count is exactly 1.
  int32_t trailing_sole_refs(NodeIndex n) const;
  // All live nodes, each after its parent.
  std::vector<NodeIndex> preorder() const;

  BlockAllocator* allocator_;
  int32_t block_size_;
  uint64_t child_key_mask_;
  std::vector<Node> nodes_;                         // the arena
  std::vector<NodeIndex> free_slots_;               // released slots, reused LIFO
  std::unordered_map<NamespaceId, NodeIndex> roots_;
  std::vector<NodeIndex> block_owner_;              // [allocator blocks] node caching it, or kNone
  int32_t num_cached_blocks_ = 0;
  int32_t num_live_nodes_ = 0;
  uint64_t clock_ = 0;
  bool record_events_ = false;
  std::vector<CacheEvent> events_;
  RadixTreeStats stats_;
};

}  // namespace trillium
