#include "trillium/radix_tree.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <queue>
#include <stdexcept>
#include <string>
#include <utility>

namespace trillium {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Whole blocks in num_tokens tokens, capped so that blocks * block_size fits an int32.
int32_t full_blocks(size_t num_tokens, int32_t block_size) {
  const size_t bs = static_cast<size_t>(block_size);
  return static_cast<int32_t>(std::min(num_tokens / bs, static_cast<size_t>(INT32_MAX) / bs));
}

constexpr int32_t kPending = -2;  // block_owner_ mark while insert() validates its suffix

}  // namespace

RadixTree::RadixTree(BlockAllocator* allocator, int32_t block_size, uint64_t child_key_mask)
    : allocator_(allocator), block_size_(block_size), child_key_mask_(child_key_mask) {
  if (allocator == nullptr) throw std::invalid_argument("RadixTree needs a BlockAllocator, got null");
  if (block_size < 1) throw std::invalid_argument("block_size must be >= 1, got " + str(block_size));
  block_owner_.assign(allocator->num_total_blocks(), kNone);
}

RadixTree::~RadixTree() {
  std::vector<BlockId> held;
  held.reserve(num_cached_blocks_);
  for (const Node& node : nodes_) held.insert(held.end(), node.blocks.begin(), node.blocks.end());
  // Cannot fail while the invariants hold (each cached block has the tree's reference), and a
  // destructor has no one to report to.
  (void)allocator_->free(held);
}

// ---- keys, slots, handles ------------------------------------------------------------------

uint64_t RadixTree::block_key(const TokenId* block) const {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int32_t i = 0; i < block_size_; ++i) h = (h ^ static_cast<uint32_t>(block[i])) * 0x100000001b3ULL;
  return mix64(h) & child_key_mask_;
}

bool RadixTree::same_block(const TokenId* a, const TokenId* b) const {
  return std::memcmp(a, b, sizeof(TokenId) * static_cast<size_t>(block_size_)) == 0;
}

RadixTree::NodeIndex RadixTree::find_child(NodeIndex parent, const TokenId* block) const {
  const Node& p = nodes_[parent];
  if (p.num_children == 0) return kNone;
  const auto it = p.children.find(block_key(block));
  if (it == p.children.end()) return kNone;
  for (NodeIndex c = it->second; c != kNone; c = nodes_[c].next_same_key) {
    if (same_block(nodes_[c].tokens.data(), block)) return c;
  }
  return kNone;
}

void RadixTree::link_child(NodeIndex parent, NodeIndex child) {
  Node& p = nodes_[parent];
  Node& c = nodes_[child];
  c.parent = parent;
  const auto [it, inserted] = p.children.try_emplace(c.key, child);
  c.next_same_key = inserted ? kNone : it->second;  // push to the front of the key's chain
  it->second = child;
  ++p.num_children;
}

void RadixTree::unlink_child(NodeIndex parent, NodeIndex child) {
  Node& p = nodes_[parent];
  Node& c = nodes_[child];
  const auto it = p.children.find(c.key);
  if (it->second == child) {
    if (c.next_same_key == kNone) {
      p.children.erase(it);
    } else {
      it->second = c.next_same_key;
    }
  } else {
    NodeIndex prev = it->second;
    while (nodes_[prev].next_same_key != child) prev = nodes_[prev].next_same_key;
    nodes_[prev].next_same_key = c.next_same_key;
  }
  c.parent = kNone;
  c.next_same_key = kNone;
  --p.num_children;
}

RadixTree::NodeIndex RadixTree::new_node(NamespaceId ns) {
  NodeIndex n;
  if (!free_slots_.empty()) {
    n = free_slots_.back();
    free_slots_.pop_back();
  } else {
    n = static_cast<NodeIndex>(nodes_.size());
    nodes_.emplace_back();  // may move every Node: callers re-take references afterwards
  }
  nodes_[n].live = true;
  nodes_[n].ns = ns;
  ++num_live_nodes_;
  return n;
}

void RadixTree::release_node(NodeIndex n) {
  // Generations stay in [1, 2^31) so a handle is nonzero and fits a signed 64-bit integer.
  uint32_t generation = nodes_[n].generation + 1;
  if (generation >= (1u << 31)) generation = 1;
  nodes_[n] = Node();  // frees the edge and the child map
  nodes_[n].generation = generation;
  free_slots_.push_back(n);
  --num_live_nodes_;
}

