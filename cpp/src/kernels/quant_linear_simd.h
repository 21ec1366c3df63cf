// Internal: the block-quantized linear layer's inner loops, written once with AVX2 intrinsics
// (pmaddubsw integer dot products; the exact path's fp32 panels and register tiles) and compiled
// once per ISA: quant_linear_<isa>.cc includes this file inside its own namespace and target region
// (kernels/isa_target.h), after every header it needs (<immintrin.h>, <algorithm>, <cstring>,
// kernels/quant_linear_impl.h). The AVX2 build defines kMaxDirectRows for the exact path's 256-bit
// tiles; the AVX-512 build defines TRILLIUM_QL_EXACT_ZMM instead, which leaves those tiles out (its
// exact path is quant_linear_zmm.h, sharing lane_code and dequant_tile from here) and runs the
// integer path's instructions with 32 vector registers.
// Every build computes bit-identical results (the same fma order per output).
//
// One 32-byte load of packed codes covers 8 output features x 4 consecutive k; the 4 activation
// codes of those k are broadcast to every 32-bit lane, so pmaddubsw + pmaddwd leave in lane c the
// dot product of feature c. 4-bit codes (<= 15) times int8 activations (|x| <= 127) fit a whole
// 32-wide block in int16 (8 x 2 x 15 x 127 = 30480); 8-bit codes use llama.cpp's sign trick
// (|w| x sign(w) x) and widen to int32 after every pmaddubsw.

// The exact path reads a tile's codes as one sequential run (quant_linear.h: a tile's records,
// block after block), but does several instructions of arithmetic per byte, and with one row the
// hardware prefetcher does not stay far enough ahead: a 1.5B Q4_K_M decode step waited on memory
// for ~18% of its time (36.5 -> 30 ms with this). So the loops fetch the codes kPrefetchBlocks
// 32-weight blocks ahead of the one they compute (a distance in blocks is one in time: a block
// of any format costs about the same arithmetic). 8-16 measured best; NTA: the codes are read once.
// Prefetching past the end of the codes is harmless (a prefetch never faults).
constexpr int64_t kPrefetchBlocks = 12;

template <int64_t kBytes>
inline void prefetch_codes(const uint8_t* from) {
#pragma GCC unroll 16
  for (int64_t off = 0; off < kBytes; off += 64) __builtin_prefetch(from + off, 0, 0);
}

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

void quantize_rows_avx2(const float* x, int64_t x_stride, int64_t row_begin, int64_t row_end, int64_t K,
                        int8_t* codes, float* scale, float* scaled_sum) {
  const int64_t nb = K / kQuantBlock;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + r * x_stride + b * kQuantBlock;
      const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
      const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
      const __m256 m01 = _mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask));
      const __m256 m23 = _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask));
      float d = 0.0f, id = 0.0f;
      quant_block_scale(hmax(_mm256_max_ps(m01, m23)), &d, &id);
      const __m256 inv = _mm256_set1_ps(id);
      // cvtps2dq rounds to nearest even (the default MXCSR mode), like nearbyint in the portable path.
      const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, inv)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, inv));
      const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, inv)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, inv));
      const int32_t sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
      // |x * inv| <= 127 (+ rounding), so the saturating packs never clip.
      const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + r * K + b * kQuantBlock),
                          _mm256_permutevar8x32_epi32(packed, order));
      scale[r * nb + b] = d;
      scaled_sum[r * nb + b] = d * static_cast<float>(sum);
    }
  }
}

// Dot products of one block (32 k) for MR rows against one group of 8 features, as int32 lanes.
template <int MR, int BITS>
inline void block_dots(const uint8_t* wb, const int8_t* const* xb, __m256i* dots) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (BITS == 4) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i acc16[MR];
    for (int r = 0; r < MR; ++r) acc16[r] = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + p * 32));
      const __m256i lo = _mm256_and_si256(v, low);                         // k-quad p
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);  // k-quad p + 4
      for (int r = 0; r < MR; ++r) {
        const __m256i alo = _mm256_set1_epi32(load_i32(xb[r] + p * 4));
        const __m256i ahi = _mm256_set1_epi32(load_i32(xb[r] + (p + 4) * 4));
        acc16[r] = _mm256_add_epi16(acc16[r], _mm256_maddubs_epi16(lo, alo));
        acc16[r] = _mm256_add_epi16(acc16[r], _mm256_maddubs_epi16(hi, ahi));
      }
    }
    for (int r = 0; r < MR; ++r) dots[r] = _mm256_madd_epi16(acc16[r], ones);
  } else {
    for (int r = 0; r < MR; ++r) dots[r] = _mm256_setzero_si256();
    for (int q = 0; q < 8; ++q) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + q * 32));
      const __m256i av = _mm256_abs_epi8(v);  // -128 stays 0x80 = 128 as unsigned: still right
      for (int r = 0; r < MR; ++r) {
        const __m256i x = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(xb[r] + q * 4)), v);
        dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(_mm256_maddubs_epi16(av, x), ones));
      }
    }
  }
}

