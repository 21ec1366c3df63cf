// The attention and KV-store kernels' Python-side arguments, shared by the CPU (kernels.cc) and
// CUDA (cuda/module.cc) bindings so both modules take the same objects: the NamedTuples RowsSpec,
// CacheSpec and BatchSpec of python/trillium/ops/kernel_specs.py, read by field name (kernel_args.h).
//
// dtype codes are trillium::DType (0 float32, 1 bfloat16); strides count elements; *_ptr fields are
// addresses (host for _core, device for _cuda). attention_args/store_args throw
// std::invalid_argument (ValueError) for an unknown dtype or inconsistent head counts or dtypes.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>

#include "kernel_args.h"
#include "trillium/kernels/kv_store.h"
#include "trillium/kernels/paged_attention.h"

namespace trillium::bindings {

// Rows of a [T, num_heads, head_dim] tensor whose last dimension is contiguous (query, out, key,
// value): token and head strides are free, so views of a fused QKV projection work.
struct RowsSpec {
  static constexpr char kPyName[] = "RowsSpec";
  std::uintptr_t data_ptr = 0;
  int32_t num_heads = 0;
  int64_t stride_token = 0;
  int64_t stride_head = 0;
  int32_t dtype = 0;

  static bool load(pybind11::handle src, bool convert, RowsSpec* s) {
    return TRILLIUM_LOAD_FIELD(src, convert, *s, data_ptr) && TRILLIUM_LOAD_FIELD(src, convert, *s, num_heads) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, stride_token) && TRILLIUM_LOAD_FIELD(src, convert, *s, stride_head) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, dtype);
  }
};

// One layer's KV pool: k and v, each a contiguous [num_blocks, block_size, num_kv_heads, head_dim].
struct CacheSpec {
  static constexpr char kPyName[] = "CacheSpec";
  std::uintptr_t k_ptr = 0;
  std::uintptr_t v_ptr = 0;
  int32_t dtype = 0;
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;

  static bool load(pybind11::handle src, bool convert, CacheSpec* s) {
    return TRILLIUM_LOAD_FIELD(src, convert, *s, k_ptr) && TRILLIUM_LOAD_FIELD(src, convert, *s, v_ptr) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, dtype) && TRILLIUM_LOAD_FIELD(src, convert, *s, num_blocks) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, block_size) && TRILLIUM_LOAD_FIELD(src, convert, *s, num_kv_heads) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, head_dim);
  }
};

// One step's batch metadata (int32 tensors): query_start_loc [R+1] (extend only), context_lens [R],
// block_tables [R, block_table_stride].
struct BatchSpec {
  static constexpr char kPyName[] = "BatchSpec";
  int32_t num_requests = 0;
  int64_t num_tokens = 0;
  std::uintptr_t query_start_loc_ptr = 0;
  std::uintptr_t context_lens_ptr = 0;
  std::uintptr_t block_tables_ptr = 0;
  int64_t block_table_stride = 0;

  static bool load(pybind11::handle src, bool convert, BatchSpec* s) {
    return TRILLIUM_LOAD_FIELD(src, convert, *s, num_requests) && TRILLIUM_LOAD_FIELD(src, convert, *s, num_tokens) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, query_start_loc_ptr) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, context_lens_ptr) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, block_tables_ptr) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, block_table_stride);
  }
};

inline PagedAttentionArgs attention_args(const RowsSpec& query, const RowsSpec& out, const CacheSpec& cache,
                                         const BatchSpec& batch, float scale) {
  PagedAttentionArgs a;
  a.query = from_address<const void>(query.data_ptr);
  a.num_q_heads = query.num_heads;
  a.query_stride_token = query.stride_token;
  a.query_stride_head = query.stride_head;
  a.query_dtype = to_dtype(query.dtype);
  if (out.num_heads != query.num_heads) {
    throw std::invalid_argument("paged_attention: out and query head counts differ");
  }
  a.out = from_address<void>(out.data_ptr);
  a.out_stride_token = out.stride_token;
  a.out_stride_head = out.stride_head;
  a.out_dtype = to_dtype(out.dtype);
  a.k_cache = from_address<const void>(cache.k_ptr);
  a.v_cache = from_address<const void>(cache.v_ptr);
  a.kv_dtype = to_dtype(cache.dtype);
  a.num_blocks = cache.num_blocks;
  a.block_size = cache.block_size;
  a.num_kv_heads = cache.num_kv_heads;
  a.head_dim = cache.head_dim;
  a.num_requests = batch.num_requests;
  a.num_tokens = batch.num_tokens;
  a.query_start_loc = from_address<const int32_t>(batch.query_start_loc_ptr);
  a.context_lens = from_address<const int32_t>(batch.context_lens_ptr);
  a.block_tables = from_address<const int32_t>(batch.block_tables_ptr);
  a.block_table_stride = batch.block_table_stride;
  a.scale = scale;
  return a;
}

inline KVStoreArgs store_args(const RowsSpec& key, const RowsSpec& value, const CacheSpec& cache,
                              std::uintptr_t slot_mapping, int64_t num_tokens) {
  KVStoreArgs a;
  a.key = from_address<const void>(key.data_ptr);
  a.key_stride_token = key.stride_token;
  a.key_stride_head = key.stride_head;
  a.value = from_address<const void>(value.data_ptr);
  a.value_stride_token = value.stride_token;
  a.value_stride_head = value.stride_head;
  a.src_dtype = to_dtype(key.dtype);
  if (value.dtype != key.dtype) throw std::invalid_argument("store_kv: key and value dtypes differ");
  a.k_cache = from_address<void>(cache.k_ptr);
  a.v_cache = from_address<void>(cache.v_ptr);
  a.cache_dtype = to_dtype(cache.dtype);
  a.num_blocks = cache.num_blocks;
  a.block_size = cache.block_size;
  a.num_kv_heads = cache.num_kv_heads;
  a.head_dim = cache.head_dim;
  if (key.num_heads != a.num_kv_heads || value.num_heads != a.num_kv_heads) {
    throw std::invalid_argument("store_kv: key/value head counts differ from the cache's");
  }
  a.slot_mapping = from_address<const int64_t>(slot_mapping);
  a.num_tokens = num_tokens;
  return a;
}

}  // namespace trillium::bindings

TRILLIUM_SPEC_CASTER(trillium::bindings::RowsSpec)
TRILLIUM_SPEC_CASTER(trillium::bindings::CacheSpec)
TRILLIUM_SPEC_CASTER(trillium::bindings::BatchSpec)
