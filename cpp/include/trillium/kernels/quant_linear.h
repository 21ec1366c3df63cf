// Block-quantized linear layer: out[M, N] = x[M, K] . W[N, K]^T (+ bias), the weight matmuls of a
// model served from a quantized GGUF file without dequantizing it.
//
// Weights. W[n][k] = scale[n][s] * q[n][k] + min[n][s], with integer codes q of `bits` bits in
// blocks of 32 along K, and s the scale block of k: every 32 weights, or every 16 for 6-bit codes.
// The formats (each GGUF type loads without any loss; its scales are products of the file's fp16
// and integer scales, exact in fp32):
//
//   bits  codes       scale per  no mins (mins == null) means   GGUF types
//   4     [0, 15]     32         q - 8                          Q4_0 (no mins), Q4_1, Q4_K (mins)
//   5     [0, 31]     32         q - 16                         Q5_0 (no mins), Q5_1, Q5_K (mins)
//   6     [0, 63]     16         q - 32                         Q6_K (no mins)
//   8     [-128, 127] 32         q                              Q8_0 (no mins)
//
// Without mins, w = fma(q, scale, -offset * scale) with offset a power of two: -offset * scale is
// exact, so w is scale * (q - offset) rounded once -- what the dequantized file holds.
//
// Activations, two modes:
//  - exact (int8_activations = false, the default): fp32 activations times the dequantized weights
//    (scale * code + min, one fma per weight into an fp32 panel), fp32 accumulation. Equal to an
//    fp32 matmul over the dequantized weights up to summation order: what Hugging Face computes.
//  - int8 (int8_activations = true): each call quantizes x per row and 32-wide block to int8
//    (scale = max|x| / 127, nearest-even), as llama.cpp does (its Q8_1), and accumulates the
//    integer products exactly in int32 before scaling in fp32. Faster at large batches, but the
//    activation rounding moves a small model's logits visibly (relative error ~1e-3 per matmul).
//  - int16 (kInt16): x rounded per row and 32-wide block to int16 (scale = max|x| / 32767), every
//    weight format, integer products summed exactly in int32 per scale block (pmaddwd), then
//    scaled in fp32: relative error ~1e-5 per matmul, and faster than exact (fewer instructions
//    a weight). Bit-identical on every ISA and for any number of rows.
//
// Packed layout (quant_linear_pack writes it; callers treat it as opaque bytes). Output features
// go in groups of 8, and groups in tiles of 4 (N padded with zero codes to a multiple of 32). The
// codes of group g's 8 x 32 weights in block b are one contiguous record of 32 * bits bytes:
//   bits 8: 8 k-quads x [8 columns x 4 consecutive k] int8            (256 bytes)
//   bits 4: 4 vectors x [8 columns x 4 consecutive k] bytes            (128 bytes), the low nibble
//           holding k-quad p and the high nibble k-quad p + 4 of the block
//   bits 5: the 4-bit record of the low 4 bits, then 32 bytes [8 columns x 4 bytes] whose byte i
//           of column c holds bit 4 of k = 4 p + i in its bit p, p = 0 .. 7   (160 bytes)
//   bits 6: the 4-bit record of the low 4 bits, then two 32-byte vectors h = 0, 1 [8 columns x 4
//           bytes] whose byte i of column c holds bits 4-5 of k = 4 p + i in its bits 2 (p - 4 h),
//           p = 4 h .. 4 h + 3                                               (192 bytes)
// Records go tile-major: [tile g / 4][block b][g % 4]. Scales (and mins) go the same way, with the
// scale blocks of a block in between: [tile][block b][scale block s of b][g % 4][8 columns] (one
// scale block per block except for 6 bits). One 32-byte load thus feeds 8 output columns, which is
// what the SIMD loops want; and a thread computing whole tiles reads its weights as one sequential
// stream. (Groups outer, blocks inner, made each group a separate stream only K / 32 records
// long, 4.6 KB at K = 576: too short for the hardware prefetcher, and a decode step ran at half
// the machine's memory bandwidth.)
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
bool quant_linear_supported_bits(int32_t bits);       // 4, 5, 6 or 8
int32_t quant_linear_scale_blocks(int32_t bits);       // scale blocks per 32-weight block: 2 for 6 bits, else 1
int64_t quant_linear_groups(int64_t out_features);  // groups holding real features (the tiles pad past them)
int64_t quant_linear_packed_bytes(int64_t out_features, int64_t in_features, int32_t bits);
int64_t quant_linear_scale_count(int64_t out_features, int64_t in_features, int32_t bits);  // floats in scales (and in mins)
int64_t quant_linear_super_count(int64_t out_features, int64_t in_features);  // two-level: floats in super scales (mins)