template <int MR, int BITS>
void tile(const QuantActs& a, const QuantWeightView& w, int64_t r0, int64_t g, const float* bias, float* out,
          int64_t out_stride) {
  const int64_t nb = a.blocks, K = a.in_features;
  constexpr int64_t kBlockBytes = kQuantBlock * kQuantGroupCols * BITS / 8;
  const uint8_t* wcodes = static_cast<const uint8_t*>(w.codes);
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* xb[MR];
    for (int r = 0; r < MR; ++r) xb[r] = a.codes + (r0 + r) * K + b * kQuantBlock;
    __m256i dots[MR];
    const int64_t record = quant_record(g, b, nb);
    block_dots<MR, BITS>(wcodes + record * kBlockBytes, xb, dots);
    const __m256 dw = _mm256_loadu_ps(w.scales + record * kQuantGroupCols);
    const __m256 mw = w.mins ? _mm256_loadu_ps(w.mins + record * kQuantGroupCols)
                             : _mm256_mul_ps(dw, _mm256_set1_ps(-quant_symmetric_offset(BITS)));
    for (int r = 0; r < MR; ++r) {
      const __m256 sx = _mm256_set1_ps(a.scale[(r0 + r) * nb + b]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[r]), _mm256_mul_ps(dw, sx), acc[r]);
      acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.scaled_sum[(r0 + r) * nb + b]), acc[r]);
    }
  }
  const int64_t n0 = g * kQuantGroupCols;
  const int64_t cols = w.out_features - n0 < kQuantGroupCols ? w.out_features - n0 : kQuantGroupCols;
  for (int r = 0; r < MR; ++r) {
    float* dst = out + (r0 + r) * out_stride + n0;
    if (cols == kQuantGroupCols) {
      __m256 v = acc[r];
      if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n0));
      _mm256_storeu_ps(dst, v);
    } else {
      alignas(32) float tmp[kQuantGroupCols];
      _mm256_store_ps(tmp, acc[r]);
      for (int64_t c = 0; c < cols; ++c) dst[c] = bias ? tmp[c] + bias[n0 + c] : tmp[c];
    }
  }
}

template <int BITS>
void gemm_bits(const QuantActs& a, const QuantWeightView& w, int64_t row_begin, int64_t row_end, int64_t group_begin,
               int64_t group_end, const float* bias, float* out, int64_t out_stride) {
  for (int64_t g = group_begin; g < group_end; ++g) {
    int64_t r = row_begin;
    for (; r + 4 <= row_end; r += 4) tile<4, BITS>(a, w, r, g, bias, out, out_stride);
    switch (row_end - r) {
      case 3: tile<3, BITS>(a, w, r, g, bias, out, out_stride); break;
      case 2: tile<2, BITS>(a, w, r, g, bias, out, out_stride); break;
      case 1: tile<1, BITS>(a, w, r, g, bias, out, out_stride); break;
      default: break;
    }
  }
}

void gemm_avx2(const QuantActs& a, const QuantWeightView& w, int64_t row_begin, int64_t row_end, int64_t group_begin,
               int64_t group_end, const float* bias, float* out, int64_t out_stride) {
  if (w.bits == 4) {
    gemm_bits<4>(a, w, row_begin, row_end, group_begin, group_end, bias, out, out_stride);
  } else {
    gemm_bits<8>(a, w, row_begin, row_end, group_begin, group_end, bias, out, out_stride);
  }
}

