// Internal: the attention inner loops, written once against the 16-float pack API (F16, vload,
// vfma, ..., kRowBlock, kChunkPacks) and compiled once per ISA: attention_isa_<isa>.cc includes
// the ISA's simd_<isa>.h and then this file inside its own namespace and target region.
// See attention_work.h for the contract (pre-scaled fp32 queries, base-2 online softmax state).
//
// Lazy rescaling: a row's running max m only moves when a chunk's max exceeds it by more than
// kRescaleSlack (log2 units), so most chunks skip the rescale of acc; probabilities are then at
// most 2^kRescaleSlack, far from fp32 overflow, and the final acc / l is unchanged.

constexpr float kRescaleSlack = 8.0f;

// Row state update for one chunk of scores s (already masked): returns the probabilities.
inline F16 online_update(F16 s, float* m, float* l, float* acc_row, int32_t head_dim) {
  const float mx = vmaxv(s);
  if (mx > *m + kRescaleSlack || *m == -INFINITY) {
    const float m_new = mx;
    const float alpha = std::exp2(*m - m_new);  // 0 when m was -inf
    *l *= alpha;
    const F16 a = vset1(alpha);
    for (int32_t j = 0; j < head_dim; j += 16) vstore(acc_row + j, vmul(vload(acc_row + j), a));
    *m = m_new;
  }
  const F16 p = vexp2(vsub(s, vset1(*m)));
  *l += vsum(p);
  return p;
}

// Token `pos` of the request: pointer to its row (one KV head) in the pool.
template <class T>
inline const T* token_row(const KVView& kv, const void* base, int32_t pos) {
  const int32_t block = kv.block_table[pos / kv.block_size];
  return static_cast<const T*>(base) + block * kv.block_stride + (pos % kv.block_size) * kv.token_stride;
}

