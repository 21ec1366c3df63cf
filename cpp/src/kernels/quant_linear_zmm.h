// Internal: the exact (fp32-activation) path's register tiles at AVX-512's full width, included by
// quant_linear_avx512.cc only, inside its namespace and target region, after quant_linear_simd.h
// (compiled with TRILLIUM_QL_EXACT_ZMM: its 256-bit exact tiles left out).
//
// quant_linear_simd.h is written with 256-bit vectors so that one text serves AVX2 and AVX-512;
// at 8 lanes a row costs one 256-bit fma per 8 weights. With several rows per step (a speculative
// verify step of k + 1 rows, a small batch) the step is bound by those fmas, not by reading the
// weights, and 512-bit fmas do twice the work per instruction. Here a vector holds a pair of
// groups (16 output features): the two groups' records sit side by side in a tile (quant_linear.h),
// so one 32-byte load of each fills the two halves of a vector. Each lane is the same output
// feature with the same w = fma(code, scale, min) and the same acc = fma(w, x, acc) along k as
// every other path, so results are bit-identical to the 256-bit tiles and the portable loop.

// Byte j of every 32-bit lane as an int32 (lane_code's 512-bit twin).
template <int BITS>
inline __m512i lane_code_zmm(__m512i quad, int j) {
  if constexpr (BITS == 8) {
    return j == 3 ? _mm512_srai_epi32(quad, 24) : _mm512_srai_epi32(_mm512_slli_epi32(quad, 24 - 8 * j), 24);
  } else {
    if (j == 3) return _mm512_srli_epi32(quad, 24);
    const __m512i byte = _mm512_set1_epi32(0xFF);
    return j == 0 ? _mm512_and_si512(quad, byte) : _mm512_and_si512(_mm512_srli_epi32(quad, 8 * j), byte);
  }
}

// quad_codes for a pair of groups at once (`a` in the low half, `b` in the high half): the same
// bytes, with the masks and shifts done once at 512 bits instead of twice at 256.
// Two 32-byte runs as one vector: `a` in the low half, `b` in the high half.
inline __m512i load_pair(const uint8_t* a, const uint8_t* b) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

template <int BITS>
inline __m512i quad_codes_pair(const uint8_t* a, const uint8_t* b, int quad) {
  if constexpr (BITS == 8) {
    return load_pair(a + quad * 32, b + quad * 32);
  } else {
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i v = load_pair(a + (quad & 3) * 32, b + (quad & 3) * 32);
    const __m512i c = quad < 4 ? _mm512_and_si512(v, low) : _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    if constexpr (BITS == 4) {
      return c;
    } else {
      const int from = BITS == 5 ? quad : 2 * (quad & 3);
      const int64_t plane = 128 + (BITS == 6 ? (quad >> 2) * 32 : 0);
      const __m512i h = load_pair(a + plane, b + plane);
      const __m512i moved = from <= 4 ? _mm512_slli_epi16(h, 4 - from) : _mm512_srli_epi16(h, from - 4);
      return _mm512_or_si512(c, _mm512_and_si512(moved, _mm512_set1_epi8(BITS == 5 ? 0x10 : 0x30)));
    }
  }
}

// Stores one row's 16 features [n, n + 16) of a pair: bias added (one add, as the other paths),
// features past N left alone.
inline void store_pair(__m512 acc, const float* bias, float* dst_row, int64_t n, int64_t N) {
  if (n >= N) return;
  const __mmask16 keep = N - n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (N - n)) - 1u);
  if (bias) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(keep, bias + n));
  _mm512_mask_storeu_ps(dst_row + n, keep, acc);
}

