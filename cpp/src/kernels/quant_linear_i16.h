// Internal: the int16-activation path of the block-quantized linear layer (quant_linear.h,
// "Activations"), written once with AVX2 intrinsics and compiled per ISA: quant_linear_<isa>.cc
// includes it right after kernels/quant_linear_simd.h (whose quad_codes and scale_min it uses),
// inside the same namespace and target region. The AVX-512 regions define TRILLIUM_QL_I16_ZMM
// (512-bit tiles for whole tiles of groups) and, with VNNI, TRILLIUM_QL_VNNI (vpdpwssd).
//
// Why int16: a decode or prefill step of a quantized model spends its time turning codes into
// fp32 weights (shift, mask, convert, fma: ~4 instructions a weight) before the fma that uses
// them. Here the codes stay integers: one pmaddwd multiplies 16 int16 codes by 16 int16
// activations and adds pairs into int32, exactly. Activations rounded to int16 per 32-wide block
// carry a relative error of ~1.5e-5 of the block's largest value -- 256x less than int8's, which
// moved a 135M model's top token at 3% of positions (bench/RESULTS.md, "Precision").
//
// Activation codes go in k-quad order [k0, k2, k1, k3] (quantize_rows_i16): the 32-bit lane of
// a quad's weight codes (quant_linear_simd.h: lane c = the 4 codes of column c) splits into its
// even bytes (k0, k2) and odd bytes (k1, k3) as two int16 pairs, each multiplied by one
// broadcast 32-bit pair of activation codes.
//
// Arithmetic, the same on every ISA and for any number of rows (the portable path in
// quant_linear.cc is its reference): per scale block s (32 weights, 16 for 6-bit codes) the
// int32 dot product D of codes and activation codes, exact; then
//   acc = fma(float(D), d * sx, acc);  acc = fma(m, sx * float(sum of the block's activation codes), acc)
// in block order, where d and m are the weight scale and min (scale_min) and sx the activation
// block's scale; and out = acc + bias.

// Two int16 codes as one 32-bit lane (a broadcast pair).
inline int32_t load_i32_pair(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// acc + the int16 pair products of a and b summed per 32-bit lane (pmaddwd, then paddd; one
// vpdpwssd where the region is compiled with TRILLIUM_QL_VNNI). Both wrap the same way, and no
// pair of products here can overflow (activation codes stop at +-32767, weight codes are small),
// so the two are bit-identical.
inline __m256i i16_dot(__m256i acc, __m256i a, __m256i b) {
#if defined(TRILLIUM_QL_VNNI)
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

// Quantize rows [row_begin, row_end) of x (see QuantActs16), AVX2.
void quantize_rows_i16(const float* x, int64_t x_stride, int64_t row_begin, int64_t row_end, int64_t K,
                       int16_t* codes, float* scale, float* scaled_sum16, float* scaled_sum32) {
  const int64_t nb = K / kQuantBlock;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + r * x_stride + b * kQuantBlock;
      const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
      const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
      const __m256 m01 = _mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask));
      const __m256 m23 = _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask));
      float d = 0.0f, id = 0.0f;
      quant_block_scale_i16(hmax(_mm256_max_ps(m01, m23)), &d, &id);
      const __m256 inv = _mm256_set1_ps(id);
      // cvtps2dq rounds to nearest even, like nearbyint in the portable path; then [k0 k2 k1 k3]
      // within each quad (a 32-bit shuffle), and packs saturate at +-32767 as the portable clamp.
      constexpr int kQuadOrder = _MM_SHUFFLE(3, 1, 2, 0);
      const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, inv)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, inv));
      const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, inv)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, inv));
      const __m256i p01 = _mm256_packs_epi32(_mm256_shuffle_epi32(i0, kQuadOrder), _mm256_shuffle_epi32(i1, kQuadOrder));
      const __m256i p23 = _mm256_packs_epi32(_mm256_shuffle_epi32(i2, kQuadOrder), _mm256_shuffle_epi32(i3, kQuadOrder));
      int16_t* dst = codes + r * K + b * kQuantBlock;
      // packs interleaves 128-bit lanes: [i0 lo, i1 lo, i0 hi, i1 hi] -> k order with (0, 2, 1, 3).
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_permute4x64_epi64(p01, _MM_SHUFFLE(3, 1, 2, 0)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16), _mm256_permute4x64_epi64(p23, _MM_SHUFFLE(3, 1, 2, 0)));
      // Sums of the saturated codes, as stored (|x * inv| <= 32767 + rounding: nothing clips).
      const int32_t s0 = hsum_i32(_mm256_add_epi32(i0, i1)), s1 = hsum_i32(_mm256_add_epi32(i2, i3));
      scale[r * nb + b] = d;
      scaled_sum16[r * 2 * nb + 2 * b] = d * static_cast<float>(s0);
      scaled_sum16[r * 2 * nb + 2 * b + 1] = d * static_cast<float>(s1);
      scaled_sum32[r * nb + b] = d * static_cast<float>(s0 + s1);
    }
  }
}