// ---------------------------------------------------------------------------------------------
// Decode: G query rows; chunks of up to 16 keys inside one block. Scores come from per-token
// dot-product packs summed by one transposing reduction (vsum16), so each K row is read from
// memory once and each V row once, shared by the G heads.
template <class T, int kP>
void decode_impl(const DecodeWork& w) {
  const KVView& kv = w.kv;
  const int32_t D = kP > 0 ? kP * 16 : kv.head_dim;
  const int32_t P = D / 16;
  const int32_t G = w.num_rows;
  float* kbuf = w.scratch;     // [16, D] fp32 copy of a bf16 K chunk
  float* pbuf = kbuf + 16 * D; // [G, 16] probabilities of the chunk
  for (int32_t g = 0; g < G; ++g) {
    w.m[g] = -INFINITY;
    w.l[g] = 0.0f;
    for (int32_t j = 0; j < D; ++j) w.acc[g * D + j] = 0.0f;
  }
  for (int32_t pos = w.key_begin; pos < w.key_end;) {
    const int32_t off = pos % kv.block_size;
    int32_t n = kv.block_size - off;
    n = n < 16 ? n : 16;
    n = n < w.key_end - pos ? n : w.key_end - pos;
    const T* kc = token_row<T>(kv, kv.k, pos);
    const T* vc = token_row<T>(kv, kv.v, pos);

    const float* krows;
    int64_t kstride;
    if constexpr (std::is_same_v<T, float>) {
      krows = kc;
      kstride = kv.token_stride;
    } else {
      for (int32_t t = 0; t < n; ++t)
        for (int32_t j = 0; j < P; ++j) vstore(kbuf + t * D + 16 * j, vload(kc + t * kv.token_stride + 16 * j));
      krows = kbuf;
      kstride = D;
    }

    for (int32_t g = 0; g < G; ++g) {
      const float* qg = w.q + g * D;
      F16 part[16];
      for (int32_t t = 0; t < n; ++t) {
        const float* kr = krows + t * kstride;
        F16 a = vmul(vload(qg), vload(kr));
        for (int32_t j = 1; j < P; ++j) a = vfma(vload(qg + 16 * j), vload(kr + 16 * j), a);
        part[t] = a;
      }
      for (int32_t t = n; t < 16; ++t) part[t] = vzero();
      const F16 s = vmask_tail(vsum16(part), n);
      vstore(pbuf + 16 * g, online_update(s, &w.m[g], &w.l[g], w.acc + g * D, D));
    }

    // acc[g] += sum_t p[g][t] * v[t]; heads in groups of 4 so their accumulators stay in registers.
    for (int32_t g0 = 0; g0 < G; g0 += 4) {
      const int32_t ng = G - g0 < 4 ? G - g0 : 4;
      for (int32_t j = 0; j < P; ++j) {
        F16 a[4];
        for (int32_t g = 0; g < 4; ++g) a[g] = g < ng ? vload(w.acc + (g0 + g) * D + 16 * j) : vzero();
        for (int32_t t = 0; t < n; ++t) {
          const F16 v = vload(vc + t * kv.token_stride + 16 * j);
          for (int32_t g = 0; g < 4; ++g) {
            if (g < ng) a[g] = vfma(vset1(pbuf[16 * (g0 + g) + t]), v, a[g]);
          }
        }
        for (int32_t g = 0; g < ng; ++g) vstore(w.acc + (g0 + g) * D + 16 * j, a[g]);
      }
    }
    pos += n;
  }
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
  for (int32_t r = 0; r < rows; ++r) {
    w.m[r] = -INFINITY;
    w.l[r] = 0.0f;
    for (int32_t j = 0; j < D; ++j) w.acc[r * D + j] = 0.0f;
  }
  const int32_t key_end = w.first_pos + w.num_queries;
  for (int32_t pos = 0; pos < key_end; pos += kChunk) {
    const int32_t n = key_end - pos < kChunk ? key_end - pos : kChunk;
    // Gather the chunk (it may span blocks): K transposed, V as rows.
    for (int32_t t = 0; t < n; ++t) {
      const T* kr = token_row<T>(kv, kv.k, pos + t);
      const T* vr = token_row<T>(kv, kv.v, pos + t);
      for (int32_t j = 0; j < P; ++j) {
        float tmp[16];
        vstore(tmp, vload(kr + 16 * j));
        for (int32_t d = 0; d < 16; ++d) kt[(16 * j + d) * kChunk + t] = tmp[d];
        vstore(vb + t * D + 16 * j, vload(vr + 16 * j));
      }
    }
    if (n < kChunk) {
      for (int32_t d = 0; d < D; ++d)
        for (int32_t t = n; t < kChunk; ++t) kt[d * kChunk + t] = 0.0f;
    }
    // Rows whose query sees at least one key of this chunk: position first_pos + i >= pos.
    const int32_t first_query = pos > w.first_pos ? pos - w.first_pos : 0;
    for (int32_t r0 = first_query * G; r0 < rows; r0 += kRowBlock) {
      const int32_t nr = rows - r0 < kRowBlock ? rows - r0 : kRowBlock;
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
        F16 mx = vmask_tail(s[r][0], valid);
        for (int32_t c = 1; c < kChunkPacks; ++c) mx = vmax(mx, vmask_tail(s[r][c], valid - 16 * c));
        const float cmax = vmaxv(mx);
        float* acc_row = w.acc + row * D;
        if (cmax > w.m[row] + kRescaleSlack || w.m[row] == -INFINITY) {
          const float alpha = std::exp2(w.m[row] - cmax);
          w.l[row] *= alpha;
          const F16 a = vset1(alpha);
          for (int32_t j = 0; j < P; ++j) vstore(acc_row + 16 * j, vmul(vload(acc_row + 16 * j), a));
          w.m[row] = cmax;
        }
        const F16 m = vset1(w.m[row]);
        F16 lsum = vzero();
        for (int32_t c = 0; c < kChunkPacks; ++c) {
          const F16 p = vexp2(vsub(vmask_tail(s[r][c], valid - 16 * c), m));
          lsum = vadd(lsum, p);
          vstore(pb + r * kChunk + 16 * c, p);
        }
        w.l[row] += vsum(lsum);
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
