// Block-quantized linear layer: validation, packing, the portable path and the ISA dispatch.
// The SIMD inner loops live in kernels/quant_linear_simd.h, compiled per ISA by
// quant_linear_avx2.cc and quant_linear_avx512.cc.
#include "trillium/kernels/quant_linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kernels/quant_linear_impl.h"
#include "trillium/cpu_isa.h"

namespace trillium {

using kernels::QuantActs;
using kernels::QuantLinearKernels;

namespace {

constexpr int64_t kRowChunk = 64;      // rows whose int8 codes stay in L2 while weights stream past
constexpr int64_t kGroupsPerItem = kQuantTileGroups;  // one tile (32 output features) per work item

int64_t block_bytes(int32_t bits) { return kQuantBlock * kQuantGroupCols * bits / 8; }
int64_t scale_block_size(int32_t bits) { return kQuantBlock / kernels::quant_scale_blocks(bits); }

Status bad(const std::string& what) { return Status::InvalidArgument("quant_linear: " + what); }

// ----------------------------------------------------------------------------- portable kernels
void quantize_rows_portable(const float* x, int64_t x_stride, int64_t row_begin, int64_t row_end, int64_t K,
                            int8_t* codes, float* scale, float* scaled_sum) {
  const int64_t nb = K / kQuantBlock;
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + r * x_stride + b * kQuantBlock;
      float amax = 0.0f;
      for (int64_t i = 0; i < kQuantBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
      float d = 0.0f, id = 0.0f;
      kernels::quant_block_scale(amax, &d, &id);
      int32_t sum = 0;
      int8_t* q = codes + r * K + b * kQuantBlock;
      for (int64_t i = 0; i < kQuantBlock; ++i) {
        // nearbyint: round to nearest, ties to even -- what cvtps2dq does in the SIMD paths.
        const float v = std::nearbyint(xb[i] * id);
        const int32_t c = static_cast<int32_t>(std::min(127.0f, std::max(-127.0f, v)));
        q[i] = static_cast<int8_t>(c);
        sum += c;
      }
      scale[r * nb + b] = d;
      scaled_sum[r * nb + b] = d * static_cast<float>(sum);
    }
  }
}

void quantize_rows_i16_portable(const float* x, int64_t x_stride, int64_t row_begin, int64_t row_end, int64_t K,
                                int16_t* codes, float* scale, float* scaled_sum16, float* scaled_sum32) {
  const int64_t nb = K / kQuantBlock;
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + r * x_stride + b * kQuantBlock;
      float amax = 0.0f;
      for (int64_t i = 0; i < kQuantBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
      float d = 0.0f, id = 0.0f;
      kernels::quant_block_scale_i16(amax, &d, &id);
      int32_t sum[2] = {0, 0};
      int16_t* q = codes + r * K + b * kQuantBlock;
      for (int64_t i = 0; i < kQuantBlock; ++i) {
        const float v = std::nearbyint(xb[i] * id);  // ties to even, as cvtps2dq
        const int32_t c = static_cast<int32_t>(std::min(32767.0f, std::max(-32767.0f, v)));
        // Quad order [k0, k2, k1, k3] (kernels/quant_linear_i16.h).
        const int64_t j = i % 4;
        q[i - j + (j == 1 ? 2 : j == 2 ? 1 : j)] = static_cast<int16_t>(c);
        sum[i / 16] += c;
      }
      scale[r * nb + b] = d;
      scaled_sum16[r * 2 * nb + 2 * b] = d * static_cast<float>(sum[0]);
      scaled_sum16[r * 2 * nb + 2 * b + 1] = d * static_cast<float>(sum[1]);
      scaled_sum32[r * nb + b] = d * static_cast<float>(sum[0] + sum[1]);
    }
  }
}

