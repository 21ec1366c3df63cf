// Attention inner loops for x86-64 with AVX-512 (F, BW, VL). Only the functions defined between
// the target push/pop are compiled for AVX-512; every header (std, intrinsics) is included before
// it, so no AVX-512 code can leak into shared inline functions. Called only when the CPU has
// AVX-512F/BW/VL (paged_attention.cc checks cpuid and xgetbv).
#if defined(__x86_64__)

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/attention_work.h"

#if !defined(__clang__)
// GCC 12 flags _mm512_undefined_ps() inside its own cast intrinsics (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
#endif

namespace trillium::kernels {
namespace isa_avx512 {
#include "kernels/simd_avx512.h"
#include "kernels/attention_impl.h"
}  // namespace isa_avx512
}  // namespace trillium::kernels

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace trillium::kernels {
IsaKernels avx512_kernels() { return isa_avx512::make_kernels(); }
}  // namespace trillium::kernels

#endif  // x86-64
