// Internal: the attention inner loops, written once against the 16-float pack API (F16, vload,
// vfma, ..., kRowBlock, kChunkPacks) and compiled once per ISA: attention_isa_<isa>.cc includes
// the ISA's simd_<isa>.h and then this file inside its own namespace and target region.
// See attention_work.h for the contract (pre-scaled fp32 queries, base-2 online softmax state).
//
// Lazy rescaling: a row's running max m only moves when a chunk's scores exceed it by more than
// kRescaleSlack (log2 units), so most chunks skip the max reduction and the rescale of acc;
// probabilities are then at most 2^kRescaleSlack, far from fp32 overflow, and acc / l is unchanged.

constexpr float kRescaleSlack = 8.0f;

// Row state update for one chunk of scores s (already masked; lanes past the chunk are -inf).
// The running sum is kept as a pack of per-lane partial sums (lsum, reduced once at the end), and
// the max is only reduced when some score exceeds m + kRescaleSlack: most chunks cost one compare
// and one exp2. Returns the chunk's probabilities.
inline F16 online_update(const F16& s, float* m, float* lsum, float* acc_row, int32_t head_dim) {
  if (vany_gt(s, vset1(*m + kRescaleSlack))) {  // always true for the first chunk (m = -inf)
    const float m_new = vmaxv(s);
    const F16 alpha = vset1(std::exp2(*m - m_new));  // 0 when m was -inf
    vstore(lsum, vmul(vload(lsum), alpha));
    for (int32_t j = 0; j < head_dim; j += 16) vstore(acc_row + j, vmul(vload(acc_row + j), alpha));
    *m = m_new;
  }
  const F16 p = vexp2(vsub(s, vset1(*m)));
  vstore(lsum, vadd(vload(lsum), p));
  return p;
}

// Token `pos` of the request: pointer to its row (one KV head) in the pool.
template <class T>
inline const T* token_row(const KVView& kv, const void* base, int32_t pos) {
  const int32_t block = kv.block_table[pos / kv.block_size];
  return static_cast<const T*>(base) + block * kv.block_stride + (pos % kv.block_size) * kv.token_stride;
}

// Keys in the chunk starting at pos: up to 16, not crossing a block or end.
inline int32_t chunk_len(const KVView& kv, int32_t pos, int32_t end) {
  int32_t n = kv.block_size - pos % kv.block_size;
  n = n < 16 ? n : 16;
  return n < end - pos ? n : end - pos;
}

// acc[g] += sum_t p[g][t] * v[t] for kG heads sharing one V chunk: kG x kP accumulators live in
// registers (independent FMA chains), each V row is loaded once. acc rows are D = 16 * kP apart,
// p rows 16 apart.
template <class T, int kP, int kG>
__attribute__((always_inline)) inline void pv_group(float* acc, const float* p, const T* v, int64_t v_stride,
                                                    int32_t n) {
  F16 a[kG][kP];
  for (int g = 0; g < kG; ++g)
    for (int j = 0; j < kP; ++j) a[g][j] = vload(acc + g * kP * 16 + 16 * j);
  for (int32_t t = 0; t < n; ++t) {
    F16 vr[kP];
    for (int j = 0; j < kP; ++j) vr[j] = vload(v + t * v_stride + 16 * j);
    for (int g = 0; g < kG; ++g) {
      const F16 pg = vset1(p[16 * g + t]);
      for (int j = 0; j < kP; ++j) a[g][j] = vfma(pg, vr[j], a[g][j]);
    }
  }
  for (int g = 0; g < kG; ++g)
    for (int j = 0; j < kP; ++j) vstore(acc + g * kP * 16 + 16 * j, a[g][j]);
}

