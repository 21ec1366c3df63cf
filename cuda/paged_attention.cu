// Paged attention on the GPU, decode and extend in one kernel.
//
// Grid: (row tiles, KV head, request). A request's query rows are its (new token, head-in-group)
// pairs, row = i * G + g; a CTA takes kRowsPerCta consecutive rows of one KV head, so the G query
// heads of a group share every K/V chunk it stages. Each warp owns kRowsPerWarp rows:
//
//   for each chunk of 32 keys up to the CTA's last query position:
//     all warps stage K (padded rows: conflict-free column reads) and V of the chunk, as fp32, in
//     shared memory; then per row: lane j scores key j, warp max / sum give the online-softmax
//     update (base 2, fp32), and lane d' accumulates sum_j p_j * V[j][d' + 32 i] in registers.
//
// A causal row simply masks keys past its position; rows that see none of a chunk skip it.
#include <cuda_bf16.h>

#include <cmath>
#include <type_traits>

#include "dtype_access.cuh"
#include "launchers.h"

namespace trillium::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerCta = kWarps * kRowsPerWarp;
constexpr int kChunk = 32;  // keys per step: one per lane
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <int kD>
constexpr size_t smem_bytes() {
  return sizeof(float) * (kRowsPerCta * kD + kChunk * (kD + 1) + kChunk * kD);
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads) attention_kernel(const PagedAttentionArgs a) {
  const int32_t r = blockIdx.z, h = blockIdx.y;
  const int32_t G = a.num_q_heads / a.num_kv_heads;
  const int32_t q0 = a.query_start_loc[r];
  const int32_t qlen = a.query_start_loc[r + 1] - q0;
  const int32_t row0 = blockIdx.x * kRowsPerCta;
  if (row0 >= qlen * G) return;
  const int32_t nrows = min(kRowsPerCta, qlen * G - row0);
  const int32_t first_pos = a.context_lens[r] - qlen;  // position of the request's first new token
  const int32_t key_end = first_pos + (row0 + nrows - 1) / G + 1;

  extern __shared__ float smem[];
  float* qs = smem;                    // [kRowsPerCta, kD] pre-scaled queries
  float* ks = qs + kRowsPerCta * kD;   // [kChunk, kD + 1]
  float* vs = ks + kChunk * (kD + 1);  // [kChunk, kD]

  const float qscale = a.scale * kLog2e;
  for (int i = threadIdx.x; i < kRowsPerCta * kD; i += kThreads) {
    const int rr = i / kD, d = i % kD;
    float x = 0.0f;
    if (rr < nrows) {
      const int32_t row = row0 + rr;
      const int64_t token = q0 + row / G;
      const int64_t head = static_cast<int64_t>(h) * G + row % G;
      x = load_any(a.query, a.query_dtype, token * a.query_stride_token + head * a.query_stride_head + d) * qscale;
    }
    qs[i] = x;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kD / 32];
  int32_t row_pos[kRowsPerWarp];  // position of each row of this warp; -1 when the row is unused
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int lr = warp + rr * kWarps;
    row_pos[rr] = lr < nrows ? first_pos + (row0 + lr) / G : -1;
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int i = 0; i < kD / 32; ++i) acc[rr][i] = 0.0f;
  }

  const int64_t token_stride = static_cast<int64_t>(a.num_kv_heads) * kD;
  const int64_t block_stride = token_stride * a.block_size;
  const T* k_base = static_cast<const T*>(a.k_cache) + static_cast<int64_t>(h) * kD;
  const T* v_base = static_cast<const T*>(a.v_cache) + static_cast<int64_t>(h) * kD;
  const int32_t* table = a.block_tables + r * a.block_table_stride;

  for (int32_t c0 = 0; c0 < key_end; c0 += kChunk) {
    __syncthreads();  // the previous chunk is consumed (first pass: queries are staged)
    for (int t = warp; t < kChunk; t += kWarps) {
      const int32_t pos = c0 + t;
      const T* kr = nullptr;
      const T* vr = nullptr;
      if (pos < key_end) {
        const int32_t block = table[pos / a.block_size];
        if (block >= 0 && block < a.num_blocks) {
          const int64_t off = block * block_stride + (pos % a.block_size) * token_stride;
          kr = k_base + off;
          vr = v_base + off;
        }
      }
      for (int d = lane; d < kD; d += 32) {
        ks[t * (kD + 1) + d] = kr != nullptr ? to_f32(kr[d]) : 0.0f;
        vs[t * kD + d] = vr != nullptr ? to_f32(vr[d]) : 0.0f;
      }
    }
    __syncthreads();

#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int32_t p = row_pos[rr];
      if (p < c0) continue;  // warp-uniform: this row sees no key of the chunk (or is unused)
      const float* q = qs + (warp + rr * kWarps) * kD;
      const float* k = ks + lane * (kD + 1);
      float s = 0.0f;
#pragma unroll 16
      for (int d = 0; d < kD; ++d) s = fmaf(q[d], k[d], s);
      if (c0 + lane > p) s = -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(s));
      const float alpha = exp2f(m[rr] - m_new);  // 0 on the first chunk (m = -inf)
      const float pj = exp2f(s - m_new);
      l[rr] = l[rr] * alpha + warp_sum(pj);
      m[rr] = m_new;