// MR rows x one whole tile (4 groups = 2 pairs, 32 features) over all of K, dequantized straight
// into registers. 2 * MR accumulators; MR <= 8 leaves room for the weights, scales and mins.
template <int MR, int BITS>
void zmm_direct_tile(const float* x, int64_t x_stride, const QuantWeightView& w, int64_t r0, int64_t g0,
                     const float* bias, float* out, int64_t out_stride) {
  const int64_t nb = w.in_features / kQuantBlock;
  constexpr int64_t kBlockBytes = kQuantBlock * kQuantGroupCols * BITS / 8;
  const uint8_t* codes = static_cast<const uint8_t*>(w.codes);
  const float* xr = x + r0 * x_stride;
  __m512 acc[MR * 2];
#pragma GCC unroll 16
  for (int i = 0; i < MR * 2; ++i) acc[i] = _mm512_setzero_ps();
  constexpr int kQuadsPerScale = 8 / static_cast<int>(quant_scale_blocks(BITS));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t record = quant_record(g0, b, nb);  // g0 starts a tile: its 4 records follow in order
    const uint8_t* wb = codes + record * kBlockBytes;
    prefetch_codes<kQuantTileGroups * kBlockBytes>(wb + kPrefetchBlocks * kQuantTileGroups * kBlockBytes);
    __m512 d[2], m[2];
#pragma GCC unroll 8
    for (int quad = 0; quad < 8; ++quad) {
      if (quad % kQuadsPerScale == 0) {
        // The scales of a tile's groups sit side by side (quant_linear.h): a pair is one load.
        const int64_t at = quant_scale_index(g0, b, quad / kQuadsPerScale, nb, quant_scale_blocks(BITS));
        const int64_t sup = w.sub_scales ? quant_super_index(g0, b, nb) : 0;
#pragma GCC unroll 2
        for (int p = 0; p < 2; ++p) {
          const int64_t off = 2 * p * kQuantGroupCols;
          if (w.sub_scales) {  // two-level: super * sub, exact (quant_linear.h)
            const __m128i sub = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.sub_scales + at + off));
            d[p] = _mm512_mul_ps(_mm512_loadu_ps(w.scales + sup + off),
                                 _mm512_cvtepi32_ps(BITS == 6 ? _mm512_cvtepi8_epi32(sub) : _mm512_cvtepu8_epi32(sub)));
          } else {
            d[p] = _mm512_loadu_ps(w.scales + at + off);
          }
          if (w.mins && w.sub_scales) {
            const __m128i sub_min =
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.sub_scales + quant_sub_min_offset(w) + at + off));
            m[p] = _mm512_mul_ps(_mm512_loadu_ps(w.mins + sup + off), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sub_min)));
          } else if (w.mins) {
            m[p] = _mm512_loadu_ps(w.mins + at + off);
          } else if constexpr (BITS == 8) {
            m[p] = _mm512_setzero_ps();
          } else {
            m[p] = _mm512_mul_ps(d[p], _mm512_set1_ps(-quant_symmetric_offset(BITS)));
          }
        }
      }
      __m512i src[2];
#pragma GCC unroll 2
      for (int p = 0; p < 2; ++p) {
        const uint8_t* ga = wb + 2 * p * kBlockBytes;
        src[p] = quad_codes_pair<BITS>(ga, ga + kBlockBytes, quad);
      }
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const int64_t k = b * kQuantBlock + quad * 4 + j;
        __m512 wv[2];
#pragma GCC unroll 2
        for (int p = 0; p < 2; ++p) wv[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lane_code_zmm<BITS>(src[p], j)), d[p], m[p]);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const __m512 xv = _mm512_set1_ps(xr[r * x_stride + k]);
          acc[r * 2] = _mm512_fmadd_ps(wv[0], xv, acc[r * 2]);
          acc[r * 2 + 1] = _mm512_fmadd_ps(wv[1], xv, acc[r * 2 + 1]);
        }
      }
    }
  }
  const int64_t n0 = g0 * kQuantGroupCols;
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* dst = out + (r0 + r) * out_stride;
    store_pair(acc[r * 2], bias, dst, n0, w.out_features);
    store_pair(acc[r * 2 + 1], bias, dst, n0 + 16, w.out_features);
  }
}

template <int BITS>
void zmm_direct_rows(const float* x, int64_t x_stride, const QuantWeightView& w, int64_t r0, int64_t rows,
                     int64_t g0, const float* bias, float* out, int64_t out_stride) {
  switch (rows) {
    case 2: zmm_direct_tile<2, BITS>(x, x_stride, w, r0, g0, bias, out, out_stride); break;
    case 3: zmm_direct_tile<3, BITS>(x, x_stride, w, r0, g0, bias, out, out_stride); break;
    case 4: zmm_direct_tile<4, BITS>(x, x_stride, w, r0, g0, bias, out, out_stride); break;
    case 5: zmm_direct_tile<5, BITS>(x, x_stride, w, r0, g0, bias, out, out_stride); break;
    case 6: zmm_direct_tile<6, BITS>(x, x_stride, w, r0, g0, bias, out, out_stride); break;
    case 7: zmm_direct_tile<7, BITS>(x, x_stride, w, r0, g0, bias, out, out_stride); break;
    case 8: zmm_direct_tile<8, BITS>(x, x_stride, w, r0, g0, bias, out, out_stride); break;
    default: zmm_direct_tile<1, BITS>(x, x_stride, w, r0, g0, bias, out, out_stride); break;
  }
}