RadixTree::NodeIndex RadixTree::find_root(NamespaceId ns) const {
  const auto it = roots_.find(ns);
  return it == roots_.end() ? kNone : it->second;
}

RadixTree::NodeIndex RadixTree::get_or_create_root(NamespaceId ns) {
  NodeIndex root = find_root(ns);
  if (root != kNone) return root;
  root = new_node(ns);
  nodes_[root].is_root = true;
  roots_.emplace(ns, root);
  return root;
}

NodeHandle RadixTree::handle_of(NodeIndex n) const {
  return NodeHandle::from_value((uint64_t{nodes_[n].generation} << 32) | static_cast<uint32_t>(n));
}

RadixTree::NodeIndex RadixTree::resolve(NodeHandle h) const {
  const uint64_t index = h.value() & 0xffffffffULL;
  if (index >= nodes_.size()) return kNone;
  const Node& node = nodes_[index];
  if (!node.live || node.is_root || node.generation != (h.value() >> 32)) return kNone;
  return static_cast<NodeIndex>(index);
}

// ---- walking and reshaping ---------------------------------------------------------------------

int32_t RadixTree::descend(NodeIndex root, const TokenId* tokens, int32_t n_full, std::vector<NodeIndex>* path,
                           int32_t* last_matched) const {
  const size_t bs = static_cast<size_t>(block_size_);
  int32_t pos = 0;
  *last_matched = 0;
  for (NodeIndex cur = root; pos < n_full;) {
    const NodeIndex child = find_child(cur, tokens + pos * bs);
    if (child == kNone) break;
    const Node& c = nodes_[child];
    const int32_t len = static_cast<int32_t>(c.blocks.size());
    const int32_t limit = std::min(len, n_full - pos);
    int32_t m = 1;  // find_child compared the first block
    while (m < limit && same_block(c.tokens.data() + m * bs, tokens + (pos + m) * bs)) ++m;
    path->push_back(child);
    *last_matched = m;
    pos += m;
    if (m < len) break;
    cur = child;
  }
  return pos;
}

RadixTree::NodeIndex RadixTree::commit_path(NodeIndex root, std::vector<NodeIndex>* path, int32_t last_matched,
                                            uint64_t tick) {
  if (path->empty()) return root;
  if (last_matched < static_cast<int32_t>(nodes_[path->back()].blocks.size())) {
    path->back() = split(path->back(), last_matched);
  }
  for (NodeIndex n : *path) nodes_[n].last_access = tick;
  return path->back();
}

// Before: parent ── n[b0..bk-1, bk..]      After: parent ── up[b0..bk-1] ── n[bk..]
// n keeps its slot (so its handle and identity), up inherits its lock count and timestamp and
// takes its place in the parent's child chain.
RadixTree::NodeIndex RadixTree::split(NodeIndex n, int32_t k) {
  const NodeIndex up = new_node(nodes_[n].ns);
  Node& lo = nodes_[n];
  Node& u = nodes_[up];
  const size_t cut = static_cast<size_t>(k) * block_size_;
  u.tokens.assign(lo.tokens.begin(), lo.tokens.begin() + cut);
  u.blocks.assign(lo.blocks.begin(), lo.blocks.begin() + k);
  u.lock_count = lo.lock_count;
  u.last_access = lo.last_access;
  u.key = lo.key;
  u.parent = lo.parent;
  u.next_same_key = lo.next_same_key;
  Node& p = nodes_[lo.parent];
  auto it = p.children.find(lo.key);
  if (it->second == n) {
    it->second = up;
  } else {
    NodeIndex prev = it->second;
    while (nodes_[prev].next_same_key != n) prev = nodes_[prev].next_same_key;
    nodes_[prev].next_same_key = up;
  }
  lo.tokens.erase(lo.tokens.begin(), lo.tokens.begin() + cut);
  lo.blocks.erase(lo.blocks.begin(), lo.blocks.begin() + k);
  lo.key = block_key(lo.tokens.data());
  lo.parent = up;
  lo.next_same_key = kNone;
  u.children.emplace(lo.key, n);
  u.num_children = 1;
  for (BlockId b : u.blocks) block_owner_[b] = up;
  return up;
}

