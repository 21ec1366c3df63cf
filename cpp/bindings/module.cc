// trillium._core: the compiled core. The only translation units that include pybind11 live in
// cpp/bindings/; everything they bind is framework-free code from cpp/include/trillium/.
#include <pybind11/pybind11.h>

#include "bindings.h"

#ifndef TRILLIUM_VERSION
#define TRILLIUM_VERSION "0.0.0"
#endif

PYBIND11_MODULE(_core, m) {
  m.doc() = "trillium compiled core: block allocator, CPU paged-attention and KV-store kernels";
  m.attr("__version__") = TRILLIUM_VERSION;
  trillium::bindings::bind_status(m);
  trillium::bindings::bind_cpu_isa(m);
  trillium::bindings::bind_block_allocator(m);
  trillium::bindings::bind_radix_tree(m);
  trillium::bindings::bind_kernels(m);
  trillium::bindings::bind_quant_linear(m);
  trillium::bindings::bind_layer_ops(m);
  trillium::bindings::bind_decoder_layer(m);
  trillium::bindings::bind_token_bitmask(m);
  trillium::bindings::bind_spec_verify(m);
}
