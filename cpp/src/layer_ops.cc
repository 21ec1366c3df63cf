// Fused decoder-layer operations (trillium/kernels/layer_ops.h): validation, portable loops and
// the AVX2 versions (function-level target region, chosen by kernel_isa() at run time).
#include "trillium/kernels/layer_ops.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/isa_target.h"
#include "trillium/cpu_isa.h"
#include "trillium/kernels/dtype.h"

namespace trillium {
namespace {

// Split rows over OpenMP threads only when there is enough work to pay for the fork.
constexpr int64_t kParallelElements = 1 << 16;

Status bad(const char* op, const std::string& what) { return Status::InvalidArgument(std::string(op) + ": " + what); }

bool use_avx2() {
#if defined(__x86_64__)
  return kernel_isa() != KernelIsa::kPortable;
#else
  return false;
#endif
}

// ------------------------------------------------------------------------------------ portable
void rms_norm_row_portable(const RmsNormArgs& a, int64_t r) {
  const float* x = a.x + r * a.x_stride;
  float* res = a.residual ? a.residual + r * a.residual_stride : nullptr;
  float* out = a.out + r * a.out_stride;
  float sum = 0.0f;
  for (int64_t i = 0; i < a.hidden; ++i) {
    const float v = res ? x[i] + res[i] : x[i];
    if (res) res[i] = v;
    sum += v * v;
  }
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(a.hidden) + a.eps);
  const float* src = res ? res : x;
  for (int64_t i = 0; i < a.hidden; ++i) out[i] = a.weight[i] * (src[i] * inv);
}

// GELU-tanh as g * sigmoid(2u) (layer_ops.h): the exponent -2u = g * (kGeluA + kGeluB * g^2).
constexpr float kGeluA = -1.5957691216057308f;              // -2 * sqrt(2 / pi)
constexpr float kGeluB = -1.5957691216057308f * 0.044715f;  // -2 * sqrt(2 / pi) * 0.044715

// The exponent whose exp gives act(g) = g / (1 + exp(exponent)).
inline float gate_exponent(const SiluMulArgs& a, float g) {
  return a.activation == GatedActivation::kGeluTanh ? g * (kGeluA + kGeluB * g * g) : -g;
}

void silu_row_portable(const SiluMulArgs& a, int64_t r) {
  const float* g = a.gate_up + r * a.gate_up_stride;
  float* out = a.out + r * a.out_stride;
  for (int64_t i = 0; i < a.inter; ++i) out[i] = g[i] / (1.0f + std::exp(gate_exponent(a, g[i]))) * g[a.inter + i];
}

void rotary_token_portable(const RotaryArgs& a, int64_t t) {
  const int64_t half = a.head_dim / 2;
  const float* c = a.cos + a.positions[t] * half;
  const float* s = a.sin + a.positions[t] * half;
  for (int64_t h = 0; h < a.heads; ++h) {
    float* x = a.x + t * a.stride_token + h * a.stride_head;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = x[i], x2 = x[i + half];
      x[i] = x1 * c[i] - x2 * s[i];
      x[i + half] = x2 * c[i] + x1 * s[i];
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------- AVX2
#if defined(__x86_64__)
TRILLIUM_TARGET_AVX2_BEGIN
namespace isa_avx2_layer {

// exp2x8 (2^x, |rel err| ~1e-7) and hsum8: the attention kernels' helpers, one copy for both.
#include "kernels/simd_avx2.h"

void rms_norm_row(const RmsNormArgs& a, int64_t r) {
  const float* x = a.x + r * a.x_stride;
  float* res = a.residual ? a.residual + r * a.residual_stride : nullptr;
  float* out = a.out + r * a.out_stride;
  const int64_t n8 = a.hidden / 8 * 8;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n8; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (res) {
      v = _mm256_add_ps(v, _mm256_loadu_ps(res + i));
      _mm256_storeu_ps(res + i, v);
    }
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float sum = hsum8(acc);
  for (int64_t i = n8; i < a.hidden; ++i) {
    const float v = res ? x[i] + res[i] : x[i];
    if (res) res[i] = v;
    sum += v * v;
  }
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(a.hidden) + a.eps);
  const float* src = res ? res : x;
  const __m256 vinv = _mm256_set1_ps(inv);
  for (int64_t i = 0; i < n8; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(a.weight + i), _mm256_mul_ps(_mm256_loadu_ps(src + i), vinv)));
  }
  for (int64_t i = n8; i < a.hidden; ++i) out[i] = a.weight[i] * (src[i] * inv);
}

void silu_row(const SiluMulArgs& a, int64_t r) {
  const float* g = a.gate_up + r * a.gate_up_stride;
  float* out = a.out + r * a.out_stride;
  const int64_t n8 = a.inter / 8 * 8;
  const __m256 one = _mm256_set1_ps(1.0f), log2e = _mm256_set1_ps(1.4426950408889634f);
  const bool gelu = a.activation == GatedActivation::kGeluTanh;
  const __m256 ga = _mm256_set1_ps(kGeluA), gb = _mm256_set1_ps(kGeluB), neg_one = _mm256_set1_ps(-1.0f);
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    // exp(e) = exp2(e * log2(e)); e = -g (SiLU) or g * (A + B g^2) (GELU-tanh)
    const __m256 e = gelu ? _mm256_mul_ps(gv, _mm256_fmadd_ps(gb, _mm256_mul_ps(gv, gv), ga)) : _mm256_mul_ps(gv, neg_one);
    const __m256 act = _mm256_div_ps(gv, _mm256_add_ps(one, exp2x8(_mm256_mul_ps(e, log2e))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(act, _mm256_loadu_ps(g + a.inter + i)));
  }
  for (int64_t i = n8; i < a.inter; ++i) out[i] = g[i] / (1.0f + std::exp(gate_exponent(a, g[i]))) * g[a.inter + i];
}

void rotary_token(const RotaryArgs& a, int64_t t) {
  const int64_t half = a.head_dim / 2, n8 = half / 8 * 8;
  const float* c = a.cos + a.positions[t] * half;
  const float* s = a.sin + a.positions[t] * half;
  for (int64_t h = 0; h < a.heads; ++h) {
    float* x = a.x + t * a.stride_token + h * a.stride_head;
    for (int64_t i = 0; i < n8; i += 8) {
      const __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + half + i);
      const __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
      _mm256_storeu_ps(x + i, _mm256_sub_ps(_mm256_mul_ps(x1, cv), _mm256_mul_ps(x2, sv)));
      _mm256_storeu_ps(x + half + i, _mm256_add_ps(_mm256_mul_ps(x2, cv), _mm256_mul_ps(x1, sv)));
    }
    for (int64_t i = n8; i < half; ++i) {
      const float x1 = x[i], x2 = x[i + half];
      x[i] = x1 * c[i] - x2 * s[i];
      x[i + half] = x2 * c[i] + x1 * s[i];
    }
  }
}

}  // namespace isa_avx2_layer
TRILLIUM_TARGET_END
#endif  // x86-64