// Code of weight (column c of group g, k) in the packed layout.
inline int32_t packed_code(const QuantWeightView& w, int64_t g, int64_t c, int64_t k) {
  const int64_t nb = w.in_features / kQuantBlock, b = k / kQuantBlock, kk = k % kQuantBlock;
  const int64_t quad = kk / 4, j = kk % 4;
  const uint8_t* base = static_cast<const uint8_t*>(w.codes) + kernels::quant_record(g, b, nb) * block_bytes(w.bits);
  if (w.bits == 8) return static_cast<int8_t>(base[quad * 32 + c * 4 + j]);
  const uint8_t byte = base[(quad % 4) * 32 + c * 4 + j];
  const int32_t low = quad < 4 ? (byte & 0x0F) : (byte >> 4);
  if (w.bits == 5) return low | (((base[128 + c * 4 + j] >> quad) & 1) << 4);
  if (w.bits == 6) return low | (((base[128 + (quad / 4) * 32 + c * 4 + j] >> (2 * (quad % 4))) & 3) << 4);
  return low;
}

// The min that no mins stand for, as the SIMD paths compute it (+0 for 8 bits, not -0 * scale).
inline float symmetric_min(int32_t bits, float scale) {
  return bits == 8 ? 0.0f : -kernels::quant_symmetric_offset(bits) * scale;
}

// Scale and min of weight (column c of group g, k): the format's symmetric min without mins.
inline void packed_scale_min(const QuantWeightView& w, int64_t g, int64_t c, int64_t k, float* scale, float* min) {
  const int64_t nb = w.in_features / kQuantBlock, sb = kernels::quant_scale_blocks(w.bits);
  const int64_t at = kernels::quant_scale_index(g, k / kQuantBlock, (k % kQuantBlock) / scale_block_size(w.bits), nb, sb) + c;
  if (w.sub_scales) {  // two-level: super * sub, exact
    const int64_t sup = kernels::quant_super_index(g, k / kQuantBlock, nb) + c;
    const float sub = w.bits == 6 ? static_cast<float>(static_cast<int8_t>(w.sub_scales[at])) : w.sub_scales[at];
    *scale = w.scales[sup] * sub;
    *min = w.mins ? w.mins[sup] * static_cast<float>(w.sub_scales[kernels::quant_sub_min_offset(w) + at])
                  : symmetric_min(w.bits, *scale);
    return;
  }
  *scale = w.scales[at];
  *min = w.mins ? w.mins[at] : symmetric_min(w.bits, w.scales[at]);
}

void gemm_portable(const QuantActs& a, const QuantWeightView& w, int64_t row_begin, int64_t row_end,
                   int64_t group_begin, int64_t group_end, const float* bias, float* out, int64_t out_stride) {
  const int64_t nb = a.blocks, K = a.in_features, N = w.out_features;
  for (int64_t g = group_begin; g < group_end; ++g) {
    for (int64_t c = 0; c < kQuantGroupCols; ++c) {
      const int64_t n = g * kQuantGroupCols + c;
      if (n >= N) break;
      for (int64_t r = row_begin; r < row_end; ++r) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          int32_t dot = 0;
          const int8_t* q = a.codes + r * K + b * kQuantBlock;
          for (int64_t kk = 0; kk < kQuantBlock; ++kk) dot += packed_code(w, g, c, b * kQuantBlock + kk) * q[kk];
          float dw = 0.0f, mw = 0.0f;  // the int8 path takes 4 and 8 bits: one scale per block
          packed_scale_min(w, g, c, b * kQuantBlock, &dw, &mw);
          acc = std::fma(static_cast<float>(dot), dw * a.scale[r * nb + b], acc);
          acc = std::fma(mw, a.scaled_sum[r * nb + b], acc);
        }
        out[r * out_stride + n] = bias ? acc + bias[n] : acc;
      }
    }
  }
}

