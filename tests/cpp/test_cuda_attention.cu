// Runs the CUDA paged-attention and store_kv launchers on a real device against the naive host
// reference of attention_problem.h (decode and extend, fp32 and bf16). Exits 77 (registered as
// SKIP_RETURN_CODE) when there is no usable GPU, e.g. on build machines.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "attention_problem.h"
#include "launchers.h"

using trillium::DType;
using trillium::test::Buffer;
using trillium::test::Problem;

namespace {

int failures = 0;

#define CUDA_OK(expr)                                                                          \
  do {                                                                                         \
    const cudaError_t _e = (expr);                                                             \
    if (_e != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(_e)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  CUDA_OK(cudaMalloc(&d, h.size() * sizeof(T) + 1));
  CUDA_OK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
void* buffer_to_device(const Buffer& b) {
  return b.dtype == DType::kF32 ? static_cast<void*>(to_device(b.f32)) : static_cast<void*>(to_device(b.bf16));
}

void run(std::mt19937& rng, const std::vector<std::pair<int32_t, int32_t>>& lens, int32_t kv_heads, int32_t group,
         int32_t head_dim, int32_t block_size, DType dtype, const char* what) {
  Problem p(rng, lens, kv_heads, group, head_dim, block_size, dtype);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  trillium::PagedAttentionArgs a = p.args(scale);
  a.query = buffer_to_device(p.query);
  a.out = buffer_to_device(p.out);
  a.k_cache = buffer_to_device(p.k);
  a.v_cache = buffer_to_device(p.v);
  a.query_start_loc = to_device(p.query_start_loc);
  a.context_lens = to_device(p.context_lens);
  a.block_tables = to_device(p.block_tables);
  int32_t max_query_len = 0;
  for (size_t r = 0; r + 1 < p.query_start_loc.size(); ++r)
    max_query_len = std::max(max_query_len, p.query_start_loc[r + 1] - p.query_start_loc[r]);
  CUDA_OK(trillium::cuda::paged_attention(a, max_query_len, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const size_t bytes = p.out.size() * trillium::dtype_size(dtype);
  CUDA_OK(cudaMemcpy(p.out.data(), a.out, bytes, cudaMemcpyDeviceToHost));
  const double err = p.relative_error(p.reference(scale));
  const double tol = dtype == DType::kF32 ? 1e-4 : 2e-2;
  if (!(err < tol)) {
    std::fprintf(stderr, "%s %s: relative error %g (Hkv %d, G %d, D %d, bs %d)\n", what, dtype_name(dtype), err,
                 kv_heads, group, head_dim, block_size);
    ++failures;
  }
  for (const void* ptr : {a.query, static_cast<const void*>(a.out), a.k_cache, a.v_cache,
                          static_cast<const void*>(a.query_start_loc), static_cast<const void*>(a.context_lens),
                          static_cast<const void*>(a.block_tables)}) {
    cudaFree(const_cast<void*>(ptr));
  }
}

}  // namespace

int main() {
  int num_devices = 0;
  if (cudaGetDeviceCount(&num_devices) != cudaSuccess || num_devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    run(rng, {{1, 1}, {17, 1}, {300, 1}, {1000, 1}}, 3, 3, 64, 16, dtype, "decode");
    run(rng, {{4000, 1}, {33, 1}}, 1, 8, 128, 32, dtype, "decode");
    run(rng, {{50, 50}, {200, 37}, {90, 1}, {16, 16}}, 2, 4, 128, 16, dtype, "extend");
    run(rng, {{700, 300}}, 1, 1, 256, 32, dtype, "extend");
  }
  if (failures) std::fprintf(stderr, "seed %u\n", seed);
  else std::printf("OK\n");
  return failures == 0 ? 0 : 1;
}