// A quad's codes (lane c = column c's 4 codes, bytes k0..k3) as int16 pairs: even = (k0, k2),
// odd = (k1, k3) per 32-bit lane, sign-extended for 8-bit codes.
template <int BITS>
inline void split_pairs(__m256i q, __m256i* even, __m256i* odd) {
  if constexpr (BITS == 8) {
    *even = _mm256_srai_epi16(_mm256_slli_epi16(q, 8), 8);
    *odd = _mm256_srai_epi16(q, 8);
  } else {
    *even = _mm256_and_si256(q, _mm256_set1_epi16(0x00FF));
    *odd = _mm256_srli_epi16(q, 8);
  }
}

// Pairs of quads p and p + 4 of a 4-bit record straight from its one 32-byte load: nibble j of
// each 16-bit word is k-quad p's byte j / 2 (j = 0, 2: low nibbles) or quad p + 4's (j = 1, 3).
inline void split_pairs_q4(const uint8_t* wb, int p, __m256i* even_lo, __m256i* odd_lo, __m256i* even_hi,
                           __m256i* odd_hi) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + p * 32));
  const __m256i nib = _mm256_set1_epi16(0x000F);
  *even_lo = _mm256_and_si256(v, nib);
  *odd_lo = _mm256_and_si256(_mm256_srli_epi16(v, 8), nib);
  *even_hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
  *odd_hi = _mm256_srli_epi16(v, 12);
}

// The fp32 step of one scale block s of block b for MR rows x NG groups: acc += float(dot) *
// (d * sx) + m * (sx * the scale block's code sum), d and m of group jg in d[jg], m[jg].
template <int MR, int NG, int kScaleBlocks>
inline void add_scale_block(const QuantActs16& a, int64_t r0, int64_t b, int s, const __m256i* dot, const __m256* d,
                            const __m256* m, __m256* acc) {
  const int64_t nb = a.blocks;
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    const int64_t row = r0 + r;
    const __m256 sx = _mm256_set1_ps(a.scale[row * nb + b]);
    const __m256 ss = _mm256_set1_ps(kScaleBlocks == 2 ? a.scaled_sum16[row * 2 * nb + 2 * b + s]
                                                       : a.scaled_sum32[row * nb + b]);
#pragma GCC unroll 4
    for (int jg = 0; jg < NG; ++jg) {
      acc[r * NG + jg] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r * NG + jg]), _mm256_mul_ps(d[jg], sx), acc[r * NG + jg]);
      acc[r * NG + jg] = _mm256_fmadd_ps(m[jg], ss, acc[r * NG + jg]);
    }
  }
}

// out rows r0 .. r0 + MR - 1, columns n0 .. n0 + 8 NG - 1 (those below N) = acc (+ bias).
template <int MR, int NG>
inline void store_tile(const __m256* acc, int64_t r0, int64_t n0, int64_t N, const float* bias, float* out,
                       int64_t out_stride) {
  alignas(32) float result[MR * NG * 8];
#pragma GCC unroll 16
  for (int i = 0; i < MR * NG; ++i) _mm256_store_ps(result + i * 8, acc[i]);
  for (int r = 0; r < MR; ++r) {
    for (int jg = 0; jg < NG; ++jg) {
      const int64_t n = n0 + jg * kQuantGroupCols;
      const int64_t cols = N - n < 8 ? N - n : 8;
      const float* src = result + (r * NG + jg) * 8;
      float* dst = out + (r0 + r) * out_stride + n;
      for (int64_t c = 0; c < cols; ++c) dst[c] = bias ? src[c] + bias[n + c] : src[c];
    }
  }
}

