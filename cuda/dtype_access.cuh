// Device-side reads and writes of a tensor whose dtype (fp32 or bf16) is known only at run time:
// the query and output rows of the attention kernels. fp32 in registers either way.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "trillium/kernels/dtype.h"

namespace trillium::cuda {

__device__ __forceinline__ float load_any(const void* base, DType t, int64_t i) {
  return t == DType::kF32 ? static_cast<const float*>(base)[i]
                          : __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

__device__ __forceinline__ void store_any(void* base, DType t, int64_t i, float x) {
  if (t == DType::kF32) {
    static_cast<float*>(base)[i] = x;
  } else {
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x);
  }
}

}  // namespace trillium::cuda