void RadixTree::drop_tail(NodeIndex n, int32_t count, std::vector<BlockId>* out) {
  Node& node = nodes_[n];
  const size_t keep = node.blocks.size() - static_cast<size_t>(count);
  for (size_t i = keep; i < node.blocks.size(); ++i) {
    out->push_back(node.blocks[i]);
    block_owner_[node.blocks[i]] = kNone;
  }
  if (record_events_ && count > 0) {
    CacheEvent ev;
    ev.kind = CacheEvent::Kind::kRemoved;
    ev.ns = node.ns;
    ev.block_ids.assign(node.blocks.begin() + static_cast<std::ptrdiff_t>(keep), node.blocks.end());
    events_.push_back(std::move(ev));
  }
  node.blocks.resize(keep);
  node.tokens.resize(keep * block_size_);
  num_cached_blocks_ -= count;
  stats_.num_evicted_blocks += static_cast<uint64_t>(count);
}

void RadixTree::remove_leaf(NodeIndex n) {
  const NodeIndex parent = nodes_[n].parent;
  unlink_child(parent, n);
  release_node(n);
  if (nodes_[parent].is_root && nodes_[parent].num_children == 0) {
    roots_.erase(nodes_[parent].ns);
    release_node(parent);
  }
}

int32_t RadixTree::trailing_sole_refs(NodeIndex n) const {
  const std::vector<BlockId>& blocks = nodes_[n].blocks;
  int32_t count = 0;
  for (auto it = blocks.rbegin(); it != blocks.rend() && allocator_->ref_count(*it) == 1; ++it) ++count;
  return count;
}

std::vector<RadixTree::NodeIndex> RadixTree::preorder() const {
  std::vector<NodeIndex> order;
  order.reserve(num_live_nodes_);
  std::vector<NodeIndex> stack;
  for (const auto& entry : roots_) stack.push_back(entry.second);
  while (!stack.empty()) {
    const NodeIndex n = stack.back();
    stack.pop_back();
    order.push_back(n);
    for (const auto& entry : nodes_[n].children) {
      for (NodeIndex c = entry.second; c != kNone; c = nodes_[c].next_same_key) stack.push_back(c);
    }
  }
  return order;
}

// ---- public operations -------------------------------------------------------------------------

MatchResult RadixTree::match(NamespaceId ns, const TokenId* tokens, size_t num_tokens) {
  MatchResult result;
  ++stats_.num_queries;
  stats_.num_query_tokens += num_tokens;
  const NodeIndex root = find_root(ns);
  if (root == kNone) return result;
  const int32_t n_full = full_blocks(num_tokens, block_size_);
  std::vector<NodeIndex> path;
  int32_t last_matched = 0;
  const int32_t matched = descend(root, tokens, n_full, &path, &last_matched);
  if (matched == 0) return result;
  const NodeIndex deepest = commit_path(root, &path, last_matched, ++clock_);
  result.block_ids.reserve(matched);
  for (NodeIndex n : path) {
    result.block_ids.insert(result.block_ids.end(), nodes_[n].blocks.begin(), nodes_[n].blocks.end());
  }
  result.num_tokens = matched * block_size_;
  result.handle = handle_of(deepest);
  stats_.num_hit_tokens += static_cast<uint64_t>(result.num_tokens);
  return result;
}

Status RadixTree::lock(NodeHandle handle) {
  if (handle.is_null()) return Status::Ok();
  const NodeIndex n = resolve(handle);
  if (n == kNone) return Status::InvalidArgument("lock: stale or unknown handle " + std::to_string(handle.value()));
  for (NodeIndex x = n; !nodes_[x].is_root; x = nodes_[x].parent) ++nodes_[x].lock_count;
  return Status::Ok();
}

Status RadixTree::unlock(NodeHandle handle) {
  if (handle.is_null()) return Status::Ok();
  const NodeIndex n = resolve(handle);
  if (n == kNone) return Status::InvalidArgument("unlock: stale or unknown handle " + std::to_string(handle.value()));
  if (nodes_[n].lock_count == 0) {
    return Status::InvalidArgument("unlock: the node of handle " + std::to_string(handle.value()) + " is not locked");
  }
  for (NodeIndex x = n; !nodes_[x].is_root; x = nodes_[x].parent) --nodes_[x].lock_count;
  return Status::Ok();
}