// MR rows x NG groups (8 features each, in one tile) over all of K, codes read straight into
// registers.
template <int MR, int NG, int BITS>
void i16_tile(const QuantActs16& a, const QuantWeightView& w, int64_t r0, int64_t g0, const float* bias, float* out,
              int64_t out_stride) {
  const int64_t nb = a.blocks, K = a.in_features;
  constexpr int64_t kBlockBytes = kQuantBlock * kQuantGroupCols * BITS / 8;
  constexpr int kScaleBlocks = static_cast<int>(quant_scale_blocks(BITS));
  constexpr int kQuadsPerScale = 8 / kScaleBlocks;
  const uint8_t* codes = static_cast<const uint8_t*>(w.codes);
  __m256 acc[MR * NG];
#pragma GCC unroll 16
  for (int i = 0; i < MR * NG; ++i) acc[i] = _mm256_setzero_ps();
  // The NG groups sit side by side in one tile (i16_rows keeps them so): their records, scales
  // and super scales are consecutive, and each block moves them all by one stride. Indexing
  // each from scratch (quant_record, quant_scale_index) cost more scalar instructions than the
  // block's vector work at one row.
  const uint8_t* records = codes + quant_record(g0, 0, nb) * kBlockBytes;
  constexpr int64_t kRecordStride = kQuantTileGroups * kBlockBytes;
  constexpr int64_t kScaleStride = kScaleBlocks * kQuantTileGroups * kQuantGroupCols;
  const int64_t scale0 = quant_scale_index(g0, 0, 0, nb, kScaleBlocks);
  const int64_t super0 = w.sub_scales ? quant_super_index(g0, 0, nb) : 0;
  const int64_t sub_mins = w.sub_scales && w.mins ? quant_sub_min_offset(w) : 0;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb[NG];
#pragma GCC unroll 4
    for (int jg = 0; jg < NG; ++jg) wb[jg] = records + b * kRecordStride + jg * kBlockBytes;
    prefetch_codes<NG * kBlockBytes>(wb[0] + kPrefetchBlocks * kRecordStride);
#pragma GCC unroll 2
    for (int s = 0; s < kScaleBlocks; ++s) {
      __m256i dot[MR * NG];
#pragma GCC unroll 16
      for (int i = 0; i < MR * NG; ++i) dot[i] = _mm256_setzero_si256();
      // One quad (4 k) of every row and group: the rows' activation pairs broadcast once, then
      // each group's codes split and multiplied into its rows' dots.
      const auto activations = [&](int quad, __m256i* x02, __m256i* x13) {
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const int16_t* xq = a.codes + (r0 + r) * K + b * kQuantBlock + quad * 4;
          x02[r] = _mm256_set1_epi32(load_i32_pair(xq));
          x13[r] = _mm256_set1_epi32(load_i32_pair(xq + 2));
        }
      };
      const auto accumulate = [&](int jg, __m256i even, __m256i odd, const __m256i* x02, const __m256i* x13) {
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          dot[r * NG + jg] = i16_dot(dot[r * NG + jg], even, x02[r]);
          dot[r * NG + jg] = i16_dot(dot[r * NG + jg], odd, x13[r]);
        }
      };
      // Quads not unrolled (as in i16_panel_tile): unrolled, GCC hoisted every product of the
      // block ahead of its sums and spilled them.
      if constexpr (BITS == 4) {
#pragma GCC unroll 1
        for (int p = 0; p < 4; ++p) {
          __m256i lo02[MR], lo13[MR], hi02[MR], hi13[MR];
          activations(p, lo02, lo13);
          activations(p + 4, hi02, hi13);
#pragma GCC unroll 4
          for (int jg = 0; jg < NG; ++jg) {
            __m256i even_lo, odd_lo, even_hi, odd_hi;
            split_pairs_q4(wb[jg], p, &even_lo, &odd_lo, &even_hi, &odd_hi);
            accumulate(jg, even_lo, odd_lo, lo02, lo13);
            accumulate(jg, even_hi, odd_hi, hi02, hi13);
          }
        }
      } else {
#pragma GCC unroll 1
        for (int quad = s * kQuadsPerScale; quad < (s + 1) * kQuadsPerScale; ++quad) {
          __m256i x02[MR], x13[MR];
          activations(quad, x02, x13);
#pragma GCC unroll 4
          for (int jg = 0; jg < NG; ++jg) {
            __m256i even, odd;
            split_pairs<BITS>(quad_codes<BITS>(wb[jg], quad), &even, &odd);
            accumulate(jg, even, odd, x02, x13);
          }
        }
      }
      __m256 d[NG], m[NG];
#pragma GCC unroll 4
      for (int jg = 0; jg < NG; ++jg) {
        const int64_t at = scale0 + b * kScaleStride + s * kQuantTileGroups * kQuantGroupCols + jg * kQuantGroupCols;
        const int64_t sup = super0 + (b / kSuperBlocks) * kQuantTileGroups * kQuantGroupCols + jg * kQuantGroupCols;
        scale_min_at<BITS>(w, at, sup, sub_mins, &d[jg], &m[jg]);
      }
      add_scale_block<MR, NG, kScaleBlocks>(a, r0, b, s, dot, d, m, acc);
    }
  }
  store_tile<MR, NG>(acc, r0, g0 * kQuantGroupCols, w.out_features, bias, out, out_stride);
}

template <int MR, int BITS>
void i16_rows(const QuantActs16& a, const QuantWeightView& w, int64_t r0, int64_t group_begin, int64_t group_end,
              const float* bias, float* out, int64_t out_stride) {
  int64_t g = group_begin;
  // Wide tiles where the registers allow (MR x NG int32 dots + as many fp32 accumulators + the
  // codes of NG groups): more groups share each activation broadcast, more rows each code split.
  if constexpr (MR * 4 <= kI16MaxTile) {
    for (; g + 4 <= group_end; g += 4) i16_tile<MR, 4, BITS>(a, w, r0, g, bias, out, out_stride);
  }
  if constexpr (MR * 2 <= kI16MaxTile) {
    for (; g + 2 <= group_end; g += 2) i16_tile<MR, 2, BITS>(a, w, r0, g, bias, out, out_stride);
  }
  for (; g < group_end; ++g) i16_tile<MR, 1, BITS>(a, w, r0, g, bias, out, out_stride);
}