// The int16 path's reference (kernels/quant_linear_i16.h): per scale block, the exact integer dot
// product, then acc = fma(float(dot), d * sx, acc) and acc = fma(m, scaled sum, acc).
void gemm_i16_portable(const kernels::QuantActs16& a, const QuantWeightView& w, int64_t row_begin, int64_t row_end,
                       int64_t group_begin, int64_t group_end, const float* bias, float* out, int64_t out_stride) {
  const int64_t nb = a.blocks, K = a.in_features, N = w.out_features;
  const int64_t sb = kernels::quant_scale_blocks(w.bits), size = kQuantBlock / sb;
  static constexpr int64_t kUnpermute[4] = {0, 2, 1, 3};  // where k0..k3 sit in a quad
  for (int64_t g = group_begin; g < group_end; ++g) {
    for (int64_t c = 0; c < kQuantGroupCols; ++c) {
      const int64_t n = g * kQuantGroupCols + c;
      if (n >= N) break;
      for (int64_t r = row_begin; r < row_end; ++r) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          const int16_t* q = a.codes + r * K + b * kQuantBlock;
          for (int64_t s = 0; s < sb; ++s) {
            int32_t dot = 0;
            for (int64_t kk = s * size; kk < (s + 1) * size; ++kk) {
              dot += packed_code(w, g, c, b * kQuantBlock + kk) * q[kk - kk % 4 + kUnpermute[kk % 4]];
            }
            float dw = 0.0f, mw = 0.0f;
            packed_scale_min(w, g, c, b * kQuantBlock + s * size, &dw, &mw);
            const float ss = sb == 2 ? a.scaled_sum16[r * 2 * nb + 2 * b + s] : a.scaled_sum32[r * nb + b];
            acc = std::fma(static_cast<float>(dot), dw * a.scale[r * nb + b], acc);
            acc = std::fma(mw, ss, acc);
          }
        }
        out[r * out_stride + n] = bias ? acc + bias[n] : acc;
      }
    }
  }
}

// The exact path, in the same fma order as the SIMD panels: w = fma(code, scale, min), then
// acc = fma(w, x, acc) along k.
void gemm_f32_portable(const float* x, int64_t x_stride, const QuantWeightView& w, int64_t row_begin,
                       int64_t row_end, int64_t group_begin, int64_t group_end, const float* bias, float* out,
                       int64_t out_stride, float* col) {
  const int64_t K = w.in_features, N = w.out_features;
  for (int64_t g = group_begin; g < group_end; ++g) {
    for (int64_t c = 0; c < kQuantGroupCols; ++c) {
      const int64_t n = g * kQuantGroupCols + c;
      if (n >= N) break;
      for (int64_t k = 0; k < K; ++k) {
        float scale = 0.0f, min = 0.0f;
        packed_scale_min(w, g, c, k, &scale, &min);
        col[k] = std::fma(static_cast<float>(packed_code(w, g, c, k)), scale, min);
      }
      for (int64_t r = row_begin; r < row_end; ++r) {
        const float* xr = x + r * x_stride;
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) acc = std::fma(col[k], xr[k], acc);
        out[r * out_stride + n] = bias ? acc + bias[n] : acc;
      }
    }
  }
}

const QuantLinearKernels& active_kernels() {
  static const QuantLinearKernels portable = kernels::quant_linear_portable_kernels();
#if defined(__x86_64__)
  static const QuantLinearKernels avx2 = kernels::quant_linear_avx2_kernels();
  static const QuantLinearKernels avx512 = kernels::quant_linear_avx512_kernels();
  static const QuantLinearKernels avx512vnni = kernels::quant_linear_avx512vnni_kernels();
  if (kernel_isa() == KernelIsa::kAvx512Vnni) return avx512vnni;
  if (kernel_isa() == KernelIsa::kAvx512) return avx512;
  if (kernel_isa() != KernelIsa::kPortable) return avx2;
#endif
  return portable;
}

}  // namespace

namespace kernels {
QuantLinearKernels quant_linear_portable_kernels() {
  return {quantize_rows_portable, gemm_portable, gemm_f32_portable, quantize_rows_i16_portable, gemm_i16_portable};
}
}  // namespace kernels

// --------------------------------------------------------------------------------------- sizes
bool quant_linear_supported_bits(int32_t bits) { return bits == 4 || bits == 5 || bits == 6 || bits == 8; }

int32_t quant_linear_scale_blocks(int32_t bits) { return static_cast<int32_t>(kernels::quant_scale_blocks(bits)); }

int64_t quant_linear_groups(int64_t out_features) { return kernels::quant_groups(out_features); }