// Logit soft-capping (Gemma 2) in the kernels' log2 domain: c * tanh(s / c), c = cap * log2(e),
// tanh(u) = (e^2u - 1) / (e^2u + 1) from vexp2 (saturating to +-1 where e^2u over- or underflows).
inline F16 vsoftcap(const F16& s, float c) {
  const F16 e = vexp2(vmul(s, vset1(2.0f * 1.4426950408889634f / c)));
  const F16 one = vset1(1.0f);
  return vmul(vset1(c), vdiv(vsub(e, one), vadd(e, one)));
}

// ---------------------------------------------------------------------------------------------
// Decode: chunks of up to 16 keys inside one block; for each KV head, its G query rows. Scores come
// from per-token dot-product packs summed by one transposing reduction (vsum16); K and V rows are
// read from memory once (bf16 widened in registers) and shared by the G heads of their group.
template <class T, int kP>
void decode_impl(const DecodeWork& w) {
  const KVView& kv = w.kv;
  const int32_t D = kP > 0 ? kP * 16 : kv.head_dim;
  const int32_t P = D / 16;
  const int32_t G = w.group, H = w.num_kv_heads, rows = G * H;
  float* pbuf = w.scratch;      // [G, 16] probabilities of one head's chunk
  float* lsum = pbuf + 16 * G;  // [rows, 16] per-lane partial sums of l
  for (int32_t r = 0; r < rows; ++r) {
    w.m[r] = -INFINITY;
    for (int32_t j = 0; j < 16; ++j) lsum[r * 16 + j] = 0.0f;
    for (int32_t j = 0; j < D; ++j) w.acc[r * D + j] = 0.0f;
  }
  for (int32_t pos = w.key_begin; pos < w.key_end;) {
    const int32_t n = chunk_len(kv, pos, w.key_end);
    const T* k_chunk = token_row<T>(kv, kv.k, pos);
    const T* v_chunk = token_row<T>(kv, kv.v, pos);
    // The next chunk is usually another block at a random place in the pool, where hardware
    // prefetchers cannot go ahead of us: prefetch it row by row while this one is computed (one
    // row per (token, head) step; a burst of a whole block stalls on the fill buffers).
    const int32_t next_n = pos + n < w.key_end ? chunk_len(kv, pos + n, w.key_end) : 0;
    const char* next_k = next_n > 0 ? reinterpret_cast<const char*>(token_row<T>(kv, kv.k, pos + n)) : nullptr;
    const char* next_v = next_n > 0 ? reinterpret_cast<const char*>(token_row<T>(kv, kv.v, pos + n)) : nullptr;
    const int64_t row_bytes = static_cast<int64_t>(D) * sizeof(T);
    const int64_t token_bytes = kv.token_stride * static_cast<int64_t>(sizeof(T));

    for (int32_t h = 0; h < H; ++h) {
      const T* kc = k_chunk + h * D;
      const T* vc = v_chunk + h * D;
      // Scores: part[g][t] = q_g * k_t lane-wise (summed over the P packs), then one transposing
      // reduction per head gives the 16 scores of the chunk in one pack. Heads in groups of up
      // to 8 (the stack buffer), each K row loaded once per group.
      for (int32_t g0 = 0; g0 < G; g0 += 8) {
        const int32_t ng = G - g0 < 8 ? G - g0 : 8;
        F16 part[8 * 16];
        for (int32_t t = 0; t < n; ++t) {
          const T* kr = kc + t * kv.token_stride;
          if (t < next_n && g0 == 0) {
            const int64_t off = t * token_bytes + h * row_bytes;
            for (int64_t b = 0; b < row_bytes; b += 64) {
              __builtin_prefetch(next_k + off + b, 0, 3);
              __builtin_prefetch(next_v + off + b, 0, 3);
            }
          }
          if constexpr (kP > 0) {
            F16 k[kP];
            for (int32_t j = 0; j < kP; ++j) k[j] = vload(kr + 16 * j);
            for (int32_t g = 0; g < ng; ++g) {
              const float* qg = w.q + (h * G + g0 + g) * D;
              F16 a = vmul(vload(qg), k[0]);
              for (int32_t j = 1; j < kP; ++j) a = vfma(vload(qg + 16 * j), k[j], a);
              part[g * 16 + t] = a;
            }
          } else {
            for (int32_t g = 0; g < ng; ++g) {
              const float* qg = w.q + (h * G + g0 + g) * D;
              F16 a = vmul(vload(qg), vload(kr));
              for (int32_t j = 1; j < P; ++j) a = vfma(vload(qg + 16 * j), vload(kr + 16 * j), a);
              part[g * 16 + t] = a;
            }
          }
        }
        for (int32_t g = 0; g < ng; ++g) {
          const int32_t row = h * G + g0 + g;
          for (int32_t t = n; t < 16; ++t) part[g * 16 + t] = vzero();
          // A token of a several-token item sees the chunk up to its own end (maybe none of it).
          const int32_t seen = w.token_key_end ? w.token_key_end[(g0 + g) / w.heads_per_token] - pos : n;
          const F16 raw = vsum16(part + g * 16);
          const F16 s = vmask_tail(w.softcap > 0.0f ? vsoftcap(raw, w.softcap) : raw, seen < n ? seen : n);
          vstore(pbuf + 16 * (g0 + g), online_update(s, &w.m[row], lsum + row * 16, w.acc + row * D, D));
        }
      }

      // acc[g] += sum_t p[g][t] * v[t].
      float* acc = w.acc + h * G * D;
      if constexpr (kP > 0) {
        for (int32_t g0 = 0; g0 < G;) {
          const int32_t left = G - g0;
          if (kNG >= 4 && left >= 4) {
            pv_group<T, kP, (kNG >= 4 ? 4 : 1)>(acc + g0 * D, pbuf + 16 * g0, vc, kv.token_stride, n);
            g0 += kNG >= 4 ? 4 : 1;
          } else if (kNG >= 2 && left >= 2) {
            pv_group<T, kP, (kNG >= 2 ? 2 : 1)>(acc + g0 * D, pbuf + 16 * g0, vc, kv.token_stride, n);
            g0 += kNG >= 2 ? 2 : 1;
          } else {
            pv_group<T, kP, 1>(acc + g0 * D, pbuf + 16 * g0, vc, kv.token_stride, n);
            g0 += 1;
          }
        }
      } else {
        for (int32_t g = 0; g < G; ++g) {
          for (int32_t j = 0; j < P; ++j) {
            F16 a = vload(acc + g * D + 16 * j);
            for (int32_t t = 0; t < n; ++t) a = vfma(vset1(pbuf[16 * g + t]), vload(vc + t * kv.token_stride + 16 * j), a);
            vstore(acc + g * D + 16 * j, a);
          }
        }
      }
    }
    pos += n;
  }
  for (int32_t r = 0; r < rows; ++r) w.l[r] = vsum(vload(lsum + r * 16));
}

