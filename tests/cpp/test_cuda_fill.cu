// Runs the fill_f32 launcher on a real device and checks the result on the host.
// Exits 77 (registered as SKIP_RETURN_CODE) when there is no usable GPU, e.g. on build machines.
#include <cstdio>
#include <vector>

#include "launchers.h"

int main() {
  int num_devices = 0;
  if (cudaGetDeviceCount(&num_devices) != cudaSuccess || num_devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  constexpr int64_t n = 1 << 20;
  float* d = nullptr;
  if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess) return 1;
  cudaStream_t stream;
  if (cudaStreamCreate(&stream) != cudaSuccess) return 1;
  cudaError_t err = trillium::cuda::fill_f32(d, n, 3.5f, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  std::vector<float> h(n, 0.f);
  if (err == cudaSuccess) err = cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) {
    std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (h[i] != 3.5f) {
      std::fprintf(stderr, "h[%lld] = %f, want 3.5\n", static_cast<long long>(i), h[i]);
      return 1;
    }
  }
  cudaStreamDestroy(stream);
  cudaFree(d);
  std::printf("OK\n");
  return 0;
}
