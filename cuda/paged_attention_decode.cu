// Paged attention for decode steps over bf16 KV: split-KV ("flash-decoding"), bandwidth-bound.
//
// A decode step reads every cached K/V byte of its batch once and does little arithmetic on it,
// so the kernel's job is to keep enough loads in flight. Grid: (split, KV head, request). Each
// request's keys are cut into splits of `split` tokens (a multiple of the block size, chosen on
// the host so that the grid fills the GPU even for one request); a CTA takes one split of one KV
// head for all G = Hq / Hkv query heads of its group:
//
//   1. scores: a group of D / 8 lanes reads one key (16 bytes a lane, one 128-512 byte row) and
//      dots it with the G queries held in registers; scores go to shared memory [G, split];
//   2. softmax: per query head, the split's max and sum (base 2, fp32);
//   3. values: the same lane groups read V rows and accumulate p * V in registers, then the
//      groups' partial sums are added in shared memory.
//
// With one split the CTA writes the normalized output; with several it writes its unnormalized
// accumulator, max and sum to the workspace, and a second kernel merges the splits of each
// (request, query head) with the usual rescaling. CTAs whose split starts past their request's
// context exit at once (the grid is sized by the longest context the host knows of).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "dtype_access.cuh"
#include "launchers.h"

namespace trillium::cuda {
namespace {

constexpr int kMaxSplit = kMaxDecodeSplit;
constexpr int kThreads = 128;
constexpr int kElems = 8;  // bf16 per 16-byte load
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void unpack(const uint4& raw, float (&x)[kElems]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kElems / 2; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}

// Workspace layout for S splits: acc [R, Hq, S, D] fp32, then max [R, Hq, S], then sum [R, Hq, S].
struct Workspace {
  float* acc;
  float* max;
  float* sum;
};

__host__ __device__ inline Workspace carve(void* base, int64_t rows, int32_t splits, int32_t d) {
  float* f = static_cast<float*>(base);
  const int64_t n = rows * splits;
  return Workspace{f, f + n * d, f + n * d + n};
}

template <int kD, int kG>
__global__ void __launch_bounds__(kThreads) decode_kernel(const PagedAttentionArgs a, int32_t split, int32_t splits,
                                                          void* workspace) {
  constexpr int kLanes = kD / kElems;       // lanes per key row
  constexpr int kRowsPerPass = kThreads / kLanes;  // keys the CTA reads at once
  const int32_t s = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
  const int32_t context = a.context_lens[r];
  const int32_t begin = s * split;
  if (begin >= context) return;
  const int32_t end = min(context, begin + split);
  const int32_t n = end - begin;

  extern __shared__ float smem[];
  float* scores = smem;                  // [kG, split]
  float* reduce = scores + kG * split;   // [kRowsPerPass, kG, kD] partial V sums (aliases nothing)
  __shared__ float head_max[kG], head_sum[kG];

  const int t = threadIdx.x;
  const int group = t / kLanes;  // which key of a pass this thread reads
  const int part = t % kLanes;   // which 8 elements of the row
  const int32_t hq0 = h * kG;    // first query head of the group

  // Queries in registers, pre-scaled for base-2 exponentials: this lane's 8 dims of each head.
  float q[kG][kElems];
  const float qscale = a.scale * kLog2e;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    const int64_t base = static_cast<int64_t>(r) * a.query_stride_token + static_cast<int64_t>(hq0 + g) * a.query_stride_head;
#pragma unroll
    for (int e = 0; e < kElems; ++e) q[g][e] = load_any(a.query, a.query_dtype, base + part * kElems + e) * qscale;
  }

  const int64_t token_stride = static_cast<int64_t>(a.num_kv_heads) * kD;
  const int64_t block_stride = token_stride * a.block_size;
  const __nv_bfloat16* k_base = static_cast<const __nv_bfloat16*>(a.k_cache) + static_cast<int64_t>(h) * kD + part * kElems;
  const __nv_bfloat16* v_base = static_cast<const __nv_bfloat16*>(a.v_cache) + static_cast<int64_t>(h) * kD + part * kElems;
  const int32_t* table = a.block_tables + static_cast<int64_t>(r) * a.block_table_stride;

  // 1. scores. Every lane runs every pass (the shuffles need the whole warp); a lane past the
  // split's end reads nothing and writes nothing.
  for (int32_t j0 = 0; j0 < n; j0 += kRowsPerPass) {
    const int32_t j = j0 + group;
    const int32_t pos = begin + (j < n ? j : 0);
    const int32_t block = table[pos / a.block_size];
    float x[kElems];
    if (j < n && block >= 0 && block < a.num_blocks) {
      unpack(*reinterpret_cast<const uint4*>(k_base + block * block_stride + (pos % a.block_size) * token_stride), x);
    } else {
#pragma unroll
      for (int e = 0; e < kElems; ++e) x[e] = 0.0f;
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < kElems; ++e) dot = fmaf(q[g][e], x[e], dot);
#pragma unroll
      for (int o = kLanes / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o, kLanes);
      if (part == 0 && j < n) scores[g * split + j] = dot;
    }
  }
  __syncthreads();