// ------------------------------------------------------------------ exact path (fp32 activations)
// Byte j of every 32-bit lane of `quad` as an int32: sign-extended for 8-bit codes, zero-extended
// for 4-bit ones (already masked to a nibble). Two shifts at most (one for j = 3, and a mask for
// 4-bit j = 0): a decode step spends most of its projection time here, one call per k and group.
template <int BITS>
inline __m256i lane_code(__m256i quad, int j) {
  if constexpr (BITS == 8) {
    return j == 3 ? _mm256_srai_epi32(quad, 24) : _mm256_srai_epi32(_mm256_slli_epi32(quad, 24 - 8 * j), 24);
  } else {
    if (j == 3) return _mm256_srli_epi32(quad, 24);
    const __m256i byte = _mm256_set1_epi32(0xFF);
    return j == 0 ? _mm256_and_si256(quad, byte) : _mm256_and_si256(_mm256_srli_epi32(quad, 8 * j), byte);
  }
}

// The codes of k-quad `quad` (k = 4 quad .. 4 quad + 3) of a record, one byte per weight in the
// 32-byte lane order (lane c = column c): signed for 8 bits, else unsigned, the low nibble from
// the 4-bit part of the record and bits 4-5 from its high-bit planes (quant_linear.h).
template <int BITS>
inline __m256i quad_codes(const uint8_t* wb, int quad) {
  if constexpr (BITS == 8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + quad * 32));
  } else {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + (quad & 3) * 32));
    const __m256i c = quad < 4 ? _mm256_and_si256(v, low) : _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    if constexpr (BITS == 4) {
      return c;
    } else {
      // The high bits of this quad moved to bits 4 (5: bit `quad`) or 4-5 (6: bits 2 (quad % 4)) of
      // each byte with one 16-bit shift and a mask: bits crossing into the next byte land below bit
      // 4 there and are masked off.
      const int from = BITS == 5 ? quad : 2 * (quad & 3);  // where the bits sit in the plane's byte
      const __m256i h = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(wb + 128 + (BITS == 6 ? (quad >> 2) * 32 : 0)));
      const __m256i moved = from <= 4 ? _mm256_slli_epi16(h, 4 - from) : _mm256_srli_epi16(h, from - 4);
      return _mm256_or_si256(c, _mm256_and_si256(moved, _mm256_set1_epi8(BITS == 5 ? 0x10 : 0x30)));
    }
  }
}

// 8 sub-scale bytes as fp32 lanes: int8 for 6-bit codes (Q6_K), else uint8.
template <int BITS>
inline __m256 sub_scale_lanes(const uint8_t* p) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(BITS == 6 ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes));
}

// Scales and mins (the format's symmetric min without mins) of the 8 columns whose scales start at
// index `at`, with two-level scales super * sub (exact, quant_linear.h) from super index `sup`;
// `sub_mins` = quant_sub_min_offset(w) (read only with two-level mins).
template <int BITS>
inline void scale_min_at(const QuantWeightView& w, int64_t at, int64_t sup, int64_t sub_mins, __m256* d, __m256* m) {
  if (w.sub_scales) {
    *d = _mm256_mul_ps(_mm256_loadu_ps(w.scales + sup), sub_scale_lanes<BITS>(w.sub_scales + at));
    if (w.mins) {
      *m = _mm256_mul_ps(_mm256_loadu_ps(w.mins + sup), sub_scale_lanes<4>(w.sub_scales + sub_mins + at));
    } else if constexpr (BITS == 8) {
      *m = _mm256_setzero_ps();
    } else {
      *m = _mm256_mul_ps(*d, _mm256_set1_ps(-quant_symmetric_offset(BITS)));
    }
    return;
  }
  *d = _mm256_loadu_ps(w.scales + at);
  if (w.mins) {
    *m = _mm256_loadu_ps(w.mins + at);
  } else if constexpr (BITS == 8) {
    *m = _mm256_setzero_ps();  // fma with 0 is the same product
  } else {
    *m = _mm256_mul_ps(*d, _mm256_set1_ps(-quant_symmetric_offset(BITS)));  // exact: a power of two
  }
}

// scale_min_at of group g, block b, scale block s.
template <int BITS>
inline void scale_min(const QuantWeightView& w, int64_t g, int64_t b, int64_t s, int64_t nb, __m256* d, __m256* m) {
  const int64_t at = quant_scale_index(g, b, s, nb, quant_scale_blocks(BITS));
  const int64_t sup = w.sub_scales ? quant_super_index(g, b, nb) : 0;
  scale_min_at<BITS>(w, at, sup, w.sub_scales && w.mins ? quant_sub_min_offset(w) : 0, d, m);
}

