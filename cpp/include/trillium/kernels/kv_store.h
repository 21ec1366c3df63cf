// store_kv: write this step's new K and V rows into their slots of one layer's paged pool.
//
//   key, value : [num_tokens, num_kv_heads, head_dim]   strides (token, head) in elements, dim stride 1
//   k/v cache  : [num_blocks, block_size, num_kv_heads, head_dim] contiguous
//   slot_mapping[t] = block_id * block_size + offset of token t; a negative slot skips the token
//                     (padding), every other slot must lie in [0, num_blocks * block_size)
//
// Source and cache dtypes may differ (fp32 -> bf16 rounds to nearest even). Only the named slots
// are written. Framework-free: raw pointers and sizes; runs on the calling thread plus OpenMP.
#pragma once

#include <cstdint>

#include "trillium/kernels/dtype.h"
#include "trillium/status.h"

namespace trillium {

struct KVStoreArgs {
  const void* key = nullptr;    // [num_tokens, num_kv_heads, head_dim]
  const void* value = nullptr;  // [num_tokens, num_kv_heads, head_dim]
  int64_t key_stride_token = 0, key_stride_head = 0;
  int64_t value_stride_token = 0, value_stride_head = 0;
  DType src_dtype = DType::kF32;  // of key and value

  void* k_cache = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim]
  void* v_cache = nullptr;
  DType cache_dtype = DType::kF32;
  int32_t num_blocks = 0, block_size = 0, num_kv_heads = 0, head_dim = 0;

  const int64_t* slot_mapping = nullptr;  // [num_tokens]
  int64_t num_tokens = 0;

  int num_threads = 0;  // 0: the OpenMP default
};

// Validates everything first (sizes, dtypes, every slot in range) and writes nothing on failure:
// kInvalidArgument naming the bad value. A slot listed twice gets one of its tokens (unspecified).
Status store_kv(const KVStoreArgs& args);

}  // namespace trillium
