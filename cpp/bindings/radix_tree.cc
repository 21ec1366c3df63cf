// Python binding of trillium::RadixTree (the prefix cache).
//
// The tree increfs and frees blocks of the BlockAllocator it was built with, so both share ONE
// mutex: every tree call takes the allocator wrapper's mutex, and a tree call and an allocator call
// from two Python threads never interleave. As in block_allocator.cc, the mutex is never held while
// waiting for the GIL: arguments are converted before it is taken and results after it is dropped.
// match/insert/evict/clear and the O(nodes) queries run with the GIL released.
//
// Namespaces are Python ints taken modulo 2**64 (so hash() values, negative ones included, work).
// Errors: ValueError for bad input (stale handle, bad block ids), InvariantError from
// check_invariants().
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bindings.h"
#include "py_block_allocator.h"
#include "status.h"
#include "trillium/radix_tree.h"

namespace py = pybind11;

namespace trillium::bindings {
namespace {

NamespaceId to_namespace(const py::int_& ns) {
  const unsigned long long v = PyLong_AsUnsignedLongLongMask(ns.ptr());
  if (PyErr_Occurred()) throw py::error_already_set();
  return static_cast<NamespaceId>(v);
}

std::string handle_repr(NodeHandle h) { return std::to_string(h.value()); }

// A list/tuple of ints -> int32 vector. The hot argument (2k-token prompts): pybind11's generic
// list caster costs ~30 ns per item, this ~3. ValueError naming the first id outside int32.
std::vector<int32_t> to_int32s(const py::handle& obj, const char* what) {
  PyObject* seq = PySequence_Fast(obj.ptr(), what);
  if (seq == nullptr) throw py::error_already_set();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long v = PyLong_AsLongLong(items[i]);
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      throw py::error_already_set();
    }
    if (v < INT32_MIN || v > INT32_MAX) {
      Py_DECREF(seq);
      throw std::invalid_argument(std::string(what) + ": " + std::to_string(v) + " at index " + std::to_string(i) +
                                  " does not fit int32");
    }
    out[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  Py_DECREF(seq);
  return out;
}

class PyRadixTree {
 public:
  PyRadixTree(PyBlockAllocator& allocator, int32_t block_size)
      : owner_(&allocator), tree_(std::make_unique<RadixTree>(&allocator.core(), block_size)) {}

  ~PyRadixTree() {  // drops the tree's block references under the allocator's mutex
    std::lock_guard<std::mutex> lock(owner_->mutex());
    tree_.reset();
  }

  MatchResult match(const py::int_& ns, const py::object& token_list, bool lock) {
    const NamespaceId id = to_namespace(ns);
    const std::vector<TokenId> tokens = to_int32s(token_list, "tokens must be a sequence of int32 token ids");
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> guard(owner_->mutex());
    MatchResult result = tree_->match(id, tokens);
    if (lock) raise_if_error(tree_->lock(result.handle));
    return result;
  }

  InsertResult insert(const py::int_& ns, const py::object& token_list, const py::object& block_list) {
    const NamespaceId id = to_namespace(ns);
    const std::vector<TokenId> tokens = to_int32s(token_list, "tokens must be a sequence of int32 token ids");
    const std::vector<BlockId> block_ids = to_int32s(block_list, "block_ids must be a sequence of int32 block ids");
    py::gil_scoped_release release;
    InsertResult result;
    std::lock_guard<std::mutex> guard(owner_->mutex());
    raise_if_error(tree_->insert(id, tokens, block_ids, &result));
    return result;
  }

