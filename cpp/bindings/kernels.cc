// Python binding of the CPU kernels (trillium/kernels/*.h).
//
// Tensors arrive as plain integers: data pointers, sizes, strides (in elements) and dtype codes
// (0 float32, 1 bfloat16), grouped into tuples. The typed wrappers in python/trillium/ops/ check
// shapes, dtypes, devices and contiguity once and build these tuples; the C++ side validates sizes,
// lengths and block ids (ValueError, nothing written). Every kernel releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "trillium/kernels/kv_store.h"
#include "trillium/kernels/paged_attention.h"

namespace py = pybind11;

namespace trillium::bindings {
namespace {

// (data_ptr, num_heads, stride_token, stride_head, dtype)
using RowsSpec = std::tuple<std::uintptr_t, int32_t, int64_t, int64_t, int32_t>;
// (k_ptr, v_ptr, dtype, num_blocks, block_size, num_kv_heads, head_dim)
using CacheSpec = std::tuple<std::uintptr_t, std::uintptr_t, int32_t, int32_t, int32_t, int32_t, int32_t>;
// (num_requests, num_tokens, query_start_loc_ptr, context_lens_ptr, block_tables_ptr, block_table_stride)
using BatchSpec = std::tuple<int32_t, int64_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, int64_t>;

void raise_if_error(const Status& st) {
  if (!st.ok()) throw std::invalid_argument(st.message());
}

DType to_dtype(int32_t code) {
  const auto t = static_cast<DType>(code);
  if (!valid_dtype(t)) throw std::invalid_argument("unknown dtype code " + std::to_string(code));
  return t;
}

template <class T>
T* ptr(std::uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

void paged_attention(const RowsSpec& query, const RowsSpec& out, const CacheSpec& cache, const BatchSpec& batch,
                     float scale, int num_threads, bool decode) {
  PagedAttentionArgs a;
  a.query = ptr<const void>(std::get<0>(query));
  a.num_q_heads = std::get<1>(query);
  a.query_stride_token = std::get<2>(query);
  a.query_stride_head = std::get<3>(query);
  a.query_dtype = to_dtype(std::get<4>(query));
  if (std::get<1>(out) != a.num_q_heads) throw std::invalid_argument("paged_attention: out and query head counts differ");
  a.out = ptr<void>(std::get<0>(out));
  a.out_stride_token = std::get<2>(out);
  a.out_stride_head = std::get<3>(out);
  a.out_dtype = to_dtype(std::get<4>(out));
  a.k_cache = ptr<const void>(std::get<0>(cache));
  a.v_cache = ptr<const void>(std::get<1>(cache));
  a.kv_dtype = to_dtype(std::get<2>(cache));
  a.num_blocks = std::get<3>(cache);
  a.block_size = std::get<4>(cache);
  a.num_kv_heads = std::get<5>(cache);
  a.head_dim = std::get<6>(cache);
  a.num_requests = std::get<0>(batch);
  a.num_tokens = std::get<1>(batch);
  a.query_start_loc = ptr<const int32_t>(std::get<2>(batch));
  a.context_lens = ptr<const int32_t>(std::get<3>(batch));
  a.block_tables = ptr<const int32_t>(std::get<4>(batch));
  a.block_table_stride = std::get<5>(batch);
  a.scale = scale;
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
  KVStoreArgs a;
  a.key = ptr<const void>(std::get<0>(key));
  a.key_stride_token = std::get<2>(key);
  a.key_stride_head = std::get<3>(key);
  a.value = ptr<const void>(std::get<0>(value));
  a.value_stride_token = std::get<2>(value);
  a.value_stride_head = std::get<3>(value);
  a.src_dtype = to_dtype(std::get<4>(key));
  if (std::get<4>(value) != std::get<4>(key)) throw std::invalid_argument("store_kv: key and value dtypes differ");
  a.k_cache = ptr<void>(std::get<0>(cache));
  a.v_cache = ptr<void>(std::get<1>(cache));
  a.cache_dtype = to_dtype(std::get<2>(cache));
  a.num_blocks = std::get<3>(cache);
  a.block_size = std::get<4>(cache);
  a.num_kv_heads = std::get<5>(cache);
  a.head_dim = std::get<6>(cache);
  if (std::get<1>(key) != a.num_kv_heads || std::get<1>(value) != a.num_kv_heads) {
    throw std::invalid_argument("store_kv: key/value head counts differ from the cache's");
  }
  a.slot_mapping = ptr<const int64_t>(slot_mapping);
  a.num_tokens = num_tokens;
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
