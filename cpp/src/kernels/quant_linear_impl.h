// Internal to quant_linear*.cc: the per-ISA entry points of the block-quantized linear kernel and
// the activation buffers they share. Every ISA computes bit-identical results: the same int8
// activation codes, exact int32 block dot products, and the same fp32 fma order per block.
#pragma once

#include <cstdint>

#include "trillium/kernels/quant_linear.h"

namespace trillium::kernels {

// Activations quantized per row and 32-wide block (see quant_linear.h).
struct QuantActs {
  const int8_t* codes = nullptr;       // [M][K]
  const float* scale = nullptr;        // [M][K/32]  max|x| / 127
  const float* scaled_sum = nullptr;   // [M][K/32]  scale * sum(codes of the block)
  int64_t in_features = 0;             // K
  int64_t blocks = 0;                  // K / 32
};

// Activations quantized to int16 per row and 32-wide block (quant_linear_i16.h): codes in k-quad
// order [k0, k2, k1, k3], and the block's scale times the sum of its codes per 16 and per 32.
struct QuantActs16 {
  const int16_t* codes = nullptr;        // [M][K]  nearbyint(x / scale), quad-permuted
  const float* scale = nullptr;          // [M][K/32]  max|x| / 32767
  const float* scaled_sum16 = nullptr;   // [M][K/16]  scale * sum(codes of the 16)
  const float* scaled_sum32 = nullptr;   // [M][K/32]  scale * sum(codes of the block)
  int64_t in_features = 0;               // K
  int64_t blocks = 0;                    // K / 32
};

// Quantize rows [row_begin, row_end) of x into the buffers (indexed by absolute row).
using QuantizeRowsFn = void (*)(const float* x, int64_t x_stride, int64_t row_begin, int64_t row_end,
                                int64_t in_features, int8_t* codes, float* scale, float* scaled_sum);
// out rows [row_begin, row_end) x output groups [group_begin, group_end) (8 features each).
using GemmTileFn = void (*)(const QuantActs& acts, const QuantWeightView& w, int64_t row_begin, int64_t row_end,
                            int64_t group_begin, int64_t group_end, const float* bias, float* out,
                            int64_t out_stride);

// fp32 activations (the exact path): out rows [row_begin, row_end) x output groups
// [group_begin, group_end), weights dequantized (scale * code + min, one fma) into fp32 panels.
// `panel` is scratch for kQuantTileGroups * kQuantGroupCols x K floats, owned by the calling thread.
using GemmF32Fn = void (*)(const float* x, int64_t x_stride, const QuantWeightView& w, int64_t row_begin,
                           int64_t row_end, int64_t group_begin, int64_t group_end, const float* bias, float* out,
                           int64_t out_stride, float* panel);

// The int16 path: quantize rows into QuantActs16's buffers; out rows x output groups from them.
using QuantizeRows16Fn = void (*)(const float* x, int64_t x_stride, int64_t row_begin, int64_t row_end,
                                  int64_t in_features, int16_t* codes, float* scale, float* scaled_sum16,
                                  float* scaled_sum32);
using GemmTile16Fn = void (*)(const QuantActs16& acts, const QuantWeightView& w, int64_t row_begin, int64_t row_end,
                              int64_t group_begin, int64_t group_end, const float* bias, float* out,
                              int64_t out_stride);

struct QuantLinearKernels {
  QuantizeRowsFn quantize = nullptr;
  GemmTileFn gemm = nullptr;
  GemmF32Fn gemm_f32 = nullptr;
  QuantizeRows16Fn quantize16 = nullptr;
  GemmTile16Fn gemm16 = nullptr;
};

QuantLinearKernels quant_linear_portable_kernels();
#if defined(__x86_64__)
QuantLinearKernels quant_linear_avx2_kernels();
QuantLinearKernels quant_linear_avx512_kernels();  // the same loops, 32 registers: bigger register tiles
QuantLinearKernels quant_linear_avx512vnni_kernels();  // the same again, int16 dots as vpdpwssd
#endif

// Index of the record (group g, block b) in the packed layout (quant_linear.h), nb = K / 32:
// codes at record * block bytes, scales and mins at record * kQuantGroupCols.
inline int64_t quant_record(int64_t g, int64_t b, int64_t nb) {
  return ((g / kQuantTileGroups) * nb + b) * kQuantTileGroups + g % kQuantTileGroups;
}

// Scale blocks per 32-weight block: 16-weight scales for 6-bit codes (GGUF's Q6_K), else one.
constexpr int64_t quant_scale_blocks(int32_t bits) { return bits == 6 ? 2 : 1; }

// Index of the first of the 8 scales (and mins) of group g, block b, scale block s (quant_linear.h:
// [tile][block][scale block][g % 4][column]); sb = quant_scale_blocks(bits). With one scale block
// this is quant_record(g, b, nb) * kQuantGroupCols.
inline int64_t quant_scale_index(int64_t g, int64_t b, int64_t s, int64_t nb, int64_t sb) {
  return (((g / kQuantTileGroups) * nb + b) * sb + s) * (kQuantTileGroups * kQuantGroupCols) +
         (g % kQuantTileGroups) * kQuantGroupCols;
}

// Two-level scales (quant_linear.h): index of the first of the 8 super scales of group g for the
// 256 weights holding block b; and where a weight's sub-mins start in its sub-scale bytes.
constexpr int64_t kSuperBlocks = 8;  // 32-weight blocks per 256-weight super block
inline int64_t quant_super_index(int64_t g, int64_t b, int64_t nb) {
  return ((g / kQuantTileGroups) * (nb / kSuperBlocks) + b / kSuperBlocks) * (kQuantTileGroups * kQuantGroupCols) +
         (g % kQuantTileGroups) * kQuantGroupCols;
}
// quant_linear_scale_count, inline: the exact path's inner loops find each block's sub-mins with
// it, and a call there (a function of another file) made the compiler spill and reload every
// vector register around it -- a Q4_K / Q5_K projection ran at half the speed of Q6_K's.
// quant_linear_groups, inline; and those groups rounded up to whole tiles: what the packed
// buffers hold.
inline int64_t quant_groups(int64_t out_features) { return (out_features + kQuantGroupCols - 1) / kQuantGroupCols; }
inline int64_t quant_padded_groups(int64_t out_features) {
  return (quant_groups(out_features) + kQuantTileGroups - 1) / kQuantTileGroups * kQuantTileGroups;
}
inline int64_t quant_scale_count(int64_t out_features, int64_t in_features, int32_t bits) {
  return quant_padded_groups(out_features) * (in_features / kQuantBlock) * quant_scale_blocks(bits) * kQuantGroupCols;
}
inline int64_t quant_sub_min_offset(const QuantWeightView& w) {
  return quant_scale_count(w.out_features, w.in_features, w.bits);
}

// What a missing min stands for: w = scale * (q - offset) for the format's unsigned codes, offset
// a power of two so that -offset * scale is exact (8-bit codes are signed: offset 0).
constexpr float quant_symmetric_offset(int32_t bits) { return bits == 8 ? 0.0f : static_cast<float>(1 << (bits - 1)); }

// Scale of one 32-wide activation block and its reciprocal, computed identically by every ISA.
inline void quant_block_scale(float amax, float* scale, float* inv_scale) {
  *scale = amax / 127.0f;
  *inv_scale = *scale != 0.0f ? 1.0f / *scale : 0.0f;
}

// The int16 path's block scale: max|x| / 32767 and its reciprocal.
inline void quant_block_scale_i16(float amax, float* scale, float* inv_scale) {
  *scale = amax / 32767.0f;
  *inv_scale = *scale != 0.0f ? 1.0f / *scale : 0.0f;
}

}  // namespace trillium::kernels