Status RadixTree::insert(NamespaceId ns, const TokenId* tokens, size_t num_tokens, const BlockId* block_ids,
                         size_t num_block_ids, InsertResult* out) {
  if (out == nullptr) return Status::InvalidArgument("insert: out is null");
  const int32_t n_full = full_blocks(num_tokens, block_size_);
  if (num_block_ids < static_cast<size_t>(n_full)) {
    return Status::InvalidArgument("insert: " + str(n_full) + " full blocks of tokens but only " + str(num_block_ids) +
                                   " block ids");
  }
  if (n_full == 0) {
    *out = InsertResult();
    return Status::Ok();
  }
  NodeIndex root = find_root(ns);
  std::vector<NodeIndex> path;
  int32_t last_matched = 0;
  const int32_t matched = root == kNone ? 0 : descend(root, tokens, n_full, &path, &last_matched);

  // Validate the new suffix before changing anything (kPending marks catch repeats).
  const int32_t num_blocks = allocator_->num_total_blocks();
  std::vector<BlockId> suffix(block_ids + matched, block_ids + n_full);
  auto unmark = [&](size_t upto) {
    for (size_t j = 0; j < upto; ++j) block_owner_[suffix[j]] = kNone;
  };
  for (size_t i = 0; i < suffix.size(); ++i) {
    const BlockId b = suffix[i];
    std::string bad;
    if (b < 0 || b >= num_blocks) {
      bad = "block id " + str(b) + " is outside [0, " + str(num_blocks) + ")";
    } else if (allocator_->ref_count(b) < 1) {
      bad = "block " + str(b) + " is free";
    } else if (block_owner_[b] == kPending) {
      bad = "block " + str(b) + " is listed twice";
    } else if (block_owner_[b] != kNone) {
      bad = "block " + str(b) + " is already cached for another prefix";
    }
    if (!bad.empty()) {
      unmark(i);
      return Status::InvalidArgument("insert: " + bad);
    }
    block_owner_[b] = kPending;
  }
  if (Status st = allocator_->incref(suffix); !st.ok()) {
    unmark(suffix.size());
    return st;
  }

  if (root == kNone) root = get_or_create_root(ns);
  const uint64_t tick = ++clock_;
  const NodeIndex deepest = commit_path(root, &path, last_matched, tick);
  InsertResult result;
  size_t i = 0;
  for (NodeIndex n : path) {
    for (BlockId b : nodes_[n].blocks) {
      if (block_ids[i] != b) result.duplicate_block_ids.push_back(block_ids[i]);
      ++i;
    }
  }
  if (!suffix.empty()) {
    const NodeIndex leaf = new_node(ns);
    Node& l = nodes_[leaf];
    l.tokens.assign(tokens + static_cast<size_t>(matched) * block_size_,
                    tokens + static_cast<size_t>(n_full) * block_size_);
    l.blocks = std::move(suffix);
    l.key = block_key(l.tokens.data());
    l.last_access = tick;
    link_child(deepest, leaf);
    for (BlockId b : nodes_[leaf].blocks) block_owner_[b] = leaf;
    if (record_events_) journal_stored(leaf);
    num_cached_blocks_ += n_full - matched;
    stats_.num_inserted_blocks += static_cast<uint64_t>(n_full - matched);
  }
  result.num_new_blocks = n_full - matched;
  *out = std::move(result);
  return Status::Ok();
}

void RadixTree::set_record_events(bool on) {
  record_events_ = on;
  if (!on) events_.clear();
}

void RadixTree::journal_cached() {
  if (!record_events_) return;
  for (NodeIndex n : preorder()) {  // parents first: each event's parent block is already stated
    if (!nodes_[n].is_root && !nodes_[n].blocks.empty()) journal_stored(n);
  }
}

void RadixTree::journal_stored(NodeIndex n) {
  const Node& node = nodes_[n];
  const Node& up = nodes_[node.parent];
  CacheEvent ev;
  ev.kind = CacheEvent::Kind::kStored;
  ev.ns = node.ns;
  ev.block_ids = node.blocks;
  ev.parent_block_id = up.is_root ? BlockId{-1} : up.blocks.back();
  ev.tokens = node.tokens;
  events_.push_back(std::move(ev));
}

