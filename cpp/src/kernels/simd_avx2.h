// Internal: the 16-float pack API (see simd_portable.h) on two AVX2 registers, and the 8-lane
// helpers under it (exp2x8, hsum8, hmax8). Included in an ISA namespace within a
// TRILLIUM_TARGET_AVX2 region (kernels/isa_target.h): attention_isa_avx2.cc's and layer_ops.cc's.

struct F16 {
  __m256 lo, hi;
};

inline F16 vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F16 vset1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline F16 vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 bf16x8_to_f32(const bf16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline F16 vload(const bf16_t* p) { return {bf16x8_to_f32(p), bf16x8_to_f32(p + 8)}; }
inline void vstore(float* p, const F16& a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline F16 vadd(const F16& a, const F16& b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline F16 vsub(const F16& a, const F16& b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline F16 vmul(const F16& a, const F16& b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline F16 vdiv(const F16& a, const F16& b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline F16 vmax(const F16& a, const F16& b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline F16 vfma(const F16& a, const F16& b, const F16& c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline float hsum8(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float hmax8(__m256 x) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float vsum(const F16& a) { return hsum8(_mm256_add_ps(a.lo, a.hi)); }
inline float vmaxv(const F16& a) { return hmax8(_mm256_max_ps(a.lo, a.hi)); }
inline F16 vmask_tail(const F16& a, int n) {
  const __m256 nn = _mm256_set1_ps(static_cast<float>(n));
  const __m256 idx_lo = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 idx_hi = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  return {_mm256_blendv_ps(ninf, a.lo, _mm256_cmp_ps(idx_lo, nn, _CMP_LT_OQ)),
          _mm256_blendv_ps(ninf, a.hi, _mm256_cmp_ps(idx_hi, nn, _CMP_LT_OQ))};
}
inline __m256 exp2x8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));  // -inf/NaN -> -127
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.5403530393381606e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline F16 vexp2(const F16& x) { return {exp2x8(x.lo), exp2x8(x.hi)}; }
// Lane t of the result = horizontal sum of a[t], for 8 registers.
inline __m256 transpose_sum8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]);
  const __m256 t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]);
  const __m256 t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1);  // per 128-bit half: sums of a0..a3 over that half
  const __m256 u1 = _mm256_hadd_ps(t2, t3);  // same for a4..a7
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
inline F16 vsum16(const F16* v) {
  __m256 r[16];
  for (int t = 0; t < 16; ++t) r[t] = _mm256_add_ps(v[t].lo, v[t].hi);
  return {transpose_sum8(r), transpose_sum8(r + 8)};
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
  return _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ))) != 0;
}

constexpr int kRowBlock = 4;
constexpr int kNG = 1;  // heads whose PV accumulators stay in registers together
constexpr int kChunkPacks = 1;
