// Block-quantized linear layer for x86-64 with AVX-512 (F, BW, VL): kernels/quant_linear_avx512_body.h
// compiled inside the target region (kernels/isa_target.h); every header comes first so no SIMD
// code leaks into shared inline functions. Called only when kernel_isa() is kAvx512
// (quant_linear.cc dispatches; trillium/cpu_isa.h detects the CPU).
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/isa_target.h"
#include "kernels/quant_linear_impl.h"

#if !defined(__clang__)
// GCC 12 flags _mm512_undefined_ps() inside its own cast intrinsics (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

TRILLIUM_TARGET_AVX512_BEGIN

namespace trillium::kernels {
namespace ql_avx512 {
#include "kernels/quant_linear_avx512_body.h"
}  // namespace ql_avx512
}  // namespace trillium::kernels

TRILLIUM_TARGET_END

namespace trillium::kernels {
QuantLinearKernels quant_linear_avx512_kernels() {
  return {ql_avx512::quantize_rows_avx2, ql_avx512::gemm_avx2, ql_avx512::gemm_f32_avx512, ql_avx512::quantize_rows_i16,
          ql_avx512::gemm_i16};
}
}  // namespace trillium::kernels

#endif  // x86-64