int64_t quant_linear_packed_bytes(int64_t out_features, int64_t in_features, int32_t bits) {
  return kernels::quant_padded_groups(out_features) * (in_features / kQuantBlock) * block_bytes(bits);
}

int64_t quant_linear_scale_count(int64_t out_features, int64_t in_features, int32_t bits) {
  return kernels::quant_scale_count(out_features, in_features, bits);
}

int64_t quant_linear_super_count(int64_t out_features, int64_t in_features) {
  return kernels::quant_padded_groups(out_features) * (in_features / (kQuantBlock * kernels::kSuperBlocks)) *
         kQuantGroupCols;
}

// ------------------------------------------------------------------------------------- packing
namespace {

Status check_pack(const int8_t* codes, int64_t N, int64_t K, int32_t bits, const void* packed_codes) {
  if (!quant_linear_supported_bits(bits)) return bad("bits must be 4, 5, 6 or 8, got " + std::to_string(bits));
  if (N <= 0 || K <= 0 || K % kQuantBlock != 0) {
    return bad("need out_features > 0 and in_features a positive multiple of 32, got " + std::to_string(N) + ", " +
               std::to_string(K));
  }
  if (!codes || !packed_codes) return bad("null pointer");
  if (bits != 8) {
    // A branch-free scan first (it vectorizes: loading a model checks every code), then the
    // first bad code found for the message.
    const auto top = static_cast<uint8_t>((1 << bits) - 1);
    const auto* bytes = reinterpret_cast<const uint8_t*>(codes);  // a negative code reads as > top
    uint8_t worst = 0;
    for (int64_t i = 0; i < N * K; ++i) worst = std::max(worst, bytes[i]);
    if (worst > top) {
      const int8_t* bad_code = std::find_if(codes, codes + N * K, [&](int8_t q) { return static_cast<uint8_t>(q) > top; });
      return bad(std::to_string(bits) + "-bit codes must be in [0, " + std::to_string(top) + "], got " +
                 std::to_string(*bad_code));
    }
  }
  return Status::Ok();
}

// The codes of every record (quant_linear.h's layout); padding columns stay zero.
void pack_codes(const int8_t* codes, int64_t N, int64_t K, int32_t bits, void* packed_codes) {
  const int64_t nb = K / kQuantBlock, groups = quant_linear_groups(N);
  auto* out = static_cast<uint8_t*>(packed_codes);
  std::memset(out, 0, static_cast<size_t>(quant_linear_packed_bytes(N, K, bits)));
  // Each group of columns fills records of its own: groups pack in parallel (a model's load).
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = out + kernels::quant_record(g, b, nb) * block_bytes(bits);
      for (int64_t c = 0; c < kQuantGroupCols; ++c) {
        const int64_t n = g * kQuantGroupCols + c;
        if (n >= N) continue;
        for (int64_t kk = 0; kk < kQuantBlock; ++kk) {
          const int64_t quad = kk / 4, j = kk % 4;
          const int8_t q = codes[n * K + b * kQuantBlock + kk];
          if (bits == 8) {
            dst[quad * 32 + c * 4 + j] = static_cast<uint8_t>(q);
            continue;
          }
          const auto u = static_cast<uint8_t>(q);
          dst[(quad % 4) * 32 + c * 4 + j] |= static_cast<uint8_t>(quad < 4 ? (u & 0x0F) : (u & 0x0F) << 4);
          if (bits == 5) dst[128 + c * 4 + j] |= static_cast<uint8_t>(((u >> 4) & 1) << quad);
          if (bits == 6) dst[128 + (quad / 4) * 32 + c * 4 + j] |= static_cast<uint8_t>(((u >> 4) & 3) << (2 * (quad % 4)));
        }
      }
    }
  }
}

