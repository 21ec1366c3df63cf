// Block-quantized linear layer: out[M, N] = x[M, K] . W[N, K]^T (+ bias), the weight matmuls of a
// model served from a quantized GGUF file without dequantizing it.
//
// Weights. W[n][k] = scale[n][k / 32] * q[n][k] + min[n][k / 32], with integer codes q of `bits`
// bits (4: q in [0, 15]; 8: q in [-128, 127]) in blocks of 32 along K. This is exactly GGUF's Q4_0
// (min = -8 * scale), Q4_1 and Q8_0 (min = 0), so those files load without any loss.
//
// Activations, two modes:
//  - exact (int8_activations = false, the default): fp32 activations times the dequantized weights
//    (scale * code + min, one fma per weight into an fp32 panel), fp32 accumulation. Equal to an
//    fp32 matmul over the dequantized weights up to summation order: what Hugging Face computes.
//  - int8 (int8_activations = true): each call quantizes x per row and 32-wide block to int8
//    (scale = max|x| / 127, nearest-even), as llama.cpp does (its Q8_1), and accumulates the
//    integer products exactly in int32 before scaling in fp32. Faster at large batches, but the
//    activation rounding moves a small model's logits visibly (relative error ~1e-3 per matmul).
//
// Packed layout (quant_linear_pack writes it; callers treat it as opaque bytes). Output features
// go in groups of 8, and groups in tiles of 4 (N padded with zero codes to a multiple of 32). The
// codes of group g's 8 x 32 weights in block b are one contiguous record:
//   bits 8: 8 k-quads x [8 columns x 4 consecutive k] int8            (256 bytes)
//   bits 4: 4 vectors x [8 columns x 4 consecutive k] bytes            (128 bytes), the low nibble
//           holding k-quad p and the high nibble k-quad p + 4 of the block
// Records go tile-major: [tile g / 4][block b][g % 4], and scales / mins (8 floats per record)
// the same way. One 32-byte load thus feeds 8 output columns, which is what the integer
// dot-product instructions (pmaddubsw / vpdpbusd) want; and a thread computing whole tiles reads
// its weights as one sequential stream. (Groups outer, blocks inner, made each group a separate
// stream only K / 32 records long, 4.6 KB at K = 576: too short for the hardware prefetcher, and
// a decode step ran at half the machine's memory bandwidth.)
//
// Framework-free: raw pointers, sizes and strides (in elements); no Python, no torch.
#pragma once

#include <cstdint>

#include "trillium/status.h"

namespace trillium {

constexpr int64_t kQuantBlock = 32;     // weights per scale along K
constexpr int64_t kQuantGroupCols = 8;  // output features per packed group
constexpr int64_t kQuantTileGroups = 4; // groups per tile (see the layout above)

// Packed sizes for an [N, K] weight with `bits` bits per code.
int64_t quant_linear_groups(int64_t out_features);  // groups holding real features (the tiles pad past them)
int64_t quant_linear_packed_bytes(int64_t out_features, int64_t in_features, int32_t bits);
int64_t quant_linear_scale_count(int64_t out_features, int64_t in_features);  // floats in scales (and in mins)

// A packed weight, as quant_linear_pack wrote it. Read-only for the kernels.
struct QuantWeightView {
  int64_t out_features = 0;  // N
  int64_t in_features = 0;   // K, a multiple of kQuantBlock
  int32_t bits = 0;          // 4 or 8
  const void* codes = nullptr;   // quant_linear_packed_bytes(N, K, bits) bytes
  const float* scales = nullptr; // quant_linear_scale_count(N, K) floats
  const float* mins = nullptr;   // same count, or null when every min is 0 (Q8_0): not read then
};

// Pack row-major codes q[N][K] (int8; 4-bit codes in [0, 15]) and per-block scale[N][K/32],
// min[N][K/32] into the layout above. Output buffers must have the sizes above; `packed_mins` may
// be null (the mins are then not packed: pass null as QuantWeightView::mins, meaning all zero).
// kInvalidArgument for bad sizes, bits other than 4/8, or a 4-bit code outside [0, 15].
Status quant_linear_pack(const int8_t* codes, const float* scale, const float* min, int64_t out_features,
                         int64_t in_features, int32_t bits, void* packed_codes, float* packed_scales,
                         float* packed_mins);

struct QuantLinearArgs {
  const float* x = nullptr;  // [M, K], row stride x_stride (>= K)
  int64_t num_rows = 0;      // M (0 is allowed: nothing to do)
  int64_t x_stride = 0;
  QuantWeightView weight;
  const float* bias = nullptr;  // [N] or null
  float* out = nullptr;         // [M, N], row stride out_stride (>= N); must not overlap x
  int64_t out_stride = 0;
  int num_threads = 0;          // 0: the OpenMP default
  bool int8_activations = false;  // see "Activations" above
};

// out = x . W^T + bias. kInvalidArgument (nothing written) for inconsistent sizes or null pointers.
// Uses AVX2 (AVX-512: the same integer loops with 32 registers, and 512-bit fp32 tiles for the
// exact path) when the active kernel ISA (kernel_isa(), trillium/cpu_isa.h) is AVX2 or better,
// else a portable scalar path with the same arithmetic.
Status quant_linear(const QuantLinearArgs& args);

}  // namespace trillium