#pragma unroll
      for (int i = 0; i < kD / 32; ++i) acc[rr][i] *= alpha;
#pragma unroll 8
      for (int j = 0; j < kChunk; ++j) {
        const float pv = __shfl_sync(0xffffffffu, pj, j);
#pragma unroll
        for (int i = 0; i < kD / 32; ++i) acc[rr][i] = fmaf(pv, vs[j * kD + lane + 32 * i], acc[rr][i]);
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    if (row_pos[rr] < 0) continue;
    const int32_t row = row0 + warp + rr * kWarps;
    const int64_t token = q0 + row / G;
    const int64_t head = static_cast<int64_t>(h) * G + row % G;
    const float inv = 1.0f / l[rr];
    const int64_t base = token * a.out_stride_token + head * a.out_stride_head;
#pragma unroll
    for (int i = 0; i < kD / 32; ++i) store_any(a.out, a.out_dtype, base + lane + 32 * i, acc[rr][i] * inv);
  }
}

template <class T, int kD>
cudaError_t launch(const PagedAttentionArgs& a, int32_t max_query_len, cudaStream_t stream) {
  const int32_t group = a.num_q_heads / a.num_kv_heads;
  const int64_t tiles = (static_cast<int64_t>(max_query_len) * group + kRowsPerCta - 1) / kRowsPerCta;
  if (tiles > INT32_MAX || a.num_requests > 65535 || a.num_kv_heads > 65535) return cudaErrorInvalidValue;
  constexpr size_t smem = smem_bytes<kD>();
  if constexpr (smem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(attention_kernel<T, kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(a.num_requests));
  attention_kernel<T, kD><<<grid, kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_dim(const PagedAttentionArgs& a, int32_t max_query_len, cudaStream_t stream) {
  switch (a.head_dim) {
    case 64:
      return launch<T, 64>(a, max_query_len, stream);
    case 128:
      return launch<T, 128>(a, max_query_len, stream);
    case 256:
      return launch<T, 256>(a, max_query_len, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t paged_attention(const PagedAttentionArgs& a, int32_t max_query_len, cudaStream_t stream) {
  if (!valid_dtype(a.query_dtype) || !valid_dtype(a.out_dtype) || !valid_dtype(a.kv_dtype) || a.num_kv_heads <= 0 ||
      a.num_q_heads <= 0 || a.num_q_heads % a.num_kv_heads != 0 || a.block_size <= 0 || a.num_requests < 0 ||
      a.num_tokens < 0 || max_query_len < 0) {
    return cudaErrorInvalidValue;
  }
  if (a.num_requests == 0 || a.num_tokens == 0 || max_query_len == 0) return cudaSuccess;
  if (a.query == nullptr || a.out == nullptr || a.k_cache == nullptr || a.v_cache == nullptr ||
      a.query_start_loc == nullptr || a.context_lens == nullptr || a.block_tables == nullptr) {
    return cudaErrorInvalidValue;
  }
  return a.kv_dtype == DType::kF32 ? launch_dim<float>(a, max_query_len, stream)
                                   : launch_dim<__nv_bfloat16>(a, max_query_len, stream);
}

}  // namespace trillium::cuda