// Per-scale-block values src[N][K/S] into the scale layout (T: float scales, or sub-scale bytes).
template <typename T>
void pack_scale_blocks(const T* src, int64_t N, int64_t K, int32_t bits, T* dst) {
  const int64_t nb = K / kQuantBlock, groups = quant_linear_groups(N);
  const int64_t sb = kernels::quant_scale_blocks(bits), ns = K / scale_block_size(bits);
  std::memset(dst, 0, static_cast<size_t>(quant_linear_scale_count(N, K, bits)) * sizeof(T));
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t c = 0; c < kQuantGroupCols; ++c) {
        const int64_t n = g * kQuantGroupCols + c;
        if (n >= N) continue;  // padding columns: zero scale
        for (int64_t s = 0; s < sb; ++s) dst[kernels::quant_scale_index(g, b, s, nb, sb) + c] = src[n * ns + b * sb + s];
      }
    }
  }
}

}  // namespace

Status quant_linear_pack(const int8_t* codes, const float* scale, const float* min, int64_t N, int64_t K,
                         int32_t bits, void* packed_codes, float* packed_scales, float* packed_mins) {
  if (Status st = check_pack(codes, N, K, bits, packed_codes); !st.ok()) return st;
  if (!scale || !packed_scales) return bad("null pointer");
  if ((min == nullptr) != (packed_mins == nullptr)) return bad("min and packed_mins must both be given or both null");
  pack_codes(codes, N, K, bits, packed_codes);
  pack_scale_blocks(scale, N, K, bits, packed_scales);
  if (packed_mins) pack_scale_blocks(min, N, K, bits, packed_mins);
  return Status::Ok();
}

Status quant_linear_pack_two_level(const int8_t* codes, const float* super_scale, const float* super_min,
                                   const int8_t* sub_scale, const uint8_t* sub_min, int64_t N, int64_t K,
                                   int32_t bits, void* packed_codes, float* packed_super, float* packed_super_min,
                                   uint8_t* packed_sub, uint8_t* packed_sub_min) {
  if (Status st = check_pack(codes, N, K, bits, packed_codes); !st.ok()) return st;
  if (K % (kQuantBlock * kernels::kSuperBlocks) != 0) return bad("two-level scales need in_features a multiple of 256");
  if (!super_scale || !sub_scale || !packed_super || !packed_sub) return bad("null pointer");
  if ((super_min == nullptr) != (sub_min == nullptr) || (super_min == nullptr) != (packed_super_min == nullptr) ||
      (super_min == nullptr) != (packed_sub_min == nullptr)) {
    return bad("super_min, sub_min, packed_super_min and packed_sub_min must all be given or all null");
  }
  if (bits == 6 && super_min) return bad("6-bit two-level weights are symmetric (no mins)");
  pack_codes(codes, N, K, bits, packed_codes);
  const int64_t nb = K / kQuantBlock, groups = quant_linear_groups(N), supers = K / (kQuantBlock * kernels::kSuperBlocks);
  const auto super_bytes = static_cast<size_t>(quant_linear_super_count(N, K)) * sizeof(float);
  std::memset(packed_super, 0, super_bytes);
  if (packed_super_min) std::memset(packed_super_min, 0, super_bytes);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < nb; b += kernels::kSuperBlocks) {
      for (int64_t c = 0; c < kQuantGroupCols; ++c) {
        const int64_t n = g * kQuantGroupCols + c;
        if (n >= N) continue;
        const int64_t at = kernels::quant_super_index(g, b, nb) + c;
        packed_super[at] = super_scale[n * supers + b / kernels::kSuperBlocks];
        if (packed_super_min) packed_super_min[at] = super_min[n * supers + b / kernels::kSuperBlocks];
      }
    }
  }
  pack_scale_blocks(reinterpret_cast<const uint8_t*>(sub_scale), N, K, bits, packed_sub);
  if (sub_min) pack_scale_blocks(sub_min, N, K, bits, packed_sub_min);
  return Status::Ok();
}

