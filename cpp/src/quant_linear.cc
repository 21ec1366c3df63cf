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

// Groups rounded up to whole tiles: what the packed buffers hold.
int64_t padded_groups(int64_t out_features) {
  return (quant_linear_groups(out_features) + kQuantTileGroups - 1) / kQuantTileGroups * kQuantTileGroups;
}

constexpr int64_t kRowChunk = 64;      // rows whose int8 codes stay in L2 while weights stream past
constexpr int64_t kGroupsPerItem = kQuantTileGroups;  // one tile (32 output features) per work item

int64_t block_bytes(int32_t bits) { return kQuantBlock * kQuantGroupCols * bits / 8; }

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

// Code of weight (column c of group g, k) in the packed layout.
inline int32_t packed_code(const QuantWeightView& w, int64_t g, int64_t c, int64_t k) {
  const int64_t nb = w.in_features / kQuantBlock, b = k / kQuantBlock, kk = k % kQuantBlock;
  const int64_t quad = kk / 4, j = kk % 4;
  const uint8_t* base = static_cast<const uint8_t*>(w.codes) + kernels::quant_record(g, b, nb) * block_bytes(w.bits);
  if (w.bits == 8) return static_cast<int8_t>(base[quad * 32 + c * 4 + j]);
  const uint8_t byte = base[(quad % 4) * 32 + c * 4 + j];
  return quad < 4 ? (byte & 0x0F) : (byte >> 4);
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
          const int64_t at = kernels::quant_record(g, b, nb) * kQuantGroupCols + c;
          const float dw = w.scales[at];
          const float mw = w.mins ? w.mins[at] : 0.0f;
          acc = std::fma(static_cast<float>(dot), dw * a.scale[r * nb + b], acc);
          acc = std::fma(mw, a.scaled_sum[r * nb + b], acc);
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
  const int64_t nb = w.in_features / kQuantBlock, K = w.in_features, N = w.out_features;
  for (int64_t g = group_begin; g < group_end; ++g) {
    for (int64_t c = 0; c < kQuantGroupCols; ++c) {
      const int64_t n = g * kQuantGroupCols + c;
      if (n >= N) break;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t at = kernels::quant_record(g, k / kQuantBlock, nb) * kQuantGroupCols + c;
        col[k] = std::fma(static_cast<float>(packed_code(w, g, c, k)), w.scales[at], w.mins ? w.mins[at] : 0.0f);
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
  if (kernel_isa() == KernelIsa::kAvx512) return avx512;
  if (kernel_isa() != KernelIsa::kPortable) return avx2;
#endif
  return portable;
}

}  // namespace

namespace kernels {
QuantLinearKernels quant_linear_portable_kernels() {
  return {quantize_rows_portable, gemm_portable, gemm_f32_portable};
}
}  // namespace kernels

// --------------------------------------------------------------------------------------- sizes
int64_t quant_linear_groups(int64_t out_features) { return (out_features + kQuantGroupCols - 1) / kQuantGroupCols; }

int64_t quant_linear_packed_bytes(int64_t out_features, int64_t in_features, int32_t bits) {
  return padded_groups(out_features) * (in_features / kQuantBlock) * block_bytes(bits);
}

int64_t quant_linear_scale_count(int64_t out_features, int64_t in_features) {
  return padded_groups(out_features) * (in_features / kQuantBlock) * kQuantGroupCols;
}

// ------------------------------------------------------------------------------------- packing
Status quant_linear_pack(const int8_t* codes, const float* scale, const float* min, int64_t N, int64_t K,
                         int32_t bits, void* packed_codes, float* packed_scales, float* packed_mins) {
  if (bits != 4 && bits != 8) return bad("bits must be 4 or 8, got " + std::to_string(bits));
  if (N <= 0 || K <= 0 || K % kQuantBlock != 0) {
    return bad("need out_features > 0 and in_features a positive multiple of 32, got " + std::to_string(N) + ", " +
               std::to_string(K));
  }
  if (!codes || !scale || !min || !packed_codes || !packed_scales) return bad("null pointer");
  const int64_t nb = K / kQuantBlock, groups = quant_linear_groups(N);
  if (bits == 4) {
    for (int64_t i = 0; i < N * K; ++i) {
      if (codes[i] < 0 || codes[i] > 15) return bad("4-bit codes must be in [0, 15], got " + std::to_string(codes[i]));
    }
  }
  auto* out = static_cast<uint8_t*>(packed_codes);
  std::memset(out, 0, static_cast<size_t>(quant_linear_packed_bytes(N, K, bits)));
  std::memset(packed_scales, 0, static_cast<size_t>(quant_linear_scale_count(N, K)) * sizeof(float));
  if (packed_mins) std::memset(packed_mins, 0, static_cast<size_t>(quant_linear_scale_count(N, K)) * sizeof(float));
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t record = kernels::quant_record(g, b, nb);
      uint8_t* dst = out + record * block_bytes(bits);
      float* ds = packed_scales + record * kQuantGroupCols;
      float* dm = packed_mins ? packed_mins + record * kQuantGroupCols : nullptr;
      for (int64_t c = 0; c < kQuantGroupCols; ++c) {
        const int64_t n = g * kQuantGroupCols + c;
        ds[c] = n < N ? scale[n * nb + b] : 0.0f;
        if (dm) dm[c] = n < N ? min[n * nb + b] : 0.0f;
        if (n >= N) continue;  // padding columns: zero codes, zero scale
        for (int64_t kk = 0; kk < kQuantBlock; ++kk) {
          const int64_t quad = kk / 4, j = kk % 4;
          const int8_t q = codes[n * K + b * kQuantBlock + kk];
          if (bits == 8) {
            dst[quad * 32 + c * 4 + j] = static_cast<uint8_t>(q);
          } else {
            dst[(quad % 4) * 32 + c * 4 + j] |= static_cast<uint8_t>(quad < 4 ? q : q << 4);
          }
        }
      }
    }
  }
  return Status::Ok();
}

