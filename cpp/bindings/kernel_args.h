// What every kernel binding shares, in both modules (_core and _cuda): addresses (Python ints from
// tensor.data_ptr()) as typed pointers, dtype and activation codes as enums, and the pybind11 caster
// that reads a spec struct from a Python object BY FIELD NAME (the NamedTuples of
// python/trillium/ops/kernel_specs.py). Positional tuples are not accepted: a spec whose fields
// are reordered on one side would otherwise be misread without an error.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "trillium/kernels/dtype.h"
#include "trillium/kernels/layer_ops.h"

namespace trillium::bindings {

// The address `address` (0 for "none") as a T*.
template <class T>
T* from_address(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// A dtype code (trillium::DType: 0 float32, 1 bfloat16). std::invalid_argument (ValueError) for
// any other code.
inline DType to_dtype(int32_t code) {
  const auto t = static_cast<DType>(code);
  if (!valid_dtype(t)) throw std::invalid_argument("unknown dtype code " + std::to_string(code));
  return t;
}

// A gated-MLP activation code (trillium::GatedActivation: 0 SiLU, 1 GELU-tanh). std::invalid_argument
// (ValueError) for any other code.
inline GatedActivation to_activation(int32_t code) {
  if (code != static_cast<int32_t>(GatedActivation::kSilu) && code != static_cast<int32_t>(GatedActivation::kGeluTanh)) {
    throw std::invalid_argument("activation is 0 (SiLU) or 1 (GELU-tanh), got " + std::to_string(code));
  }
  return static_cast<GatedActivation>(code);
}

// Reads attribute `name` of `src` into *out through pybind11's caster for T. Returns false, with
// the Python error cleared, when the attribute is missing or does not convert: the spec caster then
// declines the argument and pybind11 raises its usual TypeError naming the expected types.
template <class T>
bool load_field(pybind11::handle src, PyObject* name, bool convert, T* out) {
  PyObject* raw = PyObject_GetAttr(src.ptr(), name);
  if (raw == nullptr) {
    PyErr_Clear();
    return false;
  }
  const auto attr = pybind11::reinterpret_steal<pybind11::object>(raw);
  pybind11::detail::make_caster<T> caster;
  if (!caster.load(attr, convert)) return false;
  *out = pybind11::detail::cast_op<T>(caster);
  return true;
}

// pybind11 caster for a spec struct Spec that has `static constexpr char kPyName[]` (the Python
// class name shown in signatures) and `static bool load(handle, bool convert, Spec*)`. Specs only
// travel Python -> C++, so there is no C++ -> Python cast. Runs with the GIL held, before any
// call_guard releases it.
template <class Spec>
struct SpecCaster {
  PYBIND11_TYPE_CASTER(Spec, pybind11::detail::const_name(Spec::kPyName));
  bool load(pybind11::handle src, bool convert) { return Spec::load(src, convert, &value); }
};

}  // namespace trillium::bindings

// Loads spec.field from the Python attribute of the same name, so the C++ member name is the
// Python field name. The name is interned once per use site (first call, GIL held) and kept for the
// life of the process: a call then costs one attribute lookup per field, no string building.
#define TRILLIUM_LOAD_FIELD(src, convert, spec, field)                                               \
  ::trillium::bindings::load_field(                                                                  \
      (src), [] { static PyObject* const name = PyUnicode_InternFromString(#field); return name; }(), \
      (convert), &(spec).field)

// Declares the pybind11 caster of a spec struct (at global scope).
#define TRILLIUM_SPEC_CASTER(Spec)                                                  \
  namespace pybind11::detail {                                                      \
  template <>                                                                       \
  struct type_caster<Spec> : ::trillium::bindings::SpecCaster<Spec> {};             \
  }