// A packed weight, as quant_linear_pack wrote it. Read-only for the kernels.
struct QuantWeightView {
  int64_t out_features = 0;  // N
  int64_t in_features = 0;   // K, a multiple of kQuantBlock
  int32_t bits = 0;          // 4, 5, 6 or 8
  const void* codes = nullptr;   // quant_linear_packed_bytes(N, K, bits) bytes
  const float* scales = nullptr; // quant_linear_scale_count(N, K, bits) floats (two-level: super scales)
  const float* mins = nullptr;   // same count, or null: the format's symmetric codes (see the table)
  // Two-level scales (GGUF's K-quants keep them so), or null. Then `scales` (and `mins`) hold one
  // fp32 super scale (super min) per feature and 256 weights along K -- quant_linear_super_count
  // floats, [tile][K/256][g % 4][column] -- and `sub_scales` one integer sub-scale per scale block,
  // quant_linear_scale_count bytes laid out like per-block scales (int8 for 6 bits, else uint8),
  // followed by as many uint8 sub-mins when there are mins:
  //   scale = super_scale * sub_scale,  min = super_min * sub_min   (exact in fp32: a Q4_K..Q6_K
  //   super scale is an fp16 value, a sub-scale at most 8 bits)
  // so results are bit-identical to per-block fp32 scales of the same values, from a quarter of
  // the scale bytes (0.75 bits a weight instead of 2 for Q4_K). K must be a multiple of 256.
  const uint8_t* sub_scales = nullptr;
};

// Pack row-major codes q[N][K] (int8, in the format's range) and per-scale-block scale[N][K/S],
// min[N][K/S] (S = 32, or 16 for 6 bits) into the layout above. Output buffers must have the sizes
// above; `min` and `packed_mins` may be null (pass null as QuantWeightView::mins then: the
// format's symmetric codes). kInvalidArgument for bad sizes, unsupported bits, or a code out of range.
Status quant_linear_pack(const int8_t* codes, const float* scale, const float* min, int64_t out_features,
                         int64_t in_features, int32_t bits, void* packed_codes, float* packed_scales,
                         float* packed_mins);

// Pack for two-level scales: codes as quant_linear_pack; super_scale[N][K/256] and super_min
// (or null: symmetric codes) fp32; sub_scale[N][K/S] (int8 for 6 bits, else 0..255) and sub_min[N][K/32]
// (uint8, null exactly when super_min is). Outputs: packed codes, quant_linear_super_count floats in
// packed_super (and packed_super_min), quant_linear_scale_count bytes in packed_sub (and
// packed_sub_min: QuantWeightView::sub_scales + quant_linear_scale_count for a whole weight; a
// caller packing a weight a few tiles of rows at a time places each part). kInvalidArgument for
// bad sizes (K not a multiple of 256), bits or codes.
Status quant_linear_pack_two_level(const int8_t* codes, const float* super_scale, const float* super_min,
                                   const int8_t* sub_scale, const uint8_t* sub_min, int64_t out_features,
                                   int64_t in_features, int32_t bits, void* packed_codes, float* packed_super,
                                   float* packed_super_min, uint8_t* packed_sub, uint8_t* packed_sub_min);

// How quant_linear treats the activations x (see "Activations" above).
enum class QuantActivations : int32_t {
  kExact = 0,  // fp32
  kInt8 = 1,   // rounded to int8 per 32-block (llama.cpp's Q8_1): 4- and 8-bit per-block weights only
  kInt16 = 2,  // rounded to int16 per 32-block: every format, ~256x less rounding than int8
};

struct QuantLinearArgs {
  const float* x = nullptr;  // [M, K], row stride x_stride (>= K)
  int64_t num_rows = 0;      // M (0 is allowed: nothing to do)
  int64_t x_stride = 0;
  QuantWeightView weight;
  const float* bias = nullptr;  // [N] or null
  float* out = nullptr;         // [M, N], row stride out_stride (>= N); must not overlap x
  int64_t out_stride = 0;
  int num_threads = 0;          // 0: the OpenMP default
  QuantActivations activations = QuantActivations::kExact;
};

// out = x . W^T + bias. kInvalidArgument (nothing written) for inconsistent sizes or null pointers,
// an unknown activations mode, and for int8 activations with 5- or 6-bit weights or two-level scales (the integer loops take
// 4- and 8-bit codes with per-block scales only).
// Uses AVX2 (AVX-512: the same integer loops with 32 registers, and 512-bit fp32 tiles for the
// exact path) when the active kernel ISA (kernel_isa(), trillium/cpu_isa.h) is AVX2 or better,
// else a portable scalar path with the same arithmetic.
Status quant_linear(const QuantLinearArgs& args);

// A weight whose output rows are stored as consecutive packed parts, each in its own format: a
// fused projection (q, k and v; gate and up) of a file that stores its pieces in different types
// (a Q4_K_M file keeps v in Q6_K beside q and k in Q4_K). Parts share in_features.
constexpr int kMaxQuantParts = 3;
struct QuantWeightParts {
  QuantWeightView part[kMaxQuantParts];
  int32_t count = 1;

  int64_t out_features() const {
    int64_t n = 0;
    for (int32_t i = 0; i < count; ++i) n += part[i].out_features;
    return n;
  }
  int64_t in_features() const { return part[0].in_features; }
};

// quant_linear over the parts in turn, each writing its columns of out (and reading its slice of
// the bias): args.weight is ignored. kInvalidArgument for a count outside [1, kMaxQuantParts],
// parts of different in_features, out_stride below the total, or a part's own error.
Status quant_linear_parts(const QuantLinearArgs& args, const QuantWeightParts& weight);

// Dequantize whole rows of W (output features): out[i][0 .. K) = W[rows[i]][0 .. K), the same fp32
// values the exact path multiplies with. An embedding lookup over a quantized token table: the
// table is a weight [vocab, hidden]. kInvalidArgument (nothing written) for a row outside [0, N)
// or bad sizes.
Status quant_linear_dequantize_rows(const QuantWeightView& weight, const int64_t* rows, int64_t num_rows,
                                    float* out, int64_t out_stride, int num_threads = 0);

}  // namespace trillium
