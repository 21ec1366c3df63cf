// Attention inner loops for x86-64 with AVX-512 (F, BW, VL). Only the functions defined inside the
// target region (kernels/isa_target.h) are compiled for AVX-512; every header (std, intrinsics) is
// included before it, so no AVX-512 code can leak into shared inline functions. Called only when
// kernel_isa() is kAvx512 (trillium/cpu_isa.h detects the CPU).
#if defined(__x86_64__)

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/attention_work.h"
#include "kernels/isa_target.h"

#if !defined(__clang__)
// GCC 12 flags _mm512_undefined_ps() inside its own cast intrinsics (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

TRILLIUM_TARGET_AVX512_BEGIN

namespace trillium::kernels {
namespace isa_avx512 {
#include "kernels/simd_avx512.h"
#include "kernels/attention_impl.h"
}  // namespace isa_avx512
}  // namespace trillium::kernels

TRILLIUM_TARGET_END

namespace trillium::kernels {
IsaKernels avx512_kernels() { return isa_avx512::make_kernels(); }
}  // namespace trillium::kernels

#endif  // x86-64
