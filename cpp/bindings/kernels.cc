// Python binding of the CPU kernels (trillium/kernels/*.h).
//
// Tensors arrive as plain integers: data pointers, sizes, strides (in elements) and dtype codes
// (0 float32, 1 bfloat16), grouped into tuples (kernel_specs.h). The typed wrappers in
// python/trillium/ops/ check shapes, dtypes, devices and contiguity once and build these tuples;
// the C++ side validates sizes, lengths and block ids (ValueError, nothing written). Every kernel
// releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.h"
#include "kernel_specs.h"
#include "trillium/kernels/kv_store.h"
#include "trillium/kernels/paged_attention.h"

namespace py = pybind11;

namespace trillium::bindings {
namespace {

void raise_if_error(const Status& st) {
  if (!st.ok()) throw std::invalid_argument(st.message());
}

void paged_attention(const RowsSpec& query, const RowsSpec& out, const CacheSpec& cache, const BatchSpec& batch,
                     float scale, int num_threads, bool decode) {
  PagedAttentionArgs a = attention_args(query, out, cache, batch, scale);
  a.num_threads = num_threads;
  Status st;
  {
    py::gil_scoped_release release;
    st = decode ? paged_attention_decode(a) : paged_attention_extend(a);
  }
  raise_if_error(st);
}

void store_kv_binding(const RowsSpec& key, const RowsSpec& value, const CacheSpec& cache, std::uintptr_t slot_mapping,
                      int64_t num_tokens, int num_threads) {
  KVStoreArgs a = store_args(key, value, cache, slot_mapping, num_tokens);
  a.num_threads = num_threads;
  Status st;
  {
    py::gil_scoped_release release;
    st = store_kv(a);
  }
  raise_if_error(st);
}

KernelIsa isa_from_name(const std::string& name) {
  for (KernelIsa isa : {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (name == kernel_isa_name(isa)) return isa;
  }
  throw std::invalid_argument("unknown kernel ISA '" + name + "' (portable, avx2, avx512)");
}

}  // namespace

void bind_kernels(py::module_& m) {
  m.def("paged_attention", &paged_attention, py::arg("query"), py::arg("out"), py::arg("cache"), py::arg("batch"),
        py::arg("scale"), py::arg("num_threads"), py::arg("decode"),
        "Paged attention over one layer's KV pool (see trillium/kernels/paged_attention.h).\n\n"
        "query/out: (data_ptr, num_heads, stride_token, stride_head, dtype); cache: (k_ptr, v_ptr, dtype, "
        "num_blocks, block_size, num_kv_heads, head_dim); batch: (num_requests, num_tokens, query_start_loc_ptr "
        "int32 [R+1] (extend only), context_lens_ptr int32 [R], block_tables_ptr int32, block_table_stride). "
        "dtype codes: 0 float32, 1 bfloat16. decode=True needs one token per request. Releases the GIL; "
        "ValueError (nothing written) on bad sizes, lengths or block ids.");
  m.def("store_kv", &store_kv_binding, py::arg("key"), py::arg("value"), py::arg("cache"), py::arg("slot_mapping"),
        py::arg("num_tokens"), py::arg("num_threads"),
        "Write key/value rows (data_ptr, num_heads, stride_token, stride_head, dtype) into their slots "
        "(int64 slot_mapping pointer, negative = skip) of the cache (same tuple as paged_attention). "
        "Releases the GIL; ValueError (nothing written) on a slot out of range.");
  m.def("kernel_isa", [] { return std::string(kernel_isa_name(kernel_isa())); },
        "Instruction set the CPU kernels use now: 'avx512', 'avx2' or 'portable'.");
  m.def(
      "supported_kernel_isas",
      [] {
        std::vector<std::string> out;
        for (KernelIsa isa : {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
          if (kernel_isa_supported(isa)) out.emplace_back(kernel_isa_name(isa));
        }
        return out;
      },
      "Instruction sets this CPU and build can run, worst first.");
  m.def(
      "set_kernel_isa", [](const std::string& name) { raise_if_error(set_kernel_isa(isa_from_name(name))); },
      py::arg("name"),
      "Force the CPU kernels onto one instruction set (tests, benchmarks). ValueError if unsupported here. "
      "Process-wide; do not call while kernels run on other threads.");
}

}  // namespace trillium::bindings
