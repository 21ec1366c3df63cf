// Paged attention over one layer's block-structured KV pool (CPU kernels).
//
// One call covers R requests whose new tokens (T in all) are flattened request-major. Request r
// has context_lens[r] tokens in the pool (this step's already stored) and its new tokens are the
// last query_len of them:
//
//   positions  0 ......... ctx - qlen ......... ctx - 1        key j is visible to new token i
//              |<- cached ->|<---- new (queries) ---->|        iff j <= ctx - qlen + i  (causal)
//
// and, with a sliding window (Mistral, Gemma's local layers), also j > ctx - qlen + i - window.
//
// A token at position p lives in block block_tables[r][p / block_size] at offset p % block_size.
// Grouped-query attention: query head q reads KV head q / (num_q_heads / num_kv_heads).
//
//   query : [T, num_q_heads, head_dim]  strides (token, head), dim stride 1, fp32 or bf16
//   out   : [T, num_q_heads, head_dim]  strides (token, head), dim stride 1, fp32 or bf16
//   k/v   : [num_blocks, block_size, num_kv_heads, head_dim] contiguous, fp32 or bf16
//
// Softmax in fp32 with an online (running max) formulation, accumulation in fp32; no score matrix
// is ever materialized. Work is split over OpenMP threads by (request, KV head, key range) for
// decode and (request, KV head, query tile) for extend. The inner loops are those of the active
// kernel ISA (trillium/cpu_isa.h).
#pragma once

#include <cstdint>

#include "trillium/kernels/dtype.h"
#include "trillium/status.h"

namespace trillium {

struct PagedAttentionArgs {
  const void* query = nullptr;
  int64_t query_stride_token = 0, query_stride_head = 0;
  DType query_dtype = DType::kF32;

  void* out = nullptr;
  int64_t out_stride_token = 0, out_stride_head = 0;
  DType out_dtype = DType::kF32;

  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  DType kv_dtype = DType::kF32;
  int32_t num_blocks = 0, block_size = 0, num_kv_heads = 0, head_dim = 0;
  int32_t num_q_heads = 0;

  int32_t num_requests = 0;
  int64_t num_tokens = 0;                    // T; must equal num_requests for decode
  const int32_t* query_start_loc = nullptr;  // [R+1], extend only: request r owns rows [r]:[r+1]
  const int32_t* context_lens = nullptr;     // [R]
  const int32_t* block_tables = nullptr;     // [R, block_table_stride], padding never read
  int64_t block_table_stride = 0;            // entries per row (max blocks per request)

  float scale = 1.0f;   // softmax scale, usually 1/sqrt(head_dim)
  int32_t window = 0;   // > 0: sliding-window attention, a token at position p sees keys (p - window, p]
  float softcap = 0.0f; // > 0: each score s = scale * q.k becomes softcap * tanh(s / softcap) (Gemma 2)
  int num_threads = 0;  // 0: the OpenMP default
};

// Decode: exactly one new token per request (T == R, row r is request r; query_start_loc unused).
// Long contexts are split into key ranges whose partial softmax states are merged (flash-decoding),
// so a single request still uses every thread; the ranges depend on the context length alone, so
// a row's result does not depend on the batch or the thread count. Requires context_lens[r] >= 1.
// kInvalidArgument (nothing written) on bad sizes, dtypes, lengths or block ids.
Status paged_attention_decode(const PagedAttentionArgs& args);

// Extend (prefill, chunked prefill, prefix reuse, mixed batches): any number of new tokens per
// request, causal over cached prefix + new tokens, ragged lengths in one call. Requests with
// query_len 0 are skipped. A request with at most 32 new tokens (a decode, a speculative verify
// step) runs each token exactly as a decode row over the keys it sees, so its results are
// bit-identical to decoding those tokens one at a time. kInvalidArgument (nothing written) on
// bad input.
Status paged_attention_extend(const PagedAttentionArgs& args);

}  // namespace trillium
