// store_kv on the GPU: one CTA per token copies its K and V rows (all KV heads) into the slot,
// converting fp32 <-> bf16 (round to nearest even) when the dtypes differ.
#include <cuda_bf16.h>

#include <type_traits>

#include "launchers.h"

namespace trillium::cuda {
namespace {

template <class T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <class Src, class Dst>
__global__ void store_kv_kernel(const Src* __restrict__ key, const Src* __restrict__ value, int64_t key_stride_token,
                                int64_t key_stride_head, int64_t value_stride_token, int64_t value_stride_head,
                                Dst* __restrict__ k_cache, Dst* __restrict__ v_cache, const int64_t* __restrict__ slots,
                                int64_t num_slots, int32_t num_kv_heads, int32_t head_dim) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slots[token];
  if (slot < 0 || slot >= num_slots) return;
  const int32_t row = num_kv_heads * head_dim;
  for (int32_t i = threadIdx.x; i < row; i += blockDim.x) {
    const int32_t h = i / head_dim, d = i % head_dim;
    const Src k = key[token * key_stride_token + h * key_stride_head + d];
    const Src v = value[token * value_stride_token + h * value_stride_head + d];
    if constexpr (std::is_same_v<Src, Dst>) {
      k_cache[slot * row + i] = k;
      v_cache[slot * row + i] = v;
    } else {
      k_cache[slot * row + i] = from_f32<Dst>(to_f32<Src>(k));
      v_cache[slot * row + i] = from_f32<Dst>(to_f32<Src>(v));
    }
  }
}

template <class Src, class Dst>
cudaError_t launch(const KVStoreArgs& a, cudaStream_t stream) {
  const int64_t num_slots = static_cast<int64_t>(a.num_blocks) * a.block_size;
  store_kv_kernel<Src, Dst><<<static_cast<unsigned>(a.num_tokens), 128, 0, stream>>>(
      static_cast<const Src*>(a.key), static_cast<const Src*>(a.value), a.key_stride_token, a.key_stride_head,
      a.value_stride_token, a.value_stride_head, static_cast<Dst*>(a.k_cache), static_cast<Dst*>(a.v_cache),
      a.slot_mapping, num_slots, a.num_kv_heads, a.head_dim);
  return cudaGetLastError();
}

}  // namespace

cudaError_t store_kv(const KVStoreArgs& a, cudaStream_t stream) {
  if (!valid_dtype(a.src_dtype) || !valid_dtype(a.cache_dtype) || a.num_tokens < 0 || a.num_blocks < 0 ||
      a.block_size <= 0 || a.num_kv_heads <= 0 || a.head_dim <= 0 || a.num_tokens > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (a.num_tokens == 0) return cudaSuccess;
  if (a.key == nullptr || a.value == nullptr || a.k_cache == nullptr || a.v_cache == nullptr ||
      a.slot_mapping == nullptr) {
    return cudaErrorInvalidValue;
  }
  const bool src_f32 = a.src_dtype == DType::kF32, dst_f32 = a.cache_dtype == DType::kF32;
  if (src_f32 && dst_f32) return launch<float, float>(a, stream);
  if (src_f32) return launch<float, __nv_bfloat16>(a, stream);
  if (dst_f32) return launch<__nv_bfloat16, float>(a, stream);
  return launch<__nv_bfloat16, __nv_bfloat16>(a, stream);
}

}  // namespace trillium::cuda
