// Internal: the 16-float pack API on plain arrays (any target; compilers auto-vectorize the loops,
// e.g. to NEON on aarch64). Included inside an ISA namespace by attention_isa_portable.cc; the
// AVX2 / AVX-512 headers implement the same functions with intrinsics.
//
// exp2 uses the same range reduction and polynomial as the intrinsic versions, so all ISAs agree
// to a few ulp.

struct F16 {
  float v[16];
};

inline F16 vzero() {
  F16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = 0.0f;
  return r;
}
inline F16 vset1(float x) {
  F16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = x;
  return r;
}
inline F16 vload(const float* p) {
  F16 r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline F16 vload(const bf16_t* p) {
  F16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = bf16_to_f32(p[i]);
  return r;
}
inline void vstore(float* p, const F16& a) { std::memcpy(p, a.v, sizeof a.v); }

#define TRILLIUM_PORTABLE_BINOP(name, expr)   \
  inline F16 name(const F16& a, const F16& b) { \
    F16 r;                                      \
    for (int i = 0; i < 16; ++i) r.v[i] = expr; \
    return r;                                   \
  }
TRILLIUM_PORTABLE_BINOP(vadd, a.v[i] + b.v[i])
TRILLIUM_PORTABLE_BINOP(vsub, a.v[i] - b.v[i])
TRILLIUM_PORTABLE_BINOP(vmul, a.v[i] * b.v[i])
TRILLIUM_PORTABLE_BINOP(vmax, a.v[i] > b.v[i] ? a.v[i] : b.v[i])
#undef TRILLIUM_PORTABLE_BINOP

inline F16 vdiv(const F16& a, const F16& b) {
  F16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] / b.v[i];
  return r;
}
// a * b + c
inline F16 vfma(const F16& a, const F16& b, const F16& c) {
  F16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] * b.v[i] + c.v[i];
  return r;
}
inline float vsum(const F16& a) {
  float s = 0.0f;
  for (int i = 0; i < 16; ++i) s += a.v[i];
  return s;
}
inline float vmaxv(const F16& a) {
  float m = a.v[0];
  for (int i = 1; i < 16; ++i) m = a.v[i] > m ? a.v[i] : m;
  return m;
}
// Lanes >= n become -inf (n <= 0: all of them).
inline F16 vmask_tail(const F16& a, int n) {
  F16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = i < n ? a.v[i] : -INFINITY;
  return r;
}
// 2^x for x <= 0 (x below -127, including -inf, gives 0).
inline F16 vexp2(const F16& x) {
  F16 r;
  for (int i = 0; i < 16; ++i) {
    float xi = x.v[i] < -127.0f ? -127.0f : x.v[i];
    xi = xi > 127.0f ? 127.0f : xi;
    const float n = std::floor(xi + 0.5f);
    const float f = xi - n;  // [-0.5, 0.5]
    float p = 1.5403530393381606e-4f;
    p = p * f + 1.3333558146428443e-3f;
    p = p * f + 9.6181291076284772e-3f;
    p = p * f + 5.5504108664821580e-2f;
    p = p * f + 2.4022650695910071e-1f;
    p = p * f + 6.9314718055994531e-1f;
    p = p * f + 1.0f;
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    r.v[i] = p * scale;
  }
  return r;
}
// Lane t = sum of the lanes of v[t] (a transposing horizontal sum of 16 packs).
inline F16 vsum16(const F16* v) {
  F16 r;
  for (int t = 0; t < 16; ++t) r.v[t] = vsum(v[t]);
  return r;
}
// In-place 16x16 transpose: lane d of r[t] becomes lane t of r[d] (through memory).
inline void vtranspose16(F16* r) {
  float m[16][16];
  for (int t = 0; t < 16; ++t) vstore(m[t], r[t]);
  for (int d = 0; d < 16; ++d) {
    float col[16];
    for (int t = 0; t < 16; ++t) col[t] = m[t][d];
    r[d] = vload(col);
  }
}
inline bool vany_gt(const F16& a, const F16& b) {
  bool any = false;
  for (int i = 0; i < 16; ++i) any |= a.v[i] > b.v[i];
  return any;
}

// Inner-loop blocking for this ISA (see attention_impl.h).
constexpr int kRowBlock = 4;    // query rows sharing one K/V load
// Heads whose PV accumulators (x head_dim / 16 packs) are kept in registers at once.
constexpr int kNG = 1;
constexpr int kChunkPacks = 1;  // keys per softmax update = 16 * kChunkPacks
