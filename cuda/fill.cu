// fill_f32: the smallest real kernel; it proves the CUDA toolchain end to end.
#include "launchers.h"

namespace trillium::cuda {
namespace {

__global__ void fill_f32_kernel(float* __restrict__ ptr, int64_t n, float value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    ptr[i] = value;
  }
}

}  // namespace

cudaError_t fill_f32(float* ptr, int64_t n, float value, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (ptr == nullptr) return cudaErrorInvalidValue;
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 65535;  // grid-stride loop covers the rest
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  fill_f32_kernel<<<static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks), kThreads, 0, stream>>>(
      ptr, n, value);
  return cudaGetLastError();
}

}  // namespace trillium::cuda
