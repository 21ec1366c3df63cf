// Element types the kernels accept, and the scalar bf16 <-> fp32 conversions they all agree on.
//
// bf16 is the top half of an fp32: widening is a 16-bit shift; narrowing rounds to nearest even
// (what torch's .to(torch.bfloat16) does) and keeps NaN a quiet NaN. Kernels always accumulate
// in fp32, whatever the storage type.
#pragma once

#include <cstdint>
#include <cstring>

namespace trillium {

enum class DType : int32_t {
  kF32 = 0,
  kBF16 = 1,
};

inline int64_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }
inline bool valid_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16; }
inline const char* dtype_name(DType t) { return t == DType::kF32 ? "float32" : t == DType::kBF16 ? "bfloat16" : "?"; }

// bf16 storage type: raw bits (no arithmetic on it, only conversion).
struct bf16_t {
  uint16_t bits;
};

inline float bf16_to_f32(bf16_t h) {
  const uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline bf16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

}  // namespace trillium