// ------------------------------------------------------------------------------------ the ops
Status rms_norm(const RmsNormArgs& a) {
  if (a.rows < 0 || a.hidden <= 0) return bad("rms_norm", "need rows >= 0 and hidden > 0");
  if (a.rows == 0) return Status::Ok();
  if (!a.x || !a.weight || !a.out) return bad("rms_norm", "x, weight and out must not be null");
  if (a.x_stride < a.hidden || a.out_stride < a.hidden || (a.residual && a.residual_stride < a.hidden)) {
    return bad("rms_norm", "row strides must be >= hidden");
  }
  const bool avx2 = use_avx2();
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (a.rows * a.hidden >= kParallelElements)
#endif
  for (int64_t r = 0; r < a.rows; ++r) {
#if defined(__x86_64__)
    if (avx2) {
      isa_avx2_layer::rms_norm_row(a, r);
      continue;
    }
#endif
    (void)avx2;
    rms_norm_row_portable(a, r);
  }
  return Status::Ok();
}

Status silu_and_mul(const SiluMulArgs& a) {
  if (a.rows < 0 || a.inter <= 0) return bad("silu_and_mul", "need rows >= 0 and inter > 0");
  if (a.rows == 0) return Status::Ok();
  if (!a.gate_up || !a.out) return bad("silu_and_mul", "gate_up and out must not be null");
  if (a.gate_up_stride < 2 * a.inter || a.out_stride < a.inter) return bad("silu_and_mul", "row strides too small");
  const bool avx2 = use_avx2();
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (a.rows * a.inter >= kParallelElements)
#endif
  for (int64_t r = 0; r < a.rows; ++r) {
#if defined(__x86_64__)
    if (avx2) {
      isa_avx2_layer::silu_row(a, r);
      continue;
    }
#endif
    (void)avx2;
    silu_row_portable(a, r);
  }
  return Status::Ok();
}

Status rotary_inplace(const RotaryArgs& a) {
  if (a.tokens < 0 || a.heads <= 0 || a.head_dim <= 0 || a.head_dim % 2 != 0) {
    return bad("rotary", "need tokens >= 0, heads > 0 and an even head_dim");
  }
  if (a.tokens == 0) return Status::Ok();
  if (!a.x || !a.cos || !a.sin || !a.positions) return bad("rotary", "pointers must not be null");
  for (int64_t t = 0; t < a.tokens; ++t) {
    if (a.positions[t] < 0 || a.positions[t] >= a.max_positions) {
      return bad("rotary", "position " + std::to_string(a.positions[t]) + " outside the table of " +
                               std::to_string(a.max_positions));
    }
  }
  const bool avx2 = use_avx2();
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (a.tokens * a.heads * a.head_dim >= kParallelElements)
#endif
  for (int64_t t = 0; t < a.tokens; ++t) {
#if defined(__x86_64__)
    if (avx2) {
      isa_avx2_layer::rotary_token(a, t);
      continue;
    }
#endif
    (void)avx2;
    rotary_token_portable(a, t);
  }
  return Status::Ok();
}

}  // namespace trillium
