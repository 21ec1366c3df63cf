// Python binding of trillium::BlockAllocator.
//
// Error mapping (one Python type per StatusCode):
//   kOutOfBlocks     -> trillium._core.OutOfBlocksError (subclass of MemoryError)
//   kInvalidArgument -> ValueError
//   kInternal        -> trillium._core.InvariantError (subclass of AssertionError and RuntimeError)
//
// Calls that walk lists or the whole allocator release the GIL. Because of that, every call takes
// the wrapper's mutex (never while waiting for the GIL), so two Python threads can never mutate the
// allocator at once.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.h"
#include "trillium/block_allocator.h"

namespace py = pybind11;

namespace trillium::bindings {
namespace {

struct OutOfBlocksError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct InvariantError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws the C++ exception registered for st's code; pybind11 translates it once the GIL is back.
void raise_if_error(const Status& st) {
  switch (st.code()) {
    case StatusCode::kOk:
      return;
    case StatusCode::kOutOfBlocks:
      throw OutOfBlocksError(st.message());
    case StatusCode::kInvalidArgument:
      throw std::invalid_argument(st.message());
    case StatusCode::kInternal:
      throw InvariantError(st.message());
  }
  throw std::runtime_error(st.message());
}

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

 private:
  std::mutex mu_;
  BlockAllocator alloc_;
};

}  // namespace

void bind_block_allocator(py::module_& m) {
  py::register_exception<OutOfBlocksError>(m, "OutOfBlocksError", PyExc_MemoryError);
  py::register_exception<InvariantError>(
      m, "InvariantError", py::make_tuple(py::handle(PyExc_AssertionError), py::handle(PyExc_RuntimeError)));

  using Self = PyBlockAllocator;
  using release = py::call_guard<py::gil_scoped_release>;
  py::class_<Self>(m, "BlockAllocator",
                   "Ref-counted KV block ids [0, num_blocks) with an O(1) intrusive free list.\n\n"
                   "Not a memory allocator: it hands out integer block ids only.")
      .def(py::init<int32_t>(), py::arg("num_blocks"), "All blocks start free. ValueError if num_blocks < 0.")
      .def("allocate", &Self::allocate, py::arg("n"), release(),
           "Take n free blocks (ref count 1 each) and return their ids. All-or-nothing: raises "
           "OutOfBlocksError and changes nothing when fewer than n are free; ValueError if n < 0.")
      .def("can_allocate", &Self::can_allocate, py::arg("n"), "True iff allocate(n) would succeed now.")
      .def("incref", &Self::incref, py::arg("block_ids"), release(),
           "Add one reference per listed id. ValueError (and no change) on a bad id or a free block.")
      .def("free", &Self::free, py::arg("block_ids"), release(),
           "Drop one reference per listed id; blocks reaching 0 return to the free list in reverse order "
           "of block_ids (tails are reused first). ValueError (and no change) on a bad id or double free.")
      .def("ref_count", &Self::ref_count, py::arg("block_id"), "Ref count of a block; ValueError on a bad id.")
      .def_property_readonly("num_free_blocks", &Self::num_free_blocks)
      .def_property_readonly("num_total_blocks", &Self::num_total_blocks)
      .def_property_readonly("num_used_blocks", &Self::num_used_blocks)
      .def("check_invariants", &Self::check_invariants, release(),
           "O(num_blocks) self-check; raises InvariantError naming the first violation.");
}

}  // namespace trillium::bindings
