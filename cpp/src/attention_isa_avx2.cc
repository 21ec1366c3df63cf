// Attention inner loops for x86-64 with AVX2 + FMA. Only the functions defined between the
// target push/pop are compiled for AVX2; every header (std, intrinsics) is included before it, so
// no AVX2 code can leak into shared inline functions. Called only when the CPU has AVX2 and FMA
// (paged_attention.cc checks cpuid and xgetbv).
#if defined(__x86_64__)

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/attention_work.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

namespace trillium::kernels {
namespace isa_avx2 {
#include "kernels/simd_avx2.h"
#include "kernels/attention_impl.h"
}  // namespace isa_avx2
}  // namespace trillium::kernels

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace trillium::kernels {
IsaKernels avx2_kernels() { return isa_avx2::make_kernels(); }
}  // namespace trillium::kernels

#endif  // x86-64
