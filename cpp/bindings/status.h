// The one trillium::Status -> Python exception mapping, used by every _core binding:
//
//   kOk              -> returns
//   kInvalidArgument -> ValueError                    (std::invalid_argument)
//   kOutOfBlocks     -> trillium._core.OutOfBlocksError (subclass of MemoryError)
//   kInternal        -> trillium._core.InvariantError   (subclass of AssertionError and RuntimeError)
//
// raise_if_error throws the C++ exception; pybind11 translates it to the Python type once the GIL
// is back, so it may be called with the GIL released (and under a binding's own mutex).
// bind_status (status.cc) registers the two exception types once, before any other binding.
#pragma once

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <utility>

#include "trillium/status.h"

namespace trillium::bindings {

struct OutOfBlocksError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct InvariantError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws the exception mapped to st's code (see above); returns when st is ok.
inline void raise_if_error(const Status& st) {
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

// Runs fn() (returning a Status) with the GIL released -- the kernels and long walks must not hold
// it -- then raises its status. fn must not touch Python objects.
template <class Fn>
void run_without_gil(Fn&& fn) {
  Status st;
  {
    pybind11::gil_scoped_release release;
    st = std::forward<Fn>(fn)();
  }
  raise_if_error(st);
}

}  // namespace trillium::bindings
