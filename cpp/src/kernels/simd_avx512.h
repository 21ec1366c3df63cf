// Internal: the 16-float pack API (see simd_portable.h) on one AVX-512 register. Included inside an
// ISA namespace compiled with target("avx512f,avx512bw,avx512vl,avx2,fma") by attention_isa_avx512.cc.

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
inline __m256 transpose_sum8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]);
  const __m256 t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]);
  const __m256 t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1);
  const __m256 u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
inline F16 vsum16(const F16* v) {
  __m256 r[16];
  for (int t = 0; t < 16; ++t) r[t] = _mm256_add_ps(_mm512_castps512_ps256(v[t].v), hi256(v[t].v));
  const __m256 lo = transpose_sum8(r), hi = transpose_sum8(r + 8);
  return {_mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1))};
}

constexpr int kRowBlock = 8;
constexpr int kChunkPacks = 2;