std::vector<CacheEvent> RadixTree::take_events() {
  std::vector<CacheEvent> out;
  out.swap(events_);
  return out;
}

Status RadixTree::evict(int32_t num_blocks, int32_t* num_freed) {
  if (num_freed == nullptr) return Status::InvalidArgument("evict: num_freed is null");
  if (num_blocks < 0) return Status::InvalidArgument("evict: num_blocks must be >= 0, got " + str(num_blocks));
  *num_freed = 0;
  if (num_blocks == 0) return Status::Ok();
  using Entry = std::pair<uint64_t, NodeIndex>;  // (last_access, node): oldest on top
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> leaves;
  for (NodeIndex n = 0; n < static_cast<NodeIndex>(nodes_.size()); ++n) {
    const Node& node = nodes_[n];
    if (node.live && !node.is_root && node.num_children == 0 && node.lock_count == 0) {
      leaves.emplace(node.last_access, n);
    }
  }
  std::vector<BlockId> freed;
  int32_t remaining = num_blocks;
  while (remaining > 0 && !leaves.empty()) {
    const NodeIndex n = leaves.top().second;
    leaves.pop();
    const int32_t take = std::min(trailing_sole_refs(n), remaining);
    if (take == 0) continue;  // its tail block is shared: the leaf is pinned
    drop_tail(n, take, &freed);
    remaining -= take;
    if (!nodes_[n].blocks.empty()) continue;  // trimmed only
    const NodeIndex parent = nodes_[n].parent;
    const bool parent_is_root = nodes_[parent].is_root;
    remove_leaf(n);
    const Node& p = nodes_[parent];
    if (!parent_is_root && p.num_children == 0 && p.lock_count == 0) leaves.emplace(p.last_access, parent);
  }
  if (Status st = allocator_->free(freed); !st.ok()) return Status::Internal("evict: " + st.message());
  *num_freed = static_cast<int32_t>(freed.size());
  return Status::Ok();
}

Status RadixTree::clear(int32_t* num_dropped) {
  if (num_dropped == nullptr) return Status::InvalidArgument("clear: num_dropped is null");
  const std::vector<NodeIndex> order = preorder();
  std::vector<BlockId> dropped;
  // Children before parents; an unlocked node's subtree is all unlocked, so it is a leaf by then.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node& node = nodes_[*it];
    if (!node.live || node.is_root || node.lock_count > 0) continue;  // a root may be gone already
    drop_tail(*it, static_cast<int32_t>(node.blocks.size()), &dropped);
    remove_leaf(*it);
  }
  if (Status st = allocator_->free(dropped); !st.ok()) return Status::Internal("clear: " + st.message());
  *num_dropped = static_cast<int32_t>(dropped.size());
  return Status::Ok();
}

int32_t RadixTree::num_evictable_blocks() const {
  // Mirrors evict(infinity): a node's own trailing sole-reference blocks count once it is unlocked
  // and every child can go completely.
  const std::vector<NodeIndex> order = preorder();
  std::vector<char> children_go(nodes_.size(), 1);
  int32_t total = 0;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node& node = nodes_[*it];
    if (node.is_root) continue;
    const bool candidate = children_go[*it] && node.lock_count == 0;
    const int32_t sole = candidate ? trailing_sole_refs(*it) : 0;
    total += sole;
    if (!candidate || sole != static_cast<int32_t>(node.blocks.size())) children_go[node.parent] = 0;
  }
  return total;
}