// ------------------------------------------------------------------------------------- the op
Status quant_linear(const QuantLinearArgs& a) {
  const QuantWeightView& w = a.weight;
  if (w.bits != 4 && w.bits != 8) return bad("weight bits must be 4 or 8, got " + std::to_string(w.bits));
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
  const int64_t M = a.num_rows, K = w.in_features, nb = K / kQuantBlock;
  const QuantLinearKernels& k = active_kernels();
  const int64_t groups = quant_linear_groups(w.out_features);
  const int64_t row_chunks = (M + kRowChunk - 1) / kRowChunk;
  const int64_t group_items = (groups + kGroupsPerItem - 1) / kGroupsPerItem;
  const int64_t items = row_chunks * group_items;
#if defined(_OPENMP)
  const int threads = a.num_threads > 0 ? a.num_threads : omp_get_max_threads();
#endif
  if (!a.int8_activations) {
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
  std::vector<int8_t> codes(static_cast<size_t>(M * K));
  std::vector<float> scale(static_cast<size_t>(M * nb)), scaled_sum(static_cast<size_t>(M * nb));
  const QuantActs acts{codes.data(), scale.data(), scaled_sum.data(), K, nb};
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
#endif
  {
#if defined(_OPENMP)
#pragma omp for schedule(static)
#endif
    for (int64_t r = 0; r < M; ++r) k.quantize(a.x, a.x_stride, r, r + 1, K, codes.data(), scale.data(), scaled_sum.data());
#if defined(_OPENMP)
#pragma omp for schedule(static)
#endif
    for (int64_t item = 0; item < items; ++item) {
      const int64_t chunk = item / group_items, gi = item % group_items;
      const int64_t r0 = chunk * kRowChunk, r1 = std::min(M, r0 + kRowChunk);
      const int64_t g0 = gi * kGroupsPerItem, g1 = std::min(groups, g0 + kGroupsPerItem);
      k.gemm(acts, w, r0, r1, g0, g1, a.bias, a.out, a.out_stride);
    }
  }
  return Status::Ok();
}

}  // namespace trillium