// The last `left` (< kI16Rows) rows, in one tile of that height.
template <int MR, int BITS>
void i16_remainder(int64_t left, const QuantActs16& a, const QuantWeightView& w, int64_t r0, int64_t group_begin,
                   int64_t group_end, const float* bias, float* out, int64_t out_stride) {
  if constexpr (MR > 0) {
    if (left == MR) {
      i16_rows<MR, BITS>(a, w, r0, group_begin, group_end, bias, out, out_stride);
    } else {
      i16_remainder<MR - 1, BITS>(left, a, w, r0, group_begin, group_end, bias, out, out_stride);
    }
  }
}

// ------------------------------------------------------------------------ many rows: a panel
// Past kI16DirectRows rows, one tile's codes are split into int16 pairs once, into a panel
// [block][quad][even, odd][group of the tile][16 int16], with its scales and mins as fp32 lanes
// [block][scale block][group][8]; register tiles of kI16PanelRows rows x 2 groups then read it
// for every row. The same arithmetic per scale block as i16_tile, in the same order. Groups are
// innermost so that two neighbours' codes, scales and mins are one 512-bit load (the zmm tiles).
struct I16Panel {
  std::vector<int16_t> codes;  // per tile: nb * 8 * kQuantTileGroups * 2 vectors of 16
  std::vector<float> scales, mins;  // per tile: nb * scale blocks * kQuantTileGroups * 8
};

template <int BITS>
void i16_build_panel(const QuantWeightView& w, int64_t g0, int64_t ng, I16Panel& panel) {
  const int64_t nb = w.in_features / kQuantBlock;
  constexpr int64_t kBlockBytes = kQuantBlock * kQuantGroupCols * BITS / 8;
  constexpr int kScaleBlocks = static_cast<int>(quant_scale_blocks(BITS));
  constexpr int64_t kRecordStride = kQuantTileGroups * kBlockBytes;
  constexpr int64_t kScaleStride = kScaleBlocks * kQuantTileGroups * kQuantGroupCols;
  panel.codes.resize(static_cast<size_t>(nb * 8 * kQuantTileGroups * 2 * 16));
  panel.scales.resize(static_cast<size_t>(nb * kScaleStride));
  panel.mins.resize(panel.scales.size());
  const uint8_t* records = static_cast<const uint8_t*>(w.codes) + quant_record(g0, 0, nb) * kBlockBytes;
  const int64_t scale0 = quant_scale_index(g0, 0, 0, nb, kScaleBlocks);
  const int64_t super0 = w.sub_scales ? quant_super_index(g0, 0, nb) : 0;
  const int64_t sub_mins = w.sub_scales && w.mins ? quant_sub_min_offset(w) : 0;
  for (int64_t b = 0; b < nb; ++b) {
    prefetch_codes<kRecordStride>(records + (b + kPrefetchBlocks) * kRecordStride);
    for (int64_t j = 0; j < ng; ++j) {
      const uint8_t* wb = records + b * kRecordStride + j * kBlockBytes;
      int16_t* dst = panel.codes.data() + (b * 8 * kQuantTileGroups * 2 + j) * 16;
      constexpr int64_t kQuadStride = kQuantTileGroups * 2 * 16;
      const auto put = [&](int quad, __m256i even, __m256i odd) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + quad * kQuadStride), even);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + quad * kQuadStride + kQuantTileGroups * 16), odd);
      };
      if constexpr (BITS == 4) {
        for (int p = 0; p < 4; ++p) {
          __m256i even_lo, odd_lo, even_hi, odd_hi;
          split_pairs_q4(wb, p, &even_lo, &odd_lo, &even_hi, &odd_hi);
          put(p, even_lo, odd_lo);
          put(p + 4, even_hi, odd_hi);
        }
      } else {
        for (int quad = 0; quad < 8; ++quad) {
          __m256i even, odd;
          split_pairs<BITS>(quad_codes<BITS>(wb, quad), &even, &odd);
          put(quad, even, odd);
        }
      }
      for (int s = 0; s < kScaleBlocks; ++s) {
        const int64_t lane = s * kQuantTileGroups * kQuantGroupCols + j * kQuantGroupCols;
        const int64_t sup = super0 + (b / kSuperBlocks) * kQuantTileGroups * kQuantGroupCols + j * kQuantGroupCols;
        __m256 d, m;
        scale_min_at<BITS>(w, scale0 + b * kScaleStride + lane, sup, sub_mins, &d, &m);
        _mm256_storeu_ps(panel.scales.data() + b * kScaleStride + lane, d);
        _mm256_storeu_ps(panel.mins.data() + b * kScaleStride + lane, m);
      }
    }
  }
}