  // 2. softmax statistics per query head: warp w handles heads w, w + 4, ...
  const int warp = t / 32, lane = t % 32;
  for (int g = warp; g < kG; g += kThreads / 32) {
    float m = -INFINITY;
    for (int j = lane; j < n; j += 32) m = fmaxf(m, scores[g * split + j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.0f;
    for (int j = lane; j < n; j += 32) {
      const float p = exp2f(scores[g * split + j] - m);
      scores[g * split + j] = p;
      l += p;
    }
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) {
      head_max[g] = m;
      head_sum[g] = l;
    }
  }
  __syncthreads();

  // 3. values
  float acc[kG][kElems];
#pragma unroll
  for (int g = 0; g < kG; ++g)
#pragma unroll
    for (int e = 0; e < kElems; ++e) acc[g][e] = 0.0f;
  for (int32_t j = group; j < n; j += kRowsPerPass) {
    const int32_t pos = begin + j;
    const int32_t block = table[pos / a.block_size];
    if (block < 0 || block >= a.num_blocks) continue;
    float x[kElems];
    unpack(*reinterpret_cast<const uint4*>(v_base + block * block_stride + (pos % a.block_size) * token_stride), x);
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      const float p = scores[g * split + j];
#pragma unroll
      for (int e = 0; e < kElems; ++e) acc[g][e] = fmaf(p, x[e], acc[g][e]);
    }
  }
  // Sum the lane groups' accumulators: group 0 of each pass row adds the others' in shared memory.
#pragma unroll
  for (int g = 0; g < kG; ++g)
#pragma unroll
    for (int e = 0; e < kElems; ++e) reduce[(group * kG + g) * kD + part * kElems + e] = acc[g][e];
  __syncthreads();
  const int64_t rows_total = static_cast<int64_t>(a.num_requests) * a.num_q_heads;
  for (int i = t; i < kG * kD; i += kThreads) {
    const int g = i / kD, d = i % kD;
    float v = 0.0f;
    for (int k = 0; k < kRowsPerPass; ++k) v += reduce[(k * kG + g) * kD + d];
    const int32_t head = hq0 + g;
    if (splits == 1) {
      const int64_t o = static_cast<int64_t>(r) * a.out_stride_token + static_cast<int64_t>(head) * a.out_stride_head + d;
      store_any(a.out, a.out_dtype, o, v / head_sum[g]);
    } else {
      const Workspace w = carve(workspace, rows_total, splits, kD);
      const int64_t row = (static_cast<int64_t>(r) * a.num_q_heads + head) * splits + s;
      w.acc[row * kD + d] = v;
      if (d == 0) {
        w.max[row] = head_max[g];
        w.sum[row] = head_sum[g];
      }
    }
  }
}

// One CTA per (query head, request), one thread per dimension: merges the request's used splits.
template <int kD>
__global__ void merge_kernel(const PagedAttentionArgs a, int32_t split, int32_t splits, const void* workspace) {
  const int32_t head = blockIdx.x, r = blockIdx.y, d = threadIdx.x;
  const int32_t used = min(splits, (a.context_lens[r] + split - 1) / split);
  const int64_t rows_total = static_cast<int64_t>(a.num_requests) * a.num_q_heads;
  const Workspace w = carve(const_cast<void*>(workspace), rows_total, splits, kD);
  const int64_t row0 = (static_cast<int64_t>(r) * a.num_q_heads + head) * splits;
  float m = -INFINITY;
  for (int s = 0; s < used; ++s) m = fmaxf(m, w.max[row0 + s]);
  float num = 0.0f, den = 0.0f;
  for (int s = 0; s < used; ++s) {
    const float f = exp2f(w.max[row0 + s] - m);
    num = fmaf(f, w.acc[(row0 + s) * kD + d], num);
    den = fmaf(f, w.sum[row0 + s], den);
  }
  const int64_t o = static_cast<int64_t>(r) * a.out_stride_token + static_cast<int64_t>(head) * a.out_stride_head + d;
  store_any(a.out, a.out_dtype, o, used > 0 ? num / den : 0.0f);
}

template <int kD, int kG>
size_t decode_smem(int32_t split) {
  return sizeof(float) * (static_cast<size_t>(kG) * split + static_cast<size_t>(kThreads / (kD / kElems)) * kG * kD);
}

