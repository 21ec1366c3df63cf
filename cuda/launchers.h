// Launchers for the CUDA kernels in this directory. Framework-free: raw device pointers, sizes and
// a stream in, a cudaError_t out. Validation of shapes and dtypes happens once, in the bindings.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace trillium::cuda {

// Sets ptr[0..n) = value on `stream`. Asynchronous; returns the launch error (cudaSuccess when
// n == 0). ptr must be device (or managed) memory holding at least n floats.
cudaError_t fill_f32(float* ptr, int64_t n, float value, cudaStream_t stream);

}  // namespace trillium::cuda