// MR rows x NG groups (groups j0 .. j0 + NG - 1 of the panel's tile) over all of K.
template <int MR, int NG, int BITS>
void i16_panel_tile(const QuantActs16& a, const I16Panel& panel, int64_t j0, int64_t r0, int64_t n0, int64_t N,
                    const float* bias, float* out, int64_t out_stride) {
  const int64_t nb = a.blocks, K = a.in_features;
  constexpr int kScaleBlocks = static_cast<int>(quant_scale_blocks(BITS));
  constexpr int kQuadsPerScale = 8 / kScaleBlocks;
  constexpr int64_t kScaleStride = kScaleBlocks * kQuantTileGroups * kQuantGroupCols;
  __m256 acc[MR * NG];
#pragma GCC unroll 16
  for (int i = 0; i < MR * NG; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int16_t* pb = panel.codes.data() + (b * 8 * kQuantTileGroups * 2 + j0) * 16;
#pragma GCC unroll 2
    for (int s = 0; s < kScaleBlocks; ++s) {
      __m256i dot[MR * NG];
#pragma GCC unroll 16
      for (int i = 0; i < MR * NG; ++i) dot[i] = _mm256_setzero_si256();
      // Not unrolled: unrolled, GCC computed every product of the block first (integer adds
      // reassociate), spilled them all and summed them after -- 1.5x slower than fp32 fmas.
#pragma GCC unroll 1
      for (int quad = s * kQuadsPerScale; quad < (s + 1) * kQuadsPerScale; ++quad) {
        __m256i even[NG], odd[NG];
#pragma GCC unroll 4
        for (int jg = 0; jg < NG; ++jg) {
          const int16_t* at = pb + (quad * kQuantTileGroups * 2 + jg) * 16;
          even[jg] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
          odd[jg] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + kQuantTileGroups * 16));
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const int16_t* xq = a.codes + (r0 + r) * K + b * kQuantBlock + quad * 4;
          const __m256i x02 = _mm256_set1_epi32(load_i32_pair(xq));
          const __m256i x13 = _mm256_set1_epi32(load_i32_pair(xq + 2));
#pragma GCC unroll 4
          for (int jg = 0; jg < NG; ++jg) {
            dot[r * NG + jg] = i16_dot(dot[r * NG + jg], even[jg], x02);
            dot[r * NG + jg] = i16_dot(dot[r * NG + jg], odd[jg], x13);
          }
        }
      }
      __m256 d[NG], m[NG];
#pragma GCC unroll 4
      for (int jg = 0; jg < NG; ++jg) {
        const int64_t lane = b * kScaleStride + s * kQuantTileGroups * kQuantGroupCols + (j0 + jg) * kQuantGroupCols;
        d[jg] = _mm256_loadu_ps(panel.scales.data() + lane);
        m[jg] = _mm256_loadu_ps(panel.mins.data() + lane);
      }
      add_scale_block<MR, NG, kScaleBlocks>(a, r0, b, s, dot, d, m, acc);
    }
  }
  store_tile<MR, NG>(acc, r0, n0, N, bias, out, out_stride);
}

template <int NG, int BITS>
void i16_panel_rows(const QuantActs16& a, const I16Panel& panel, int64_t j0, int64_t row_begin, int64_t row_end,
                    int64_t n0, int64_t N, const float* bias, float* out, int64_t out_stride) {
  int64_t r = row_begin;
  for (; r + kI16PanelRows <= row_end; r += kI16PanelRows) {
    i16_panel_tile<kI16PanelRows, NG, BITS>(a, panel, j0, r, n0, N, bias, out, out_stride);
  }
  for (; r < row_end; ++r) i16_panel_tile<1, NG, BITS>(a, panel, j0, r, n0, N, bias, out, out_stride);
}

#if defined(TRILLIUM_QL_I16_ZMM)
// --------------------------------------------------- many rows at 512 bits (AVX-512 regions)
// i16_panel_tile with each vector holding a pair of neighbouring groups (16 output features: the
// panel keeps their codes, scales and mins side by side). Every lane runs the same integer dot and
// the same fp32 steps in the same order as the 256-bit tile, so the results are bit-identical;
// each instruction does twice the work, which is what a prefill or a many-stream decode step,
// bound by these dots, needs. Written for the AVX-512 regions only (store_pair:
// quant_linear_zmm.h, included before this header there).

inline __m512i i16_dot_zmm(__m512i acc, __m512i a, __m512i b) {
#if defined(TRILLIUM_QL_VNNI)
  return _mm512_dpwssd_epi32(acc, a, b);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

// add_scale_block for MR rows x NP pairs of groups, d and m of pair p in d[p], m[p].
template <int MR, int NP, int kScaleBlocks>
inline void add_scale_block_zmm(const QuantActs16& a, int64_t r0, int64_t b, int s, const __m512i* dot,
                                const __m512* d, const __m512* m, __m512* acc) {
  const int64_t nb = a.blocks;
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    const int64_t row = r0 + r;
    const __m512 sx = _mm512_set1_ps(a.scale[row * nb + b]);
    const __m512 ss = _mm512_set1_ps(kScaleBlocks == 2 ? a.scaled_sum16[row * 2 * nb + 2 * b + s]
                                                       : a.scaled_sum32[row * nb + b]);
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) {
      acc[r * NP + p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r * NP + p]), _mm512_mul_ps(d[p], sx), acc[r * NP + p]);
      acc[r * NP + p] = _mm512_fmadd_ps(m[p], ss, acc[r * NP + p]);
    }
  }
}

