// The small fused operations of a Llama-family decoder layer, on fp32 rows: RMSNorm with the
// residual add folded in, SiLU(gate) * up (or GELU-tanh(gate) * up), and rotate-half RoPE applied in place. Each replaces
// five to ten separate tensor operations (and their temporaries) of the torch version, which at
// decode batch sizes cost more in per-operation overhead than in arithmetic.
//
// Framework-free: raw pointers, sizes and strides in elements; rows may be strided (views of a
// fused projection). Vectorized with AVX2 when the active kernel ISA (trillium/cpu_isa.h) allows it,
// portable loops otherwise. Results match the torch formulas to fp32 rounding.
#pragma once

#include <cstdint>

#include "trillium/status.h"

namespace trillium {

// out[r] = x'[r] * rsqrt(mean(x'[r]^2) + eps) * weight, where x' = x + residual when residual is
// given -- and then residual[r] = x'[r] (the pre-norm sum the next layer adds to). Rows of
// `hidden` floats; out may alias x but not residual.
struct RmsNormArgs {
  const float* x = nullptr;
  int64_t x_stride = 0;
  float* residual = nullptr;  // optional, in/out
  int64_t residual_stride = 0;
  const float* weight = nullptr;  // [hidden]
  float* out = nullptr;
  int64_t out_stride = 0;
  int64_t rows = 0;
  int64_t hidden = 0;
  float eps = 1e-6f;
};
Status rms_norm(const RmsNormArgs& a);

// The gate's activation in a gated MLP: SiLU (Llama), or GELU with the tanh approximation (Gemma),
// computed as g * sigmoid(2u) -- the same value as 0.5 g (1 + tanh(u)) -- with
// u = sqrt(2 / pi) * (g + 0.044715 g^3), so that both share one exp.
enum class GatedActivation : int32_t { kSilu = 0, kGeluTanh = 1 };

// out[r][i] = act(gate_up[r][i]) * gate_up[r][inter + i]; silu(g) = g / (1 + exp(-g)),
// gelu_tanh(g) = g / (1 + exp(-2u)) (see GatedActivation).
struct SiluMulArgs {
  const float* gate_up = nullptr;  // [rows, 2 * inter]
  int64_t gate_up_stride = 0;
  float* out = nullptr;  // [rows, inter]
  int64_t out_stride = 0;
  int64_t rows = 0;
  int64_t inter = 0;
  GatedActivation activation = GatedActivation::kSilu;
};
Status silu_and_mul(const SiluMulArgs& a);

// Rotate-half RoPE in place on x [tokens, heads, head_dim] (token and head strides free, last
// dimension contiguous): with c = cos[pos][i], s = sin[pos][i] for i < head_dim / 2,
//   x[i] <- x[i] * c - x[i + half] * s,   x[i + half] <- x[i + half] * c + x[i] * s.
// cos / sin are [max_positions, head_dim / 2] tables; positions[t] < max_positions.
struct RotaryArgs {
  float* x = nullptr;
  int64_t stride_token = 0;
  int64_t stride_head = 0;
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t max_positions = 0;
  const int64_t* positions = nullptr;  // [tokens]
};
Status rotary_inplace(const RotaryArgs& a);

}  // namespace trillium