// Calls f(std::integral_constant<int, bits>) for the weight's bits (4, 5, 6 or 8; quant_linear
// validated them): one template instance per format.
template <typename F>
inline void with_bits(int32_t bits, F&& f) {
  switch (bits) {
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

// Dequantize groups [g, g + ng) of one tile (g a multiple of kQuantTileGroups) for all of K, in
// record order so the codes are read as one sequential run. Group g + j goes to half j / 2 of the
// panel (half_panel floats each, 16 features wide: two groups side by side), columns (j % 2) * 8
// .. + 8 of each k row. w = fma(code, scale, min), the same fma as the portable path.
template <int BITS>
void dequant_tile(const QuantWeightView& w, int64_t g, int64_t ng, float* panel, int64_t half_panel) {
  const int64_t nb = w.in_features / kQuantBlock;
  constexpr int64_t kBlockBytes = kQuantBlock * kQuantGroupCols * BITS / 8;
  constexpr int kQuadsPerScale = 8 / static_cast<int>(quant_scale_blocks(BITS));
  constexpr int64_t kStride = 2 * kQuantGroupCols;
  const uint8_t* codes = static_cast<const uint8_t*>(w.codes);
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t j = 0; j < ng; ++j) {
      const int64_t record = quant_record(g + j, b, nb);
      float* dst = panel + (j / 2) * half_panel + b * kQuantBlock * kStride + (j % 2) * kQuantGroupCols;
      const uint8_t* wb = codes + record * kBlockBytes;
      if (j == 0) prefetch_codes<kQuantTileGroups * kBlockBytes>(wb + kPrefetchBlocks * kQuantTileGroups * kBlockBytes);
      __m256 d = _mm256_setzero_ps(), m = _mm256_setzero_ps();
      // Lane c of a quad's codes = the 4 codes (k .. k+3) of column c; byte i is k + i.
      for (int quad = 0; quad < 8; ++quad) {
        if (quad % kQuadsPerScale == 0) scale_min<BITS>(w, g + j, b, quad / kQuadsPerScale, nb, &d, &m);
        const __m256i q = quad_codes<BITS>(wb, quad);
        for (int i = 0; i < 4; ++i) {
          const __m256 wv = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_code<BITS>(q, i)), d, m);
          _mm256_storeu_ps(dst + (quad * 4 + i) * kStride, wv);
        }
      }
    }
  }
}

#if !defined(TRILLIUM_QL_EXACT_ZMM)
// MR rows x NG groups (8 features each) over all of K from the panel; fma order along k as the
// portable path: acc = fma(w, x, acc).
template <int MR, int NG>
void panel_tile(const float* x, int64_t x_stride, const float* panel, int64_t panel_stride, int64_t K, int64_t r0,
                int64_t n0, int64_t N, const float* bias, float* out, int64_t out_stride) {
  // Flat accumulator array and a separate epilogue buffer: with acc[MR][NG] GCC kept every
  // accumulator in memory too and stored all of them on each k (3x slower).
  __m256 acc[MR * NG];
#pragma GCC unroll 16
  for (int i = 0; i < MR * NG; ++i) acc[i] = _mm256_setzero_ps();
  const float* xr = x + r0 * x_stride;
  for (int64_t k = 0; k < K; ++k) {
    const __m256 w0 = _mm256_loadu_ps(panel + k * panel_stride);
    const __m256 w1 = NG == 2 ? _mm256_loadu_ps(panel + k * panel_stride + 8) : w0;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 xv = _mm256_broadcast_ss(xr + r * x_stride + k);
      acc[r * NG] = _mm256_fmadd_ps(w0, xv, acc[r * NG]);
      if (NG == 2) acc[r * NG + 1] = _mm256_fmadd_ps(w1, xv, acc[r * NG + 1]);
    }
  }
  alignas(32) float result[MR * NG * 8];
#pragma GCC unroll 16
  for (int i = 0; i < MR * NG; ++i) _mm256_store_ps(result + i * 8, acc[i]);
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NG; ++j) {
      const int64_t n = n0 + j * 8;
      const int64_t cols = N - n < 8 ? N - n : 8;
      const float* src = result + (r * NG + j) * 8;
      float* dst = out + (r0 + r) * out_stride + n;
      for (int64_t c = 0; c < cols; ++c) dst[c] = bias ? src[c] + bias[n + c] : src[c];
    }
  }
}

