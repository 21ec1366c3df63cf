// Registers the exception types of the Status mapping (status.h) on trillium._core.
#include "status.h"

#include <pybind11/pybind11.h>

#include "bindings.h"

namespace py = pybind11;

namespace trillium::bindings {

void bind_status(py::module_& m) {
  py::register_exception<OutOfBlocksError>(m, "OutOfBlocksError", PyExc_MemoryError);
  py::register_exception<InvariantError>(
      m, "InvariantError", py::make_tuple(py::handle(PyExc_AssertionError), py::handle(PyExc_RuntimeError)));
}

}  // namespace trillium::bindings