// MR rows x both halves of a dequantized tile panel (panel_tile's 512-bit twin: a half is 16
// features wide, one vector per k).
template <int MR>
void zmm_panel_tile(const float* x, int64_t x_stride, const float* panel, int64_t half_panel, int halves, int64_t K,
                    int64_t r0, int64_t n0, int64_t N, const float* bias, float* out, int64_t out_stride) {
  __m512 acc[MR * 2];
#pragma GCC unroll 16
  for (int i = 0; i < MR * 2; ++i) acc[i] = _mm512_setzero_ps();
  const float* xr = x + r0 * x_stride;
  const float* p1 = panel + (halves == 2 ? half_panel : 0);
  for (int64_t k = 0; k < K; ++k) {
    const __m512 w0 = _mm512_loadu_ps(panel + k * 16);
    const __m512 w1 = _mm512_loadu_ps(p1 + k * 16);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512 xv = _mm512_set1_ps(xr[r * x_stride + k]);
      acc[r * 2] = _mm512_fmadd_ps(w0, xv, acc[r * 2]);
      if (halves == 2) acc[r * 2 + 1] = _mm512_fmadd_ps(w1, xv, acc[r * 2 + 1]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    float* dst = out + (r0 + r) * out_stride;
    store_pair(acc[r * 2], bias, dst, n0, N);
    if (halves == 2) store_pair(acc[r * 2 + 1], bias, dst, n0 + 16, N);
  }
}

void zmm_panel_rows(const float* x, int64_t x_stride, const float* panel, int64_t half_panel, int halves, int64_t K,
                    int64_t row_begin, int64_t row_end, int64_t n0, int64_t N, const float* bias, float* out,
                    int64_t out_stride) {
  int64_t r = row_begin;
  for (; r + 12 <= row_end; r += 12) {
    zmm_panel_tile<12>(x, x_stride, panel, half_panel, halves, K, r, n0, N, bias, out, out_stride);
  }
  const int64_t left = row_end - r;
  if (left > 8) {
    zmm_panel_tile<4>(x, x_stride, panel, half_panel, halves, K, r, n0, N, bias, out, out_stride);
    r += 4;
  }
  switch (row_end - r) {
    case 8: zmm_panel_tile<8>(x, x_stride, panel, half_panel, halves, K, r, n0, N, bias, out, out_stride); break;
    case 7: zmm_panel_tile<7>(x, x_stride, panel, half_panel, halves, K, r, n0, N, bias, out, out_stride); break;
    case 6: zmm_panel_tile<6>(x, x_stride, panel, half_panel, halves, K, r, n0, N, bias, out, out_stride); break;
    case 5: zmm_panel_tile<5>(x, x_stride, panel, half_panel, halves, K, r, n0, N, bias, out, out_stride); break;
    case 4: zmm_panel_tile<4>(x, x_stride, panel, half_panel, halves, K, r, n0, N, bias, out, out_stride); break;
    case 3: zmm_panel_tile<3>(x, x_stride, panel, half_panel, halves, K, r, n0, N, bias, out, out_stride); break;
    case 2: zmm_panel_tile<2>(x, x_stride, panel, half_panel, halves, K, r, n0, N, bias, out, out_stride); break;
    case 1: zmm_panel_tile<1>(x, x_stride, panel, half_panel, halves, K, r, n0, N, bias, out, out_stride); break;
    default: break;
  }
}

// The AVX-512 build's exact path: up to kZmmSplitRows rows in 512-bit register tiles, more through
// a dequantized panel with 512-bit row tiles. One row runs here too: its 2 fma chains per tile
// wait on fma latency, yet it measured faster than the 256-bit tile's 4 chains (qkv 20 -> 15 µs,
// gate/up 64 -> 41-47 µs, the Q8_0 output head 740 -> 610 µs), having half the instructions.
constexpr int64_t kZmmDirectRows = 8;
// Up to this many rows the tile runs as balanced register tiles of at most kZmmDirectRows rows
// each, dequantizing in registers once per tile instead of storing and reloading a panel:
// measured faster at 12 and 16 rows (default model, a 16-row decode step 19.0 -> 16.2 ms; the
// 1.5B Q4_K_M 176 -> 173 ms), even at 24, slower at 32.
constexpr int64_t kZmmSplitRows = 16;

void gemm_f32_avx512(const float* x, int64_t x_stride, const QuantWeightView& w, int64_t row_begin, int64_t row_end,
                     int64_t group_begin, int64_t group_end, const float* bias, float* out, int64_t out_stride,
                     float* panel) {
  const int64_t rows = row_end - row_begin, K = w.in_features;
  for (int64_t g = group_begin; g < group_end; g += kQuantTileGroups) {
    // Work items are whole tiles (quant_linear.cc: group_begin starts one); the padded groups of
    // the last tile hold zero codes and their features are never stored.
    if (rows <= kZmmSplitRows) {
      const int64_t chunks = (rows + kZmmDirectRows - 1) / kZmmDirectRows;
      with_bits(w.bits, [&](auto bits) {
        for (int64_t c = 0, r = row_begin; c < chunks; ++c) {
          const int64_t n = (row_end - r) / (chunks - c);
          zmm_direct_rows<decltype(bits)::value>(x, x_stride, w, r, n, g, bias, out, out_stride);
          r += n;
        }
      });
      continue;
    }
    const int64_t half_panel = K * 2 * kQuantGroupCols;
    const int64_t ng = std::min<int64_t>(kQuantTileGroups, group_end - g);
    with_bits(w.bits, [&](auto bits) { dequant_tile<decltype(bits)::value>(w, g, ng, panel, half_panel); });
    zmm_panel_rows(x, x_stride, panel, half_panel, ng > 2 ? 2 : 1, K, row_begin, row_end, g * kQuantGroupCols,
                   w.out_features, bias, out, out_stride);
  }
}