// ------------------------------------------------------------------------------------- the op
Status quant_linear(const QuantLinearArgs& a) {
  const QuantWeightView& w = a.weight;
  if (!quant_linear_supported_bits(w.bits)) return bad("weight bits must be 4, 5, 6 or 8, got " + std::to_string(w.bits));
  if (w.out_features <= 0 || w.in_features <= 0 || w.in_features % kQuantBlock != 0) {
    return bad("weight needs out_features > 0 and in_features a positive multiple of 32");
  }
  if (!w.codes || !w.scales) return bad("weight codes and scales must not be null");
  if (a.num_rows < 0) return bad("num_rows must be >= 0");
  if (a.num_rows == 0) return Status::Ok();
  if (!a.x || !a.out) return bad("x and out must not be null");
  if (a.x_stride < w.in_features || a.out_stride < w.out_features) {
    return bad("x_stride must be >= in_features and out_stride >= out_features");
  }
  if (a.activations != QuantActivations::kExact && a.activations != QuantActivations::kInt8 &&
      a.activations != QuantActivations::kInt16) {
    return bad("activations must be exact, int8 or int16");
  }
  const bool int8 = a.activations == QuantActivations::kInt8;
  if (int8 && ((w.bits != 4 && w.bits != 8) || w.sub_scales)) {
    return bad("int8 activations take 4- and 8-bit weights with per-block scales, got " + std::to_string(w.bits) +
               " bits" + (w.sub_scales ? " with two-level scales" : ""));
  }
  if (w.sub_scales && w.in_features % (kQuantBlock * kernels::kSuperBlocks) != 0) {
    return bad("two-level scales need in_features a multiple of 256");
  }
  const int64_t M = a.num_rows, K = w.in_features, nb = K / kQuantBlock;
  const QuantLinearKernels& k = active_kernels();
  const int64_t groups = quant_linear_groups(w.out_features);
  const int64_t row_chunks = (M + kRowChunk - 1) / kRowChunk;
  const int64_t group_items = (groups + kGroupsPerItem - 1) / kGroupsPerItem;
  const int64_t items = row_chunks * group_items;
#if defined(_OPENMP)
  const int threads = a.num_threads > 0 ? a.num_threads : omp_get_max_threads();
#endif
  if (a.activations == QuantActivations::kExact) {
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t item = 0; item < items; ++item) {
      const int64_t chunk = item / group_items, gi = item % group_items;
      const int64_t r0 = chunk * kRowChunk, r1 = std::min(M, r0 + kRowChunk);
      const int64_t g0 = gi * kGroupsPerItem, g1 = std::min(groups, g0 + kGroupsPerItem);
      thread_local std::vector<float> panel;  // per OpenMP thread, reused across calls
      const auto panel_floats = static_cast<size_t>(K * kQuantTileGroups * kQuantGroupCols);
      if (panel.size() < panel_floats) panel.resize(panel_floats);
      k.gemm_f32(a.x, a.x_stride, w, r0, r1, g0, g1, a.bias, a.out, a.out_stride, panel.data());
    }
    return Status::Ok();
  }
  // Rounded activations: every row quantized, then the work items, in one OpenMP team.
  const auto rounded = [&](auto&& quantize_row, auto&& gemm_rows) {
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
#endif
    {
#if defined(_OPENMP)
#pragma omp for schedule(static)
#endif
      for (int64_t r = 0; r < M; ++r) quantize_row(r);
#if defined(_OPENMP)
#pragma omp for schedule(static)
#endif
      for (int64_t item = 0; item < items; ++item) {
        const int64_t chunk = item / group_items, gi = item % group_items;
        const int64_t r0 = chunk * kRowChunk, r1 = std::min(M, r0 + kRowChunk);
        const int64_t g0 = gi * kGroupsPerItem, g1 = std::min(groups, g0 + kGroupsPerItem);
        gemm_rows(r0, r1, g0, g1);
      }
    }
  };
  if (a.activations == QuantActivations::kInt16) {
    // Per calling thread, reused: a decode step calls this ~7 times a layer.
    thread_local std::vector<int16_t> codes16;
    thread_local std::vector<float> scale16, sum16, sum32;
    codes16.resize(static_cast<size_t>(M * K));
    scale16.resize(static_cast<size_t>(M * nb));
    sum16.resize(static_cast<size_t>(M * nb * 2));
    sum32.resize(static_cast<size_t>(M * nb));
    const kernels::QuantActs16 acts{codes16.data(), scale16.data(), sum16.data(), sum32.data(), K, nb};
    int16_t* c16 = codes16.data();
    float *s16 = scale16.data(), *u16 = sum16.data(), *u32 = sum32.data();
    rounded([&](int64_t r) { k.quantize16(a.x, a.x_stride, r, r + 1, K, c16, s16, u16, u32); },
            [&](int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
              k.gemm16(acts, w, r0, r1, g0, g1, a.bias, a.out, a.out_stride);
            });
    return Status::Ok();
  }
  std::vector<int8_t> codes(static_cast<size_t>(M * K));
  std::vector<float> scale(static_cast<size_t>(M * nb)), scaled_sum(static_cast<size_t>(M * nb));
  const QuantActs acts{codes.data(), scale.data(), scaled_sum.data(), K, nb};
  rounded([&](int64_t r) { k.quantize(a.x, a.x_stride, r, r + 1, K, codes.data(), scale.data(), scaled_sum.data()); },
          [&](int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
            k.gemm(acts, w, r0, r1, g0, g1, a.bias, a.out, a.out_stride);
          });
  return Status::Ok();
}

