// Python binding of the CPU attention and KV-store kernels (trillium/kernels/paged_attention.h,
// kv_store.h).
//
// Tensors arrive as plain integers: data pointers, sizes, strides (in elements) and dtype codes
// (0 float32, 1 bfloat16), grouped into the named specs of kernel_specs.h (RowsSpec, CacheSpec,
// BatchSpec). The typed wrappers in python/trillium/ops/ check shapes, dtypes, devices and
// contiguity once and build those specs; the C++ side validates sizes, lengths and block ids
// (ValueError, nothing written). Every kernel releases the GIL.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "bindings.h"
#include "kernel_specs.h"
#include "status.h"
#include "trillium/kernels/kv_store.h"
#include "trillium/kernels/paged_attention.h"

namespace py = pybind11;

namespace trillium::bindings {
namespace {

void paged_attention(const RowsSpec& query, const RowsSpec& out, const CacheSpec& cache, const BatchSpec& batch,
                     float scale, int num_threads, bool decode, int32_t window, float softcap) {
  PagedAttentionArgs a = attention_args(query, out, cache, batch, scale);
  a.num_threads = num_threads;
  a.window = window;
  a.softcap = softcap;
  run_without_gil([&] { return decode ? paged_attention_decode(a) : paged_attention_extend(a); });
}

void store_kv_binding(const RowsSpec& key, const RowsSpec& value, const CacheSpec& cache, std::uintptr_t slot_mapping,
                      int64_t num_tokens, int num_threads) {
  KVStoreArgs a = store_args(key, value, cache, slot_mapping, num_tokens);
  a.num_threads = num_threads;
  run_without_gil([&] { return store_kv(a); });
}

}  // namespace

void bind_kernels(py::module_& m) {
  m.def("paged_attention", &paged_attention, py::arg("query"), py::arg("out"), py::arg("cache"), py::arg("batch"),
        py::arg("scale"), py::arg("num_threads"), py::arg("decode"), py::arg("window") = 0,
        py::arg("softcap") = 0.0f,
        "Paged attention over one layer's KV pool (see trillium/kernels/paged_attention.h).\n\n"
        "query/out: RowsSpec(data_ptr, num_heads, stride_token, stride_head, dtype); cache: CacheSpec(k_ptr, "
        "v_ptr, dtype, num_blocks, block_size, num_kv_heads, head_dim); batch: BatchSpec(num_requests, "
        "num_tokens, query_start_loc_ptr int32 [R+1] (extend only), context_lens_ptr int32 [R], "
        "block_tables_ptr int32, block_table_stride) -- trillium.ops.kernel_specs. dtype codes: 0 float32, "
        "1 bfloat16. decode=True needs one token per request. window > 0: sliding-window attention (a token at "
        "position p sees keys (p - window, p]); softcap > 0: scores capped as softcap * tanh(s / softcap). Releases the GIL; ValueError (nothing "
        "written) on bad sizes, lengths or block ids.");
  m.def("store_kv", &store_kv_binding, py::arg("key"), py::arg("value"), py::arg("cache"), py::arg("slot_mapping"),
        py::arg("num_tokens"), py::arg("num_threads"),
        "Write key/value rows (RowsSpec) into their slots (int64 slot_mapping pointer, negative = skip) of "
        "the cache (CacheSpec, as paged_attention). Releases the GIL; ValueError (nothing written) on a "
        "slot out of range.");
}

}  // namespace trillium::bindings