// MR rows x NP pairs (groups j0 .. j0 + 2 NP - 1 of the panel's tile) over all of K.
template <int MR, int NP, int BITS>
void i16_panel_tile_zmm(const QuantActs16& a, const I16Panel& panel, int64_t j0, int64_t r0, int64_t n0, int64_t N,
                        const float* bias, float* out, int64_t out_stride) {
  const int64_t nb = a.blocks, K = a.in_features;
  constexpr int kScaleBlocks = static_cast<int>(quant_scale_blocks(BITS));
  constexpr int kQuadsPerScale = 8 / kScaleBlocks;
  constexpr int64_t kScaleStride = kScaleBlocks * kQuantTileGroups * kQuantGroupCols;
  __m512 acc[MR * NP];
#pragma GCC unroll 16
  for (int i = 0; i < MR * NP; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int16_t* pb = panel.codes.data() + (b * 8 * kQuantTileGroups * 2 + j0) * 16;
#pragma GCC unroll 2
    for (int s = 0; s < kScaleBlocks; ++s) {
      __m512i dot[MR * NP];
#pragma GCC unroll 16
      for (int i = 0; i < MR * NP; ++i) dot[i] = _mm512_setzero_si512();
#pragma GCC unroll 1
      for (int quad = s * kQuadsPerScale; quad < (s + 1) * kQuadsPerScale; ++quad) {
        __m512i even[NP], odd[NP];
#pragma GCC unroll 2
        for (int p = 0; p < NP; ++p) {
          const int16_t* at = pb + (quad * kQuantTileGroups * 2 + 2 * p) * 16;
          even[p] = _mm512_loadu_si512(at);
          odd[p] = _mm512_loadu_si512(at + kQuantTileGroups * 16);
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const int16_t* xq = a.codes + (r0 + r) * K + b * kQuantBlock + quad * 4;
          const __m512i x02 = _mm512_set1_epi32(load_i32_pair(xq));
          const __m512i x13 = _mm512_set1_epi32(load_i32_pair(xq + 2));
#pragma GCC unroll 2
          for (int p = 0; p < NP; ++p) {
            dot[r * NP + p] = i16_dot_zmm(dot[r * NP + p], even[p], x02);
            dot[r * NP + p] = i16_dot_zmm(dot[r * NP + p], odd[p], x13);
          }
        }
      }
      __m512 d[NP], m[NP];
#pragma GCC unroll 2
      for (int p = 0; p < NP; ++p) {
        const int64_t lane = b * kScaleStride + s * kQuantTileGroups * kQuantGroupCols + (j0 + 2 * p) * kQuantGroupCols;
        d[p] = _mm512_loadu_ps(panel.scales.data() + lane);
        m[p] = _mm512_loadu_ps(panel.mins.data() + lane);
      }
      add_scale_block_zmm<MR, NP, kScaleBlocks>(a, r0, b, s, dot, d, m, acc);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* dst = out + (r0 + r) * out_stride;
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) store_pair(acc[r * NP + p], bias, dst, n0 + p * 2 * kQuantGroupCols, N);
  }
}

// The direct path at 512 bits: MR rows x one whole tile (2 pairs of groups) over all of K, codes
// read straight from the records (a pair's two records are neighbours: one 64-byte load).

// split_pairs / split_pairs_q4 on a pair of groups.
template <int BITS>
inline void split_pairs_zmm(__m512i q, __m512i* even, __m512i* odd) {
  if constexpr (BITS == 8) {
    *even = _mm512_srai_epi16(_mm512_slli_epi16(q, 8), 8);
    *odd = _mm512_srai_epi16(q, 8);
  } else {
    *even = _mm512_and_si512(q, _mm512_set1_epi16(0x00FF));
    *odd = _mm512_srli_epi16(q, 8);
  }
}

inline void split_pairs_q4_zmm(const uint8_t* a, const uint8_t* b, int p, __m512i* even_lo, __m512i* odd_lo,
                               __m512i* even_hi, __m512i* odd_hi) {
  const __m512i v = load_pair(a + p * 32, b + p * 32);
  const __m512i nib = _mm512_set1_epi16(0x000F);
  *even_lo = _mm512_and_si512(v, nib);
  *odd_lo = _mm512_and_si512(_mm512_srli_epi16(v, 8), nib);
  *even_hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
  *odd_hi = _mm512_srli_epi16(v, 12);
}

// Two groups' 8 lanes as one vector: `lo` in the low half.
inline __m512 join_halves(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}