template <int kD, int kG>
cudaError_t launch(const PagedAttentionArgs& a, int32_t split, int32_t splits, void* workspace, cudaStream_t stream) {
  const size_t smem = decode_smem<kD, kG>(split);
  // The attribute is per kernel: set once, to the largest size any split needs. Always, not only
  // past 48 KiB: the kernel's static shared memory counts against the same default limit, so a
  // dynamic size of exactly 48 KiB (split 512, G 8, D 128) would not launch without it.
  static bool raised = false;
  if (!raised) {
    const cudaError_t err = cudaFuncSetAttribute(decode_kernel<kD, kG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(decode_smem<kD, kG>(kMaxSplit)));
    if (err != cudaSuccess) return err;
    raised = true;
  }
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(a.num_requests));
  decode_kernel<kD, kG><<<grid, kThreads, smem, stream>>>(a, split, splits, workspace);
  if (splits > 1) {
    merge_kernel<kD><<<dim3(static_cast<unsigned>(a.num_q_heads), static_cast<unsigned>(a.num_requests)), kD, 0,
                       stream>>>(a, split, splits, workspace);
  }
  return cudaGetLastError();
}

template <int kD>
cudaError_t launch_group(const PagedAttentionArgs& a, int32_t split, int32_t splits, void* ws, cudaStream_t stream) {
  switch (a.num_q_heads / a.num_kv_heads) {
    case 1: return launch<kD, 1>(a, split, splits, ws, stream);
    case 2: return launch<kD, 2>(a, split, splits, ws, stream);
    case 3: return launch<kD, 3>(a, split, splits, ws, stream);
    case 4: return launch<kD, 4>(a, split, splits, ws, stream);
    case 5: return launch<kD, 5>(a, split, splits, ws, stream);
    case 6: return launch<kD, 6>(a, split, splits, ws, stream);
    case 7: return launch<kD, 7>(a, split, splits, ws, stream);
    case 8: return launch<kD, 8>(a, split, splits, ws, stream);
    case 16: return launch<kD, 16>(a, split, splits, ws, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

DecodePlan plan_paged_attention_decode(const PagedAttentionArgs& a, int32_t max_context_len, int32_t num_sms) {
  DecodePlan p;
  const int32_t group = a.num_kv_heads > 0 ? a.num_q_heads / a.num_kv_heads : 0;
  p.supported = a.kv_dtype == DType::kBF16 && (a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256) &&
                a.num_kv_heads > 0 && a.num_q_heads % a.num_kv_heads == 0 &&
                ((group >= 1 && group <= 8) || group == 16) && a.block_size > 0 && a.window == 0 &&
                a.softcap == 0.0f && a.num_tokens == a.num_requests;
  if (!p.supported || a.num_requests <= 0 || max_context_len <= 0) return p;
  // The smallest split (a multiple of the block size, at least 64 tokens) that still gives every
  // CTA of a two-wave grid a split of its own; at most kMaxSplit (shared memory).
  const int64_t ctas_wanted = 2LL * (num_sms > 0 ? num_sms : 132);
  const int64_t heads = static_cast<int64_t>(a.num_requests) * a.num_kv_heads;
  int64_t split = (static_cast<int64_t>(max_context_len) * heads + ctas_wanted - 1) / ctas_wanted;
  split = split < 64 ? 64 : split;
  split = split > kMaxSplit ? kMaxSplit : split;
  split = (split + a.block_size - 1) / a.block_size * a.block_size;
  if (split > kMaxSplit) split = kMaxSplit / a.block_size * a.block_size;
  if (split <= 0) {
    p.supported = false;
    return p;
  }
  p.split = static_cast<int32_t>(split);
  p.splits = static_cast<int32_t>((max_context_len + split - 1) / split);
  p.workspace_bytes = p.splits > 1 ? sizeof(float) * static_cast<size_t>(a.num_requests) * a.num_q_heads * p.splits *
                                         (static_cast<size_t>(a.head_dim) + 2)
                                   : 0;
  return p;
}

cudaError_t paged_attention_decode(const PagedAttentionArgs& a, const DecodePlan& plan, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream) {
  if (!plan.supported || plan.split <= 0 || plan.splits <= 0 || plan.split > kMaxSplit ||
      a.num_tokens != a.num_requests || a.num_requests > 65535 || plan.splits > 65535) {
    return cudaErrorInvalidValue;
  }
  if (a.num_requests == 0) return cudaSuccess;
  if (a.query == nullptr || a.out == nullptr || a.k_cache == nullptr || a.v_cache == nullptr ||
      a.context_lens == nullptr || a.block_tables == nullptr || (plan.splits > 1 && workspace == nullptr) ||
      workspace_bytes < plan.workspace_bytes) {
    return cudaErrorInvalidValue;
  }
  switch (a.head_dim) {
    case 64: return launch_group<64>(a, plan.split, plan.splits, workspace, stream);
    case 128: return launch_group<128>(a, plan.split, plan.splits, workspace, stream);
    case 256: return launch_group<256>(a, plan.split, plan.splits, workspace, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace trillium::cuda
