// Internal: the 16-float pack API (see simd_portable.h) on one AVX-512 register. Included in an ISA
// namespace within attention_isa_avx512.cc's TRILLIUM_TARGET_AVX512 region (kernels/isa_target.h).

struct F16 {
  __m512 v;
};

inline F16 vzero() { return {_mm512_setzero_ps()}; }
inline F16 vset1(float x) { return {_mm512_set1_ps(x)}; }
inline F16 vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline F16 vload(const bf16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}
inline void vstore(float* p, const F16& a) { _mm512_storeu_ps(p, a.v); }
inline F16 vadd(const F16& a, const F16& b) { return {_mm512_add_ps(a.v, b.v)}; }
inline F16 vsub(const F16& a, const F16& b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline F16 vmul(const F16& a, const F16& b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline F16 vdiv(const F16& a, const F16& b) { return {_mm512_div_ps(a.v, b.v)}; }
inline F16 vmax(const F16& a, const F16& b) { return {_mm512_max_ps(a.v, b.v)}; }
inline F16 vfma(const F16& a, const F16& b, const F16& c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline __m256 hi256(__m512 x) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)); }
inline float vsum(const F16& a) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a.v), hi256(a.v));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float vmaxv(const F16& a) {
  const __m256 s8 = _mm256_max_ps(_mm512_castps512_ps256(a.v), hi256(a.v));
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline F16 vmask_tail(const F16& a, int n) {
  const __mmask16 keep = n >= 16 ? static_cast<__mmask16>(0xffff)
                                 : static_cast<__mmask16>(n <= 0 ? 0u : (1u << n) - 1u);
  return {_mm512_mask_blend_ps(keep, _mm512_set1_ps(-INFINITY), a.v)};
}
inline F16 vexp2(const F16& a) {
  const __m512 x = _mm512_min_ps(_mm512_max_ps(a.v, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return {_mm512_mul_ps(p, _mm512_castsi512_ps(e))};
}
// Lane t = sum of v[t]: a 4-level tree that pairs tokens while it folds lanes (45 uops for 16 packs).
inline F16 vsum16(const F16* v) {
  __m512 u[8], y[4];
  for (int i = 0; i < 8; ++i) {  // tokens 2i, 2i+1 interleaved in each 128-bit lane
    const __m512 a = v[2 * i].v, b = v[2 * i + 1].v;
    u[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  }
  for (int i = 0; i < 4; ++i) {  // tokens 4i .. 4i+3 in order in each 128-bit lane
    const __m512d a = _mm512_castps_pd(u[2 * i]), b = _mm512_castps_pd(u[2 * i + 1]);
    y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 z0 = _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 z1 = _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(y[2], y[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return {_mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(3, 1, 3, 1)))};
}
// In-place 16x16 transpose: lane d of r[t] becomes lane t of r[d] (unpack, in-lane shuffle, then a
// 4x4 transpose of 128-bit lanes: 64 shuffles).
inline void vtranspose16(F16* r) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i].v, r[2 * i + 1].v);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i].v, r[2 * i + 1].v);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + k], lane L: column 4L + k of rows 4i .. 4i+3
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int k = 0; k < 4; ++k) {
    const __m512 s0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), s1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
    const __m512 s2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
    const __m512 s3 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
    r[k].v = _mm512_shuffle_f32x4(s0, s2, 0x88);
    r[8 + k].v = _mm512_shuffle_f32x4(s0, s2, 0xdd);
    r[4 + k].v = _mm512_shuffle_f32x4(s1, s3, 0x88);
    r[12 + k].v = _mm512_shuffle_f32x4(s1, s3, 0xdd);
  }
}
// True iff some lane of a is greater than the matching lane of b.
inline bool vany_gt(const F16& a, const F16& b) { return _mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ) != 0; }

constexpr int kRowBlock = 8;
constexpr int kNG = 4;  // heads whose PV accumulators stay in registers together
constexpr int kChunkPacks = 2;