template <int MR, int BITS>
void i16_tile_zmm(const QuantActs16& a, const QuantWeightView& w, int64_t r0, int64_t g0, const float* bias, float* out,
                  int64_t out_stride) {
  const int64_t nb = a.blocks, K = a.in_features;
  constexpr int64_t kBlockBytes = kQuantBlock * kQuantGroupCols * BITS / 8;
  constexpr int kScaleBlocks = static_cast<int>(quant_scale_blocks(BITS));
  constexpr int kQuadsPerScale = 8 / kScaleBlocks;
  constexpr int64_t kRecordStride = kQuantTileGroups * kBlockBytes;
  constexpr int64_t kScaleStride = kScaleBlocks * kQuantTileGroups * kQuantGroupCols;
  const uint8_t* records = static_cast<const uint8_t*>(w.codes) + quant_record(g0, 0, nb) * kBlockBytes;
  const int64_t scale0 = quant_scale_index(g0, 0, 0, nb, kScaleBlocks);
  const int64_t super0 = w.sub_scales ? quant_super_index(g0, 0, nb) : 0;
  const int64_t sub_mins = w.sub_scales && w.mins ? quant_sub_min_offset(w) : 0;
  __m512 acc[MR * 2];
#pragma GCC unroll 16
  for (int i = 0; i < MR * 2; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = records + b * kRecordStride;
    prefetch_codes<kRecordStride>(wb + kPrefetchBlocks * kRecordStride);
    const int16_t* xb = a.codes + r0 * K + b * kQuantBlock;
#pragma GCC unroll 2
    for (int s = 0; s < kScaleBlocks; ++s) {
      __m512i dot[MR * 2];
#pragma GCC unroll 16
      for (int i = 0; i < MR * 2; ++i) dot[i] = _mm512_setzero_si512();
      // Row r's activation pair at k offset `at` of the block, broadcast (an embedded broadcast
      // operand of vpdpwssd: no register held per row).
      const auto x_pair = [&](int r, int at) { return _mm512_set1_epi32(load_i32_pair(xb + r * K + at)); };
      if constexpr (BITS == 4) {
#pragma GCC unroll 1
        for (int p = 0; p < 4; ++p) {
#pragma GCC unroll 2
          for (int q = 0; q < 2; ++q) {
            __m512i even_lo, odd_lo, even_hi, odd_hi;
            split_pairs_q4_zmm(wb + 2 * q * kBlockBytes, wb + (2 * q + 1) * kBlockBytes, p, &even_lo, &odd_lo, &even_hi,
                               &odd_hi);
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) {
              __m512i& d = dot[r * 2 + q];
              d = i16_dot_zmm(d, even_lo, x_pair(r, p * 4));
              d = i16_dot_zmm(d, odd_lo, x_pair(r, p * 4 + 2));
              d = i16_dot_zmm(d, even_hi, x_pair(r, (p + 4) * 4));
              d = i16_dot_zmm(d, odd_hi, x_pair(r, (p + 4) * 4 + 2));
            }
          }
        }
      } else {
#pragma GCC unroll 1
        for (int quad = s * kQuadsPerScale; quad < (s + 1) * kQuadsPerScale; ++quad) {
#pragma GCC unroll 2
          for (int q = 0; q < 2; ++q) {
            __m512i even, odd;
            split_pairs_zmm<BITS>(quad_codes_pair<BITS>(wb + 2 * q * kBlockBytes, wb + (2 * q + 1) * kBlockBytes, quad),
                                  &even, &odd);
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) {
              dot[r * 2 + q] = i16_dot_zmm(dot[r * 2 + q], even, x_pair(r, quad * 4));
              dot[r * 2 + q] = i16_dot_zmm(dot[r * 2 + q], odd, x_pair(r, quad * 4 + 2));
            }
          }
        }
      }
      __m512 d[2], m[2];
#pragma GCC unroll 2
      for (int q = 0; q < 2; ++q) {
        __m256 d_lo, m_lo, d_hi, m_hi;
        const int64_t at = scale0 + b * kScaleStride + s * kQuantTileGroups * kQuantGroupCols + 2 * q * kQuantGroupCols;
        const int64_t sup = super0 + (b / kSuperBlocks) * kQuantTileGroups * kQuantGroupCols + 2 * q * kQuantGroupCols;
        scale_min_at<BITS>(w, at, sup, sub_mins, &d_lo, &m_lo);
        scale_min_at<BITS>(w, at + kQuantGroupCols, sup + kQuantGroupCols, sub_mins, &d_hi, &m_hi);
        d[q] = join_halves(d_lo, d_hi);
        m[q] = join_halves(m_lo, m_hi);
      }
      add_scale_block_zmm<MR, 2, kScaleBlocks>(a, r0, b, s, dot, d, m, acc);
    }
  }
  const int64_t n0 = g0 * kQuantGroupCols;
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* dst = out + (r0 + r) * out_stride;
    store_pair(acc[r * 2], bias, dst, n0, w.out_features);
    store_pair(acc[r * 2 + 1], bias, dst, n0 + 2 * kQuantGroupCols, w.out_features);
  }
}

