// apply_token_bitmask on the GPU (contract: cpp/include/trillium/kernels/token_bitmask.h).
// One thread per logit: consecutive threads write consecutive logits of a row (coalesced) and
// a warp shares one mask word, so the mask costs one 4-byte read per 32 logits. Rows that take
// no mask (mask_rows[r] == -1) return at once.
#include <cuda_bf16.h>

#include "launchers.h"

namespace trillium::cuda {
namespace {

template <typename T>
__device__ __forceinline__ T neg_inf();
template <>
__device__ __forceinline__ float neg_inf<float>() {
  return -__int_as_float(0x7f800000);
}
template <>
__device__ __forceinline__ uint16_t neg_inf<uint16_t>() {
  return 0xff80;  // bf16 -inf, stored as raw bits
}

template <typename T>
__global__ void apply_token_bitmask_kernel(T* __restrict__ logits, int64_t logits_stride, int64_t vocab,
                                           const int32_t* __restrict__ bitmask, int64_t bitmask_stride,
                                           int64_t num_mask_rows, int64_t num_words,
                                           const int32_t* __restrict__ mask_rows) {
  const int64_t r = blockIdx.y;
  const int64_t m = mask_rows == nullptr ? r : mask_rows[r];
  if (m < 0 || m >= num_mask_rows) return;  // unmasked row (or an id the host did not check)
  const int32_t* words = bitmask + m * bitmask_stride;
  T* row = logits + r * logits_stride;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < vocab; t += stride) {
    const int64_t w = t >> 5;
    const bool allowed = w < num_words && ((static_cast<uint32_t>(words[w]) >> (t & 31)) & 1u);
    if (!allowed) row[t] = neg_inf<T>();
  }
}

}  // namespace

cudaError_t apply_token_bitmask(const TokenBitmaskArgs& a, cudaStream_t stream) {
  if (!check_token_bitmask_args(a).ok()) return cudaErrorInvalidValue;
  if (a.num_rows == 0 || a.vocab_size == 0) return cudaSuccess;
  if (a.num_rows > 65535) return cudaErrorInvalidValue;  // grid.y limit
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocksX = 1024;  // grid-stride loop covers larger vocabularies
  const int64_t blocks = (a.vocab_size + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(blocks < kMaxBlocksX ? blocks : kMaxBlocksX),
                  static_cast<unsigned>(a.num_rows));
  if (a.logits_dtype == DType::kF32) {
    apply_token_bitmask_kernel<float><<<grid, kThreads, 0, stream>>>(
        static_cast<float*>(a.logits), a.logits_stride, a.vocab_size, a.bitmask, a.bitmask_stride,
        a.num_mask_rows, a.num_words, a.mask_rows);
  } else {
    apply_token_bitmask_kernel<uint16_t><<<grid, kThreads, 0, stream>>>(
        static_cast<uint16_t*>(a.logits), a.logits_stride, a.vocab_size, a.bitmask, a.bitmask_stride,
        a.num_mask_rows, a.num_words, a.mask_rows);
  }
  return cudaGetLastError();
}

}  // namespace trillium::cuda
