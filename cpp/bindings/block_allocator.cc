// Python binding of trillium::BlockAllocator.
//
// Errors follow the Status mapping of status.h (OutOfBlocksError, ValueError, InvariantError).
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
#include "py_block_allocator.h"

namespace py = pybind11;

namespace trillium::bindings {
void bind_block_allocator(py::module_& m) {
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
