// Internal: the per-work-item interface between the generic driver (paged_attention.cc: validation,
// work split, OpenMP, output writes) and the per-ISA inner loops (attention_isa_*.cc).
//
// An inner loop sees fp32 queries already multiplied by scale * log2(e), so softmax runs in base 2
// (exp2), and leaves an unnormalized state per query row: running max m (log2 domain), running sum
// l and accumulator acc = sum_j 2^(s_j - m) * v_j. The driver merges states and divides by l.
#pragma once

#include <cstdint>

#include "trillium/kernels/dtype.h"

namespace trillium::kernels {

// Keys and values of one request, as the inner loops walk them.
struct KVView {
  const void* k = nullptr;  // pool base (decode: KV head 0; extend: already offset to its KV head)
  const void* v = nullptr;
  const int32_t* block_table = nullptr;  // this request's row
  int64_t block_stride = 0;              // elements between blocks
  int64_t token_stride = 0;              // elements between tokens of a block (num_kv_heads * head_dim)
  int32_t block_size = 0;
  int32_t head_dim = 0;  // multiple of 16
};

// Decode: one token's H * G query rows (row = h * G + g, i.e. query head order) against keys
// [key_begin, key_end) of all H KV heads. Walking whole token rows (every head) keeps the reads
// sequential inside a block: per-head items would read a third of each line pair the hardware
// prefetchers fetch.
//
// Several consecutive tokens of one request (a speculative verify step's rows) share the reads of
// K and V: their rows are the group, G = tokens x heads per token (row = h * G + t * heads_per_token
// + g), and token t sees keys [key_begin, token_key_end[t]) (token_key_end[t] <= key_end; nullptr:
// every row sees [key_begin, key_end)). Each row's arithmetic is the same as alone: keys a row
// does not see get probability 0, which adds exactly nothing.
struct DecodeWork {
  KVView kv;
  int32_t num_kv_heads = 0;  // H
  int32_t group = 0;         // G
  const float* q = nullptr;  // [H * G, head_dim], pre-scaled
  int32_t key_begin = 0, key_end = 0;  // key_end > key_begin
  int32_t heads_per_token = 1;
  const int32_t* token_key_end = nullptr;  // [G / heads_per_token] or nullptr
  float softcap = 0.0f;  // > 0: scores become softcap * tanh(score / softcap) (log2 domain; Gemma 2)
  float* acc = nullptr;  // [H * G, head_dim] out, unnormalized
  float* m = nullptr;    // [H * G] out
  float* l = nullptr;    // [H * G] out
  float* scratch = nullptr;  // >= decode_scratch_floats(head_dim, H * G)
};

// Extend: num_queries consecutive new tokens x G heads = num_queries * G rows (row = i * G + g);
// query i sits at position first_pos + i and sees keys [0, first_pos + i] -- with a window W > 0,
// keys (first_pos + i - W, first_pos + i] (masked keys get probability 0, as in decode).
struct ExtendWork {
  KVView kv;
  int32_t group = 0;        // G
  int32_t num_queries = 0;  // >= 1
  int32_t first_pos = 0;
  int32_t window = 0;        // 0: none
  float softcap = 0.0f;      // as DecodeWork::softcap
  const float* q = nullptr;  // [num_queries * G, head_dim], pre-scaled
  float* acc = nullptr;      // [rows, head_dim] out, unnormalized
  float* m = nullptr;        // [rows] out
  float* l = nullptr;        // [rows] out
  float* scratch = nullptr;  // >= extend_scratch_floats(head_dim, rows)
};

// Upper bounds of the per-ISA blocking constants (simd_*.h), which size the scratch buffers.
constexpr int kMaxChunk = 64;     // keys per extend chunk
constexpr int kMaxRowBlock = 16;  // query rows per extend register block

inline int64_t decode_scratch_floats(int32_t head_dim, int32_t rows) {
  (void)head_dim;
  return 32 * static_cast<int64_t>(rows);
}
inline int64_t extend_scratch_floats(int32_t head_dim, int32_t rows) {
  return 2 * kMaxChunk * static_cast<int64_t>(head_dim) + kMaxRowBlock * kMaxChunk + 16 * static_cast<int64_t>(rows);
}

using DecodeFn = void (*)(const DecodeWork&);
using ExtendFn = void (*)(const ExtendWork&);

// One ISA's inner loops, indexed by KV dtype (0: fp32, 1: bf16).
struct IsaKernels {
  DecodeFn decode[2];
  ExtendFn extend[2];
};

IsaKernels portable_kernels();
#if defined(__x86_64__)
IsaKernels avx2_kernels();
IsaKernels avx512_kernels();
#endif

}  // namespace trillium::kernels
