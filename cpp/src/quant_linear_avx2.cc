// Block-quantized linear layer for x86-64 with AVX2 + FMA: kernels/quant_linear_simd.h compiled
// inside the AVX2 target region (kernels/isa_target.h); every header comes first so no AVX2 code
// leaks into shared inline functions. Called only when kernel_isa() is kAvx2 (quant_linear.cc
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

TRILLIUM_TARGET_AVX2_BEGIN

namespace trillium::kernels {
namespace ql_avx2 {
// Up to this many rows dequantize into registers; more amortize a dequantized panel. The panel
// alternates a pass that only reads codes with one that only does fmas, so with few rows it
// waited on memory and then on arithmetic: a 4-6-row step (a request verifying speculative
// drafts) ran 10-25% faster per projection direct (bench/RESULTS.md).
constexpr int64_t kMaxDirectRows = 8;
#include "kernels/quant_linear_simd.h"
// int16 path: rows per tile and the largest rows x groups tile (16 registers).
constexpr int kI16Rows = 4;
constexpr int kI16MaxTile = 4;
// Up to kI16DirectRows rows read codes straight into registers; more go through a panel, in
// register tiles of kI16PanelRows rows x 2 groups.
constexpr int64_t kI16DirectRows = 4;
constexpr int kI16PanelRows = 4;
#include "kernels/quant_linear_i16.h"
}  // namespace ql_avx2
}  // namespace trillium::kernels

TRILLIUM_TARGET_END

namespace trillium::kernels {
QuantLinearKernels quant_linear_avx2_kernels() {
  return {ql_avx2::quantize_rows_avx2, ql_avx2::gemm_avx2, ql_avx2::gemm_f32_avx2, ql_avx2::quantize_rows_i16, ql_avx2::gemm_i16};
}
}  // namespace trillium::kernels

#endif  // x86-64