// ---------------------------------------------------------------------------------------------
// Extend: a tile of query rows against key chunks of kChunk = 16 * kChunkPacks keys. Each chunk's
// K is transposed to [D, kChunk] fp32 once, so a block of kRowBlock rows computes its scores with
// broadcast-FMAs (no horizontal sums) and V rows are shared by kRowBlock rows in the PV product.
constexpr int kChunk = 16 * kChunkPacks;
static_assert(kChunk <= kMaxChunk && kRowBlock <= kMaxRowBlock, "scratch sizes in attention_work.h");

template <class T, int kP>
void extend_impl(const ExtendWork& w) {
  const KVView& kv = w.kv;
  const int32_t D = kP > 0 ? kP * 16 : kv.head_dim;
  const int32_t P = D / 16;
  const int32_t G = w.group;
  const int32_t rows = w.num_queries * G;
  float* kt = w.scratch;          // [D, kChunk] transposed K chunk
  float* vb = kt + kChunk * D;    // [kChunk, D] V chunk in fp32
  float* pb = vb + kChunk * D;    // [kRowBlock, kChunk] probabilities of one row block
  float* lsum = pb + kRowBlock * kChunk;  // [rows, 16] per-lane partial sums of l
  for (int32_t r = 0; r < rows; ++r) {
    w.m[r] = -INFINITY;
    for (int32_t j = 0; j < 16; ++j) lsum[r * 16 + j] = 0.0f;
    for (int32_t j = 0; j < D; ++j) w.acc[r * D + j] = 0.0f;
  }
  const int32_t key_end = w.first_pos + w.num_queries;
  // With a window, keys below the first query's window are seen by no row.
  const int32_t key_begin = w.window > 0 && w.first_pos - w.window + 1 > 0 ? w.first_pos - w.window + 1 : 0;
  for (int32_t pos = key_begin; pos < key_end; pos += kChunk) {
    const int32_t n = key_end - pos < kChunk ? key_end - pos : kChunk;
    // Gather the chunk (it may span blocks): K transposed 16 keys x 16 dims at a time (keys past
    // the chunk as zeros), V as rows.
    for (int32_t c = 0; c < kChunkPacks; ++c) {
      const T* krow[16];
      for (int32_t t = 0; t < 16; ++t) krow[t] = 16 * c + t < n ? token_row<T>(kv, kv.k, pos + 16 * c + t) : nullptr;
      for (int32_t j = 0; j < P; ++j) {
        F16 r[16];
        for (int32_t t = 0; t < 16; ++t) r[t] = krow[t] != nullptr ? vload(krow[t] + 16 * j) : vzero();
        vtranspose16(r);
        for (int32_t d = 0; d < 16; ++d) vstore(kt + (16 * j + d) * kChunk + 16 * c, r[d]);
      }
    }
    for (int32_t t = 0; t < n; ++t) {
      const T* vr = token_row<T>(kv, kv.v, pos + t);
      for (int32_t j = 0; j < P; ++j) vstore(vb + t * D + 16 * j, vload(vr + 16 * j));
    }
    // Rows whose query sees at least one key of this chunk: position first_pos + i >= pos, and with
    // a window, its lowest key first_pos + i - window + 1 < pos + n.
    const int32_t first_query = pos > w.first_pos ? pos - w.first_pos : 0;
    int32_t row_end = rows;
    if (w.window > 0) {
      const int32_t q_end = pos + n + w.window - 1 - w.first_pos;
      row_end = q_end < w.num_queries ? q_end * G : rows;
    }
    for (int32_t r0 = first_query * G; r0 < row_end; r0 += kRowBlock) {
      const int32_t nr = row_end - r0 < kRowBlock ? row_end - r0 : kRowBlock;
      const float* qr[kRowBlock];
      for (int32_t r = 0; r < kRowBlock; ++r) qr[r] = w.q + (r0 + (r < nr ? r : nr - 1)) * D;

      F16 s[kRowBlock][kChunkPacks];
      for (int32_t r = 0; r < kRowBlock; ++r)
        for (int32_t c = 0; c < kChunkPacks; ++c) s[r][c] = vzero();
      for (int32_t d = 0; d < D; ++d) {
        F16 k[kChunkPacks];
        for (int32_t c = 0; c < kChunkPacks; ++c) k[c] = vload(kt + d * kChunk + 16 * c);
        for (int32_t r = 0; r < kRowBlock; ++r) {
          const F16 q = vset1(qr[r][d]);
          for (int32_t c = 0; c < kChunkPacks; ++c) s[r][c] = vfma(q, k[c], s[r][c]);
        }
      }

      for (int32_t r = 0; r < nr; ++r) {
        const int32_t row = r0 + r;
        const int32_t visible = w.first_pos + row / G - pos + 1;  // keys of the chunk this row sees
        const int32_t valid = visible < n ? visible : n;
        F16 sm[kChunkPacks];
        for (int32_t c = 0; c < kChunkPacks; ++c) {
          sm[c] = vmask_tail(w.softcap > 0.0f ? vsoftcap(s[r][c], w.softcap) : s[r][c], valid - 16 * c);
        }
        const int32_t below = w.window > 0 ? w.first_pos + row / G - w.window + 1 - pos : 0;
        if (below > 0) {  // keys of the chunk under this row's window: probability 0
          alignas(64) float tmp[kChunk];
          for (int32_t c = 0; c < kChunkPacks; ++c) vstore(tmp + 16 * c, sm[c]);
          for (int32_t t = 0; t < below; ++t) tmp[t] = -INFINITY;
          for (int32_t c = 0; c < kChunkPacks; ++c) sm[c] = vload(tmp + 16 * c);
        }
        // Same lazy update as online_update, over the chunk's packs.
        float* acc_row = w.acc + row * D;
        float* lsum_row = lsum + row * 16;
        const F16 limit = vset1(w.m[row] + kRescaleSlack);
        bool rescale = false;
        for (int32_t c = 0; c < kChunkPacks; ++c) rescale |= vany_gt(sm[c], limit);
        if (rescale) {
          F16 mx = sm[0];
          for (int32_t c = 1; c < kChunkPacks; ++c) mx = vmax(mx, sm[c]);
          const float m_new = vmaxv(mx);
          const F16 alpha = vset1(std::exp2(w.m[row] - m_new));
          vstore(lsum_row, vmul(vload(lsum_row), alpha));
          for (int32_t j = 0; j < P; ++j) vstore(acc_row + 16 * j, vmul(vload(acc_row + 16 * j), alpha));
          w.m[row] = m_new;
        }
        const F16 m = vset1(w.m[row]);
        F16 l = vload(lsum_row);
        for (int32_t c = 0; c < kChunkPacks; ++c) {
          const F16 p = vexp2(vsub(sm[c], m));
          l = vadd(l, p);
          vstore(pb + r * kChunk + 16 * c, p);
        }
        vstore(lsum_row, l);
      }
      for (int32_t r = nr; r < kRowBlock; ++r)
        for (int32_t t = 0; t < kChunk; ++t) pb[r * kChunk + t] = 0.0f;

      for (int32_t j = 0; j < P; ++j) {
        F16 a[kRowBlock];
        for (int32_t r = 0; r < kRowBlock; ++r) a[r] = vload(w.acc + (r0 + (r < nr ? r : nr - 1)) * D + 16 * j);
        for (int32_t t = 0; t < n; ++t) {
          const F16 v = vload(vb + t * D + 16 * j);
          for (int32_t r = 0; r < kRowBlock; ++r) a[r] = vfma(vset1(pb[r * kChunk + t]), v, a[r]);
        }
        for (int32_t r = 0; r < nr; ++r) vstore(w.acc + (r0 + r) * D + 16 * j, a[r]);
      }
    }
  }
  for (int32_t r = 0; r < rows; ++r) w.l[r] = vsum(vload(lsum + r * 16));
}

// ---------------------------------------------------------------------------------------------
// Entry points for the driver: dispatch on head_dim once per work item.
template <class T>
void decode_entry(const DecodeWork& w) {
  switch (w.kv.head_dim) {
    case 64: return decode_impl<T, 4>(w);
    case 128: return decode_impl<T, 8>(w);
    default: return decode_impl<T, 0>(w);
  }
}
template <class T>
void extend_entry(const ExtendWork& w) {
  switch (w.kv.head_dim) {
    case 64: return extend_impl<T, 4>(w);
    case 128: return extend_impl<T, 8>(w);
    default: return extend_impl<T, 0>(w);
  }
}
inline IsaKernels make_kernels() {
  IsaKernels k;
  k.decode[0] = &decode_entry<float>;
  k.decode[1] = &decode_entry<bf16_t>;
  k.extend[0] = &extend_entry<float>;
  k.extend[1] = &extend_entry<bf16_t>;
  return k;
}