// Rows [row_begin, row_end) of one whole tile, direct, in tiles of up to kI16ZmmRows rows.
template <int BITS>
void i16_direct_zmm(const QuantActs16& a, const QuantWeightView& w, int64_t row_begin, int64_t row_end, int64_t g0,
                    const float* bias, float* out, int64_t out_stride) {
  static_assert(kI16ZmmRows <= 6, "the switch below covers up to 6 rows a tile");
  for (int64_t r = row_begin; r < row_end; r += kI16ZmmRows) {
    switch (std::min<int64_t>(kI16ZmmRows, row_end - r)) {
      case 6: i16_tile_zmm<6, BITS>(a, w, r, g0, bias, out, out_stride); break;
      case 5: i16_tile_zmm<5, BITS>(a, w, r, g0, bias, out, out_stride); break;
      case 4: i16_tile_zmm<4, BITS>(a, w, r, g0, bias, out, out_stride); break;
      case 3: i16_tile_zmm<3, BITS>(a, w, r, g0, bias, out, out_stride); break;
      case 2: i16_tile_zmm<2, BITS>(a, w, r, g0, bias, out, out_stride); break;
      default: i16_tile_zmm<1, BITS>(a, w, r, g0, bias, out, out_stride); break;
    }
  }
}

// Rows [row_begin, row_end) in tiles of kI16PanelRows rows, the rest in one shorter tile.
template <int NP, int BITS>
void i16_panel_rows_zmm(const QuantActs16& a, const I16Panel& panel, int64_t j0, int64_t row_begin, int64_t row_end,
                        int64_t n0, int64_t N, const float* bias, float* out, int64_t out_stride) {
  int64_t r = row_begin;
  for (; r + kI16PanelRows <= row_end; r += kI16PanelRows) {
    i16_panel_tile_zmm<kI16PanelRows, NP, BITS>(a, panel, j0, r, n0, N, bias, out, out_stride);
  }
  static_assert(kI16PanelRows <= 6, "the remainder switch below covers up to 5 rows");
  switch (row_end - r) {
    case 5: i16_panel_tile_zmm<5, NP, BITS>(a, panel, j0, r, n0, N, bias, out, out_stride); break;
    case 4: i16_panel_tile_zmm<4, NP, BITS>(a, panel, j0, r, n0, N, bias, out, out_stride); break;
    case 3: i16_panel_tile_zmm<3, NP, BITS>(a, panel, j0, r, n0, N, bias, out, out_stride); break;
    case 2: i16_panel_tile_zmm<2, NP, BITS>(a, panel, j0, r, n0, N, bias, out, out_stride); break;
    case 1: i16_panel_tile_zmm<1, NP, BITS>(a, panel, j0, r, n0, N, bias, out, out_stride); break;
    default: break;
  }
}
#endif  // TRILLIUM_QL_I16_ZMM

template <int BITS>
void gemm_i16_bits(const QuantActs16& a, const QuantWeightView& w, int64_t row_begin, int64_t row_end,
                   int64_t group_begin, int64_t group_end, const float* bias, float* out, int64_t out_stride) {
  if (row_end - row_begin > kI16DirectRows) {
    thread_local I16Panel panel;  // per OpenMP thread, reused across calls
    for (int64_t g = group_begin; g < group_end; g += kQuantTileGroups) {
      const int64_t ng = std::min<int64_t>(kQuantTileGroups, group_end - g);
      i16_build_panel<BITS>(w, g, ng, panel);
      int64_t j = 0;
#if defined(TRILLIUM_QL_I16_ZMM)
      const int64_t n_tile = g * kQuantGroupCols;
      if (ng == kQuantTileGroups) {
        i16_panel_rows_zmm<2, BITS>(a, panel, 0, row_begin, row_end, n_tile, w.out_features, bias, out, out_stride);
        j = ng;
      }
      for (; j + 2 <= ng; j += 2) {
        const int64_t n0 = (g + j) * kQuantGroupCols;
        i16_panel_rows_zmm<1, BITS>(a, panel, j, row_begin, row_end, n0, w.out_features, bias, out, out_stride);
      }
#endif
      for (; j < ng; j += 2) {
        const int64_t n0 = (g + j) * kQuantGroupCols;
        if (j + 1 < ng) {
          i16_panel_rows<2, BITS>(a, panel, j, row_begin, row_end, n0, w.out_features, bias, out, out_stride);
        } else {
          i16_panel_rows<1, BITS>(a, panel, j, row_begin, row_end, n0, w.out_features, bias, out, out_stride);
        }
      }
    }
    return;
  }
#if defined(TRILLIUM_QL_I16_ZMM)
  if (group_end - group_begin == kQuantTileGroups && group_begin % kQuantTileGroups == 0) {
    i16_direct_zmm<BITS>(a, w, row_begin, row_end, group_begin, bias, out, out_stride);
    return;
  }
#endif
  int64_t r = row_begin;
  for (; r + kI16Rows <= row_end; r += kI16Rows) {
    i16_rows<kI16Rows, BITS>(a, w, r, group_begin, group_end, bias, out, out_stride);
  }
  i16_remainder<kI16Rows - 1, BITS>(row_end - r, a, w, r, group_begin, group_end, bias, out, out_stride);
}

void gemm_i16(const QuantActs16& a, const QuantWeightView& w, int64_t row_begin, int64_t row_end, int64_t group_begin,
              int64_t group_end, const float* bias, float* out, int64_t out_stride) {
  with_bits(w.bits, [&](auto bits) {
    gemm_i16_bits<decltype(bits)::value>(a, w, row_begin, row_end, group_begin, group_end, bias, out, out_stride);
  });
}
