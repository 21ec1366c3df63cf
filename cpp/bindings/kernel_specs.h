// Tuple -> argument-struct conversion shared by the CPU (kernels.cc) and CUDA (cuda/bindings.cc)
// kernel bindings, so both modules take the same Python-side tuples:
//
//   rows  (query, out, key, value): (data_ptr, num_heads, stride_token, stride_head, dtype)
//   cache: (k_ptr, v_ptr, dtype, num_blocks, block_size, num_kv_heads, head_dim)
//   batch: (num_requests, num_tokens, query_start_loc_ptr, context_lens_ptr, block_tables_ptr,
//           block_table_stride)
//
// dtype codes are trillium::DType (0 float32, 1 bfloat16); strides count elements. Throws
// std::invalid_argument (ValueError) for an unknown dtype or inconsistent head counts.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>

#include "trillium/kernels/kv_store.h"
#include "trillium/kernels/paged_attention.h"

namespace trillium::bindings {

using RowsSpec = std::tuple<std::uintptr_t, int32_t, int64_t, int64_t, int32_t>;
using CacheSpec = std::tuple<std::uintptr_t, std::uintptr_t, int32_t, int32_t, int32_t, int32_t, int32_t>;
using BatchSpec = std::tuple<int32_t, int64_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, int64_t>;

inline DType to_dtype(int32_t code) {
  const auto t = static_cast<DType>(code);
  if (!valid_dtype(t)) throw std::invalid_argument("unknown dtype code " + std::to_string(code));
  return t;
}

template <class T>
T* spec_ptr(std::uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

inline PagedAttentionArgs attention_args(const RowsSpec& query, const RowsSpec& out, const CacheSpec& cache,
                                         const BatchSpec& batch, float scale) {
  PagedAttentionArgs a;
  a.query = spec_ptr<const void>(std::get<0>(query));
  a.num_q_heads = std::get<1>(query);
  a.query_stride_token = std::get<2>(query);
  a.query_stride_head = std::get<3>(query);
  a.query_dtype = to_dtype(std::get<4>(query));
  if (std::get<1>(out) != a.num_q_heads) throw std::invalid_argument("paged_attention: out and query head counts differ");
  a.out = spec_ptr<void>(std::get<0>(out));
  a.out_stride_token = std::get<2>(out);
  a.out_stride_head = std::get<3>(out);
  a.out_dtype = to_dtype(std::get<4>(out));
  a.k_cache = spec_ptr<const void>(std::get<0>(cache));
  a.v_cache = spec_ptr<const void>(std::get<1>(cache));
  a.kv_dtype = to_dtype(std::get<2>(cache));
  a.num_blocks = std::get<3>(cache);
  a.block_size = std::get<4>(cache);
  a.num_kv_heads = std::get<5>(cache);
  a.head_dim = std::get<6>(cache);
  a.num_requests = std::get<0>(batch);
  a.num_tokens = std::get<1>(batch);
  a.query_start_loc = spec_ptr<const int32_t>(std::get<2>(batch));
  a.context_lens = spec_ptr<const int32_t>(std::get<3>(batch));
  a.block_tables = spec_ptr<const int32_t>(std::get<4>(batch));
  a.block_table_stride = std::get<5>(batch);
  a.scale = scale;
  return a;
}

inline KVStoreArgs store_args(const RowsSpec& key, const RowsSpec& value, const CacheSpec& cache,
                              std::uintptr_t slot_mapping, int64_t num_tokens) {
  KVStoreArgs a;
  a.key = spec_ptr<const void>(std::get<0>(key));
  a.key_stride_token = std::get<2>(key);
  a.key_stride_head = std::get<3>(key);
  a.value = spec_ptr<const void>(std::get<0>(value));
  a.value_stride_token = std::get<2>(value);
  a.value_stride_head = std::get<3>(value);
  a.src_dtype = to_dtype(std::get<4>(key));
  if (std::get<4>(value) != std::get<4>(key)) throw std::invalid_argument("store_kv: key and value dtypes differ");
  a.k_cache = spec_ptr<void>(std::get<0>(cache));
  a.v_cache = spec_ptr<void>(std::get<1>(cache));
  a.cache_dtype = to_dtype(std::get<2>(cache));
  a.num_blocks = std::get<3>(cache);
  a.block_size = std::get<4>(cache);
  a.num_kv_heads = std::get<5>(cache);
  a.head_dim = std::get<6>(cache);
  if (std::get<1>(key) != a.num_kv_heads || std::get<1>(value) != a.num_kv_heads) {
    throw std::invalid_argument("store_kv: key/value head counts differ from the cache's");
  }
  a.slot_mapping = spec_ptr<const int64_t>(slot_mapping);
  a.num_tokens = num_tokens;
  return a;
}

}  // namespace trillium::bindings
