// Attention inner loops for x86-64 with AVX2 + FMA. Only the functions defined inside the target
// region (kernels/isa_target.h) are compiled for AVX2; every header (std, intrinsics) is included
// before it, so no AVX2 code can leak into shared inline functions. Called only when kernel_isa()
// is kAvx2 (trillium/cpu_isa.h detects the CPU).
#if defined(__x86_64__)

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/attention_work.h"
#include "kernels/isa_target.h"

TRILLIUM_TARGET_AVX2_BEGIN

namespace trillium::kernels {
namespace isa_avx2 {
#include "kernels/simd_avx2.h"
#include "kernels/attention_impl.h"
}  // namespace isa_avx2
}  // namespace trillium::kernels

TRILLIUM_TARGET_END

namespace trillium::kernels {
IsaKernels avx2_kernels() { return isa_avx2::make_kernels(); }
}  // namespace trillium::kernels

#endif  // x86-64