Status quant_linear_parts(const QuantLinearArgs& args, const QuantWeightParts& w) {
  if (w.count < 1 || w.count > kMaxQuantParts) return bad("parts count must be in [1, 3], got " + std::to_string(w.count));
  for (int32_t i = 1; i < w.count; ++i) {
    if (w.part[i].in_features != w.part[0].in_features) return bad("parts must share in_features");
  }
  if (args.out_stride < w.out_features()) return bad("out_stride must be >= the parts' total out_features");
  QuantLinearArgs a = args;
  int64_t offset = 0;
  for (int32_t i = 0; i < w.count; ++i) {
    a.weight = w.part[i];
    a.out = args.out ? args.out + offset : nullptr;
    a.bias = args.bias ? args.bias + offset : nullptr;
    const Status status = quant_linear(a);
    if (!status.ok()) return status;
    offset += w.part[i].out_features;
  }
  return Status::Ok();
}

// --------------------------------------------------------------------------------- row lookup
Status quant_linear_dequantize_rows(const QuantWeightView& w, const int64_t* rows, int64_t num_rows, float* out,
                                    int64_t out_stride, int num_threads) {
  if (!quant_linear_supported_bits(w.bits)) return bad("weight bits must be 4, 5, 6 or 8, got " + std::to_string(w.bits));
  if (w.out_features <= 0 || w.in_features <= 0 || w.in_features % kQuantBlock != 0) {
    return bad("weight needs out_features > 0 and in_features a positive multiple of 32");
  }
  if (num_rows < 0) return bad("num_rows must be >= 0");
  if (num_rows == 0) return Status::Ok();
  if (!w.codes || !w.scales || !rows || !out) return bad("null pointer");
  if (w.sub_scales && w.in_features % (kQuantBlock * kernels::kSuperBlocks) != 0) {
    return bad("two-level scales need in_features a multiple of 256");
  }
  if (out_stride < w.in_features) return bad("out_stride must be >= in_features");
  for (int64_t i = 0; i < num_rows; ++i) {
    if (rows[i] < 0 || rows[i] >= w.out_features) {
      return bad("row " + std::to_string(rows[i]) + " is outside [0, " + std::to_string(w.out_features) + ")");
    }
  }
  const int64_t K = w.in_features;
#if defined(_OPENMP)
  const int threads = num_threads > 0 ? num_threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(threads) if (num_rows > 16)
#endif
  for (int64_t i = 0; i < num_rows; ++i) {
    const int64_t g = rows[i] / kQuantGroupCols, c = rows[i] % kQuantGroupCols;
    float* dst = out + i * out_stride;
    for (int64_t k = 0; k < K; ++k) {
      float scale = 0.0f, min = 0.0f;
      packed_scale_min(w, g, c, k, &scale, &min);
      dst[k] = std::fma(static_cast<float>(packed_code(w, g, c, k)), scale, min);
    }
  }
#if !defined(_OPENMP)
  (void)num_threads;
#endif
  return Status::Ok();
}

}  // namespace trillium
