// Block-quantized linear layer for x86-64 with AVX-512 (F, BW, VL): kernels/quant_linear_simd.h (the
// integer path) and kernels/quant_linear_zmm.h (the exact path) compiled inside the AVX-512 target
// region (kernels/isa_target.h); every header comes first so no AVX-512 code leaks into shared inline
// functions. Called only when kernel_isa() is kAvx512 (quant_linear.cc
// dispatches; trillium/cpu_isa.h detects the CPU).
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
// The exact path's tiles are the 512-bit ones (quant_linear_zmm.h), not the 256-bit ones.
#define TRILLIUM_QL_EXACT_ZMM
#include "kernels/quant_linear_simd.h"
// int16 path: rows per tile and the largest rows x groups tile (32 registers).
constexpr int kI16Rows = 6;
constexpr int kI16MaxTile = 8;
// Up to kI16DirectRows rows read codes straight into registers; more go through a panel, in
// register tiles of kI16PanelRows rows x 2 groups.
constexpr int64_t kI16DirectRows = 4;
constexpr int kI16PanelRows = 6;
#include "kernels/quant_linear_i16.h"
#include "kernels/quant_linear_zmm.h"
#undef TRILLIUM_QL_EXACT_ZMM
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