  void lock(uint64_t handle) {
    std::lock_guard<std::mutex> guard(owner_->mutex());
    raise_if_error(tree_->lock(NodeHandle::from_value(handle)));
  }
  void unlock(uint64_t handle) {
    std::lock_guard<std::mutex> guard(owner_->mutex());
    raise_if_error(tree_->unlock(NodeHandle::from_value(handle)));
  }
  int32_t evict(int32_t num_blocks) {
    int32_t freed = 0;
    std::lock_guard<std::mutex> guard(owner_->mutex());
    raise_if_error(tree_->evict(num_blocks, &freed));
    return freed;
  }
  int32_t clear() {
    int32_t dropped = 0;
    std::lock_guard<std::mutex> guard(owner_->mutex());
    raise_if_error(tree_->clear(&dropped));
    return dropped;
  }
  std::vector<CacheEvent> take_events() {
    std::lock_guard<std::mutex> guard(owner_->mutex());
    return tree_->take_events();
  }
  void journal_cached() {
    std::lock_guard<std::mutex> guard(owner_->mutex());
    tree_->journal_cached();
  }
  void set_record_events(bool on) {
    std::lock_guard<std::mutex> guard(owner_->mutex());
    tree_->set_record_events(on);
  }
  void check_invariants() {
    std::lock_guard<std::mutex> guard(owner_->mutex());
    raise_if_error(tree_->check_invariants());
  }

  // Every read goes through here, under the mutex.
  template <typename F>
  auto read(F f) {
    std::lock_guard<std::mutex> guard(owner_->mutex());
    return f(*tree_);
  }

