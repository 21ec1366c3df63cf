// Internal: the AVX-512 block-quantized linear kernels, included inside a target region and a
// namespace by quant_linear_avx512.cc (AVX-512F/BW/VL) and quant_linear_avx512vnni.cc (the same
// + VNNI, which defines TRILLIUM_QL_VNNI first so the int16 dots are vpdpwssd). One text, two
// compilations: the VNNI one is bit-identical, fewer instructions.

// The exact path's tiles are the 512-bit ones (quant_linear_zmm.h), not the 256-bit ones.
#define TRILLIUM_QL_EXACT_ZMM
#include "kernels/quant_linear_simd.h"
#include "kernels/quant_linear_zmm.h"
// int16 path: rows per tile and the largest rows x groups tile (32 registers).
constexpr int kI16Rows = 6;
constexpr int kI16MaxTile = 8;
// Up to kI16DirectRows rows read codes straight into registers (whole tiles: 512-bit register tiles
// of up to kI16ZmmRows rows x 2 pairs of groups); more go through a panel, in 512-bit register
// tiles of kI16PanelRows rows x 2 pairs (TRILLIUM_QL_I16_ZMM).
constexpr int64_t kI16DirectRows = 32;
constexpr int64_t kI16ZmmRows = 4;
constexpr int kI16PanelRows = 6;
#define TRILLIUM_QL_I16_ZMM
#include "kernels/quant_linear_i16.h"
#undef TRILLIUM_QL_I16_ZMM
#undef TRILLIUM_QL_EXACT_ZMM