template <int NG>
void panel_rows(const float* x, int64_t x_stride, const float* panel, int64_t panel_stride, int64_t K,
                int64_t row_begin, int64_t row_end, int64_t n0, int64_t N, const float* bias, float* out,
                int64_t out_stride) {
  int64_t r = row_begin;
  for (; r + 6 <= row_end; r += 6) panel_tile<6, NG>(x, x_stride, panel, panel_stride, K, r, n0, N, bias, out, out_stride);
  switch (row_end - r) {
    case 5: panel_tile<5, NG>(x, x_stride, panel, panel_stride, K, r, n0, N, bias, out, out_stride); break;
    case 4: panel_tile<4, NG>(x, x_stride, panel, panel_stride, K, r, n0, N, bias, out, out_stride); break;
    case 3: panel_tile<3, NG>(x, x_stride, panel, panel_stride, K, r, n0, N, bias, out, out_stride); break;
    case 2: panel_tile<2, NG>(x, x_stride, panel, panel_stride, K, r, n0, N, bias, out, out_stride); break;
    case 1: panel_tile<1, NG>(x, x_stride, panel, panel_stride, K, r, n0, N, bias, out, out_stride); break;
    default: break;
  }
}

// Few rows (decode of a few requests, or one verifying its drafts): dequantize straight into
// registers instead of a panel. Same w = fma(code, scale, min) and the same fma order along k as
// panel_tile, so a row's result does not depend on how many rows came with it.
template <int MR, int NG, int BITS>
void direct_tile(const float* x, int64_t x_stride, const QuantWeightView& w, int64_t r0, int64_t g0,
                 const float* bias, float* out, int64_t out_stride) {
  const int64_t nb = w.in_features / kQuantBlock;
  constexpr int64_t kBlockBytes = kQuantBlock * kQuantGroupCols * BITS / 8;
  const uint8_t* codes = static_cast<const uint8_t*>(w.codes);
  __m256 acc[MR * NG];
#pragma GCC unroll 16
  for (int i = 0; i < MR * NG; ++i) acc[i] = _mm256_setzero_ps();
  constexpr int kQuadsPerScale = 8 / static_cast<int>(quant_scale_blocks(BITS));
  for (int64_t b = 0; b < nb; ++b) {
    __m256 d[NG], m[NG];
    const uint8_t* wb[NG];
#pragma GCC unroll 4
    for (int jg = 0; jg < NG; ++jg) wb[jg] = codes + quant_record(g0 + jg, b, nb) * kBlockBytes;
    prefetch_codes<NG * kBlockBytes>(wb[0] + kPrefetchBlocks * kQuantTileGroups * kBlockBytes);
#pragma GCC unroll 8
    for (int quad = 0; quad < 8; ++quad) {
      if (quad % kQuadsPerScale == 0) {
#pragma GCC unroll 4
        for (int jg = 0; jg < NG; ++jg) scale_min<BITS>(w, g0 + jg, b, quad / kQuadsPerScale, nb, &d[jg], &m[jg]);
      }
      __m256i src[NG];
#pragma GCC unroll 4
      for (int jg = 0; jg < NG; ++jg) src[jg] = quad_codes<BITS>(wb[jg], quad);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const int64_t k = b * kQuantBlock + quad * 4 + j;
        __m256 wv[NG];
#pragma GCC unroll 4
        for (int jg = 0; jg < NG; ++jg) {
          wv[jg] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_code<BITS>(src[jg], j)), d[jg], m[jg]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const __m256 xv = _mm256_broadcast_ss(x + (r0 + r) * x_stride + k);
#pragma GCC unroll 4
          for (int jg = 0; jg < NG; ++jg) acc[r * NG + jg] = _mm256_fmadd_ps(wv[jg], xv, acc[r * NG + jg]);
        }
      }
    }
  }
  alignas(32) float result[MR * NG * 8];
#pragma GCC unroll 16
  for (int i = 0; i < MR * NG; ++i) _mm256_store_ps(result + i * 8, acc[i]);
  for (int r = 0; r < MR; ++r) {
    for (int jg = 0; jg < NG; ++jg) {
      const int64_t n = (g0 + jg) * kQuantGroupCols;
      const int64_t cols = w.out_features - n < 8 ? w.out_features - n : 8;
      const float* src = result + (r * NG + jg) * 8;
      float* dst = out + (r0 + r) * out_stride + n;
      for (int64_t c = 0; c < cols; ++c) dst[c] = bias ? src[c] + bias[n + c] : src[c];
    }
  }
}