 private:
  PyBlockAllocator* owner_;  // kept alive by py::keep_alive
  std::unique_ptr<RadixTree> tree_;
};

}  // namespace

void bind_radix_tree(py::module_& m) {
  using release = py::call_guard<py::gil_scoped_release>;

  py::class_<MatchResult>(m, "MatchResult", "The longest cached prefix found by RadixTree.match().")
      .def_readonly("block_ids", &MatchResult::block_ids, "Cached blocks of the prefix, in order.")
      .def_readonly("num_tokens", &MatchResult::num_tokens, "Matched tokens, a multiple of block_size.")
      .def_property_readonly(
          "handle", [](const MatchResult& r) { return r.handle.value(); },
          "Names the deepest matched node for lock()/unlock(); 0 when nothing matched.")
      .def("__repr__", [](const MatchResult& r) {
        return "MatchResult(num_tokens=" + std::to_string(r.num_tokens) + ", num_blocks=" +
               std::to_string(r.block_ids.size()) + ", handle=" + handle_repr(r.handle) + ")";
      });

  py::class_<InsertResult>(m, "InsertResult", "What RadixTree.insert() adopted.")
      .def_readonly("num_new_blocks", &InsertResult::num_new_blocks,
                    "Caller blocks the tree adopted (one tree reference each) for the new suffix.")
      .def_readonly("duplicate_block_ids", &InsertResult::duplicate_block_ids,
                    "Caller blocks for positions already cached under a different block; not adopted.")
      .def("__repr__", [](const InsertResult& r) {
        return "InsertResult(num_new_blocks=" + std::to_string(r.num_new_blocks) +
               ", num_duplicates=" + std::to_string(r.duplicate_block_ids.size()) + ")";
      });

  py::class_<CacheEvent>(m, "CacheEvent", "One journalled prefix-cache change (RadixTree.take_events()).")
      .def_property_readonly(
          "kind", [](const CacheEvent& e) { return e.kind == CacheEvent::Kind::kStored ? "stored" : "removed"; },
          "'stored' (insert adopted these blocks) or 'removed' (evict/clear dropped them).")
      .def_property_readonly("namespace", [](const CacheEvent& e) { return e.ns; })
      .def_readonly("block_ids", &CacheEvent::block_ids, "The blocks, in sequence order.")
      .def_readonly("parent_block_id", &CacheEvent::parent_block_id,
                    "stored: the cached block just before block_ids[0] in its sequence; -1 at the start.")
      .def_readonly("tokens", &CacheEvent::tokens, "stored: the blocks' tokens (len(block_ids) * block_size).")
      .def("__repr__", [](const CacheEvent& e) {
        return std::string("CacheEvent(") + (e.kind == CacheEvent::Kind::kStored ? "stored" : "removed") +
               ", blocks=" + std::to_string(e.block_ids.size()) + ", parent=" + std::to_string(e.parent_block_id) + ")";
      });

  using Self = PyRadixTree;
  auto get = [](auto read_tree) { return [read_tree](Self& self) { return self.read(read_tree); }; };
  auto stat = [get](uint64_t RadixTreeStats::*field) {
    return get([field](const RadixTree& t) { return t.stats().*field; });
  };
  py::class_<Self>(m, "RadixTree",
                   "Prefix cache: a block-aligned radix tree over token ids, per namespace.\n\n"
                   "Holds one allocator reference per cached block; see docs/decisions/prefix-cache.md.")
      .def(py::init<PyBlockAllocator&, int32_t>(), py::arg("allocator"), py::arg("block_size"),
           py::keep_alive<1, 2>(), "ValueError if block_size < 1.")
      .def("match", &Self::match, py::arg("namespace"), py::arg("tokens"), py::kw_only(), py::arg("lock") = false,
           "Longest cached prefix of tokens (whole blocks only) in the namespace. Stamps the path as most "
           "recently used and may split a node. Adds no reference; lock=True also locks the handle under "
           "the same mutex (the blocks stay cached until unlock).")
      .def("lock", &Self::lock, py::arg("handle"),
           "Lock the handle's node and its ancestors against eviction (counted). 0: no-op; stale: ValueError.")
      .def("unlock", &Self::unlock, py::arg("handle"),
           "Undo one lock(). 0: no-op; a stale handle or a node that is not locked: ValueError.")
      .def("insert", &Self::insert, py::arg("namespace"), py::arg("tokens"), py::arg("block_ids"),
           "Cache the full blocks of tokens; block_ids[i] holds tokens [i*bs, (i+1)*bs) and needs at least "
           "len(tokens) // block_size entries. The cached prefix keeps the tree's blocks; the new suffix's "
           "blocks get one tree reference each (the caller keeps its own). All-or-nothing ValueError on "
           "a bad, free, repeated or already cached suffix block.")
      .def("evict", &Self::evict, py::arg("num_blocks"), release(),
           "Free up to num_blocks blocks to the allocator: LRU unlocked leaves first, tail blocks first, "
           "skipping blocks referenced elsewhere. Returns how many were freed.")
      .def("clear", &Self::clear, release(),
           "Drop every unlocked node; returns the number of blocks the tree released.")
      .def("take_events", &Self::take_events,
           "The journal of stored/removed blocks since the last call, oldest first (empty unless "
           "record_events is on).")
      .def("journal_cached", &Self::journal_cached,
           "Journal the whole cache as 'stored' events, parents first (for a subscriber starting from "
           "an empty view); no-op unless record_events is on.")
      .def_property(
          "record_events", get([](const RadixTree& t) { return t.record_events(); }), &Self::set_record_events,
          "Journal every stored/removed block for take_events() (off by default; off drops the journal).")
      .def("check_invariants", &Self::check_invariants, release(),
           "Tree and allocator self-check; raises InvariantError naming the first violation.")
      .def_property_readonly("block_size", get([](const RadixTree& t) { return t.block_size(); }))
      .def_property_readonly("num_cached_blocks", get([](const RadixTree& t) { return t.num_cached_blocks(); }))
      .def_property_readonly(
          "num_evictable_blocks",
          py::cpp_function(get([](const RadixTree& t) { return t.num_evictable_blocks(); }), release()),
          "What evict() could free now (O(nodes)).")
      .def_property_readonly("num_nodes", get([](const RadixTree& t) { return t.num_nodes(); }),
                             "Live tree nodes, namespace roots included.")
      .def_property_readonly("num_namespaces", get([](const RadixTree& t) { return t.num_namespaces(); }))
      .def_property_readonly("num_queries", stat(&RadixTreeStats::num_queries))
      .def_property_readonly("num_query_tokens", stat(&RadixTreeStats::num_query_tokens))
      .def_property_readonly("num_hit_tokens", stat(&RadixTreeStats::num_hit_tokens))
      .def_property_readonly("num_inserted_blocks", stat(&RadixTreeStats::num_inserted_blocks))
      .def_property_readonly("num_evicted_blocks", stat(&RadixTreeStats::num_evicted_blocks));
}

}  // namespace trillium::bindings
