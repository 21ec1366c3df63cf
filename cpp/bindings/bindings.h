// Registration functions, one per bound header; module.cc calls them in order, bind_status first
// (it registers the exception types every other binding raises).
#pragma once

#include <pybind11/pybind11.h>

namespace trillium::bindings {

void bind_status(pybind11::module_& m);
void bind_cpu_isa(pybind11::module_& m);
void bind_block_allocator(pybind11::module_& m);
void bind_radix_tree(pybind11::module_& m);
void bind_kernels(pybind11::module_& m);
void bind_quant_linear(pybind11::module_& m);
void bind_layer_ops(pybind11::module_& m);
void bind_decoder_layer(pybind11::module_& m);
void bind_token_bitmask(pybind11::module_& m);
void bind_spec_verify(pybind11::module_& m);

}  // namespace trillium::bindings