template <int MR, int BITS>
void direct_rows(const float* x, int64_t x_stride, const QuantWeightView& w, int64_t r0, int64_t group_begin,
                 int64_t group_end, const float* bias, float* out, int64_t out_stride) {
  int64_t g = group_begin;
  // 4 groups wherever the registers allow: 1 or 2 rows of 2 groups are 2 or 4 independent fma
  // chains, which leave the FMA units waiting on latency (2 rows took 1.8x the time of 4); 3 rows
  // of 4 groups need 30 registers (AVX2's 16 would spill). From 4 rows one group: MR chains, and
  // MR + 5 registers (4 rows of 2 groups spilled and measured no faster).
  if constexpr (MR <= 2) {
    for (; g + 4 <= group_end; g += 4) direct_tile<MR, 4, BITS>(x, x_stride, w, r0, g, bias, out, out_stride);
  }
  if constexpr (MR <= 3) {
    for (; g + 2 <= group_end; g += 2) direct_tile<MR, 2, BITS>(x, x_stride, w, r0, g, bias, out, out_stride);
  }
  for (; g < group_end; ++g) direct_tile<MR, 1, BITS>(x, x_stride, w, r0, g, bias, out, out_stride);
}

template <int BITS>
void direct_gemm(const float* x, int64_t x_stride, const QuantWeightView& w, int64_t row_begin, int64_t rows,
                 int64_t group_begin, int64_t group_end, const float* bias, float* out, int64_t out_stride) {
  switch (rows) {
    case 1: direct_rows<1, BITS>(x, x_stride, w, row_begin, group_begin, group_end, bias, out, out_stride); break;
    case 2: direct_rows<2, BITS>(x, x_stride, w, row_begin, group_begin, group_end, bias, out, out_stride); break;
    case 3: direct_rows<3, BITS>(x, x_stride, w, row_begin, group_begin, group_end, bias, out, out_stride); break;
    case 4: direct_rows<4, BITS>(x, x_stride, w, row_begin, group_begin, group_end, bias, out, out_stride); break;
    case 5: direct_rows<5, BITS>(x, x_stride, w, row_begin, group_begin, group_end, bias, out, out_stride); break;
    case 6: direct_rows<6, BITS>(x, x_stride, w, row_begin, group_begin, group_end, bias, out, out_stride); break;
    case 7: direct_rows<7, BITS>(x, x_stride, w, row_begin, group_begin, group_end, bias, out, out_stride); break;
    default: direct_rows<8, BITS>(x, x_stride, w, row_begin, group_begin, group_end, bias, out, out_stride); break;
  }
}

void gemm_f32_avx2(const float* x, int64_t x_stride, const QuantWeightView& w, int64_t row_begin, int64_t row_end,
                   int64_t group_begin, int64_t group_end, const float* bias, float* out, int64_t out_stride,
                   float* panel) {
  const int64_t K = w.in_features;
  if (row_end - row_begin <= kMaxDirectRows) {
    with_bits(w.bits, [&](auto bits) {
      direct_gemm<decltype(bits)::value>(x, x_stride, w, row_begin, row_end - row_begin, group_begin, group_end, bias, out,
                          out_stride);
    });
    return;
  }
  // One tile (4 groups, 32 features) dequantized per pass, in record order: the tile's codes are
  // one sequential run (quant_linear.h). Then 6 x 16 register tiles over each half of the panel
  // (12 accumulators keep both FMA pipes busy; a 16-wide half keeps each k row in one line).
  const int64_t half_panel = K * 2 * kQuantGroupCols;
  for (int64_t g = group_begin; g < group_end; g += kQuantTileGroups) {
    const int64_t ng = std::min<int64_t>(kQuantTileGroups, group_end - g);
    with_bits(w.bits, [&](auto bits) { dequant_tile<decltype(bits)::value>(w, g, ng, panel, half_panel); });
    for (int64_t j = 0; j < ng; j += 2) {
      const float* half = panel + (j / 2) * half_panel;
      const int64_t n0 = (g + j) * kQuantGroupCols;
      if (j + 1 < ng) {
        panel_rows<2>(x, x_stride, half, 2 * kQuantGroupCols, K, row_begin, row_end, n0, w.out_features, bias, out,
                      out_stride);
      } else {
        panel_rows<1>(x, x_stride, half, 2 * kQuantGroupCols, K, row_begin, row_end, n0, w.out_features, bias, out,
                      out_stride);
      }
    }
  }
}
#endif  // !TRILLIUM_QL_EXACT_ZMM