Status RadixTree::check_invariants() const {
  auto fail = [](const std::string& m) { return Status::Internal("RadixTree invariant violated: " + m); };
  const int32_t num_blocks = allocator_->num_total_blocks();
  if (static_cast<int32_t>(block_owner_.size()) != num_blocks) return fail("block owner map has the wrong size");

  int32_t num_live = 0;
  for (const Node& node : nodes_) num_live += node.live ? 1 : 0;
  if (num_live != num_live_nodes_) return fail("num_nodes " + str(num_live_nodes_) + " != live slots " + str(num_live));
  std::vector<char> seen(nodes_.size(), 0);
  for (NodeIndex s : free_slots_) {
    if (s < 0 || s >= static_cast<NodeIndex>(nodes_.size()) || nodes_[s].live || seen[s]) {
      return fail("free slot list holds live, repeated or bad slot " + str(s));
    }
    seen[s] = 1;
  }
  if (free_slots_.size() + static_cast<size_t>(num_live) != nodes_.size()) return fail("slots leak");
  std::fill(seen.begin(), seen.end(), 0);

  std::vector<NodeIndex> stack;
  for (const auto& [ns, root] : roots_) {
    if (root < 0 || root >= static_cast<NodeIndex>(nodes_.size())) return fail("namespace root index is bad");
    const Node& r = nodes_[root];
    if (!r.live || !r.is_root || r.ns != ns || r.parent != kNone || !r.blocks.empty() || !r.tokens.empty() ||
        r.lock_count != 0) {
      return fail("root of namespace " + std::to_string(ns) + " is malformed");
    }
    if (r.num_children == 0) return fail("namespace " + std::to_string(ns) + " is empty but kept");
    stack.push_back(root);
  }
  int32_t reached = 0;
  int32_t cached = 0;
  while (!stack.empty()) {
    const NodeIndex n = stack.back();
    stack.pop_back();
    if (seen[n]) return fail("node " + str(n) + " is reachable twice");
    seen[n] = 1;
    ++reached;
    const Node& node = nodes_[n];
    if (!node.is_root) {
      const Node& p = nodes_[node.parent];
      if (node.blocks.empty()) return fail("node " + str(n) + " has an empty edge");
      if (node.tokens.size() != node.blocks.size() * block_size_) return fail("node " + str(n) + " edge length");
      if (node.key != block_key(node.tokens.data())) return fail("node " + str(n) + " key is stale");
      if (node.ns != p.ns) return fail("node " + str(n) + " is in another namespace than its parent");
      if (node.lock_count < 0) return fail("node " + str(n) + " has a negative lock count");
      if (!p.is_root && p.last_access < node.last_access) return fail("node " + str(n) + " is newer than its parent");
      for (BlockId b : node.blocks) {
        if (b < 0 || b >= num_blocks) return fail("node " + str(n) + " caches bad block id " + str(b));
        if (block_owner_[b] != n) return fail("block " + str(b) + " is cached twice or its owner entry is stale");
        if (allocator_->ref_count(b) < 1) return fail("cached block " + str(b) + " is free in the allocator");
        ++cached;
      }
    }
    int32_t num_children = 0;
    int64_t child_locks = 0;
    for (const auto& [key, first] : node.children) {
      for (NodeIndex c = first; c != kNone; c = nodes_[c].next_same_key) {
        if (c < 0 || c >= static_cast<NodeIndex>(nodes_.size()) || ++num_children > num_live) {
          return fail("child chain of node " + str(n) + " is broken");
        }
        const Node& ch = nodes_[c];
        if (!ch.live || ch.is_root || ch.parent != n || ch.key != key) {
          return fail("child " + str(c) + " of node " + str(n) + " has a bad parent, key or state");
        }
        for (NodeIndex d = ch.next_same_key; d != kNone && d >= 0 && d < static_cast<NodeIndex>(nodes_.size());
             d = nodes_[d].next_same_key) {
          if (d == c || same_block(nodes_[d].tokens.data(), ch.tokens.data())) {
            return fail("siblings " + str(c) + " and " + str(d) + " start with the same block");
          }
        }
        child_locks += ch.lock_count;
        stack.push_back(c);
      }
    }
    if (num_children != node.num_children) return fail("node " + str(n) + " child count is stale");
    if (!node.is_root && node.lock_count < child_locks) {
      return fail("node " + str(n) + " lock count " + str(node.lock_count) + " < its children's " + str(child_locks));
    }
  }
  if (reached != num_live) return fail(str(num_live - reached) + " live nodes are unreachable");
  int32_t owned = 0;
  for (NodeIndex owner : block_owner_) owned += owner != kNone ? 1 : 0;
  if (cached != num_cached_blocks_ || owned != cached) {
    return fail("num_cached_blocks " + str(num_cached_blocks_) + ", blocks in nodes " + str(cached) +
                ", owner entries " + str(owned));
  }
  if (stats_.num_inserted_blocks - stats_.num_evicted_blocks != static_cast<uint64_t>(cached)) {
    return fail("inserted - evicted blocks != cached blocks");
  }
  return allocator_->check_invariants();
}

}  // namespace trillium
