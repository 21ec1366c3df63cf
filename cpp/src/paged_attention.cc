// Paged attention driver: validates once, splits the batch into work items, runs them over OpenMP
// threads through the active ISA's inner loops (kernels/attention_impl.h), merges split-key partial
// states and writes the output in its dtype.
//
// Work items:
//   decode  (request, KV head, key range)   ranges of >= kMinSplitKeys keys, block-aligned; the last
//                                           range of a (request, KV head) to finish merges them all
//   extend  (request, KV head, query tile)  tiles of ~kTileRows query rows (tokens x G heads);
//                                           requests of <= kMaxDecodeRowsQuery new tokens run
//                                           each token as a decode row instead
// A decode row's split depends on its context length alone, so a token's attention is the same
// bits in every kind of step (see split_len_for).
#include "trillium/kernels/paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/attention_work.h"
#include "trillium/cpu_isa.h"

namespace trillium {
namespace {

using kernels::DecodeWork;
using kernels::ExtendWork;
using kernels::IsaKernels;
using kernels::KVView;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int32_t kMinSplitKeys = 256;  // shorter key ranges cost more in merging than they balance
constexpr int32_t kSplitsMax = 16;      // a decode row's key ranges, at most (enough for 16 threads)
constexpr int32_t kMaxDecodeRowsQuery = 32;  // extend: a request with this few new tokens runs them as
                                             // decode rows (a verify step's rows equal decode's)
constexpr int32_t kTileRows = 192;      // extend: query rows (tokens x G) per work item, at most
constexpr int32_t kMinTileRows = 24;    // ... and at least, when shrinking tiles to feed the threads
constexpr int32_t kMaxHeadDim = 1024;

// ------------------------------------------------------------------------------------ ISA choice
// The inner loops of the level kernel_isa() names (trillium/cpu_isa.h detects and owns it).
const IsaKernels& isa_kernels(KernelIsa isa) {
  static const IsaKernels portable = kernels::portable_kernels();
#if defined(__x86_64__)
  static const IsaKernels avx2 = kernels::avx2_kernels();
  static const IsaKernels avx512 = kernels::avx512_kernels();
  if (isa == KernelIsa::kAvx512) return avx512;
  if (isa == KernelIsa::kAvx2) return avx2;
#endif
  (void)isa;
  return portable;
}

// ------------------------------------------------------------------------------------ validation
Status bad(const std::string& what) { return Status::InvalidArgument("paged_attention: " + what); }

Status validate(const PagedAttentionArgs& a, bool decode) {
  if (!valid_dtype(a.query_dtype) || !valid_dtype(a.out_dtype) || !valid_dtype(a.kv_dtype)) {
    return bad("dtypes must be float32 or bfloat16");
  }
  if (a.head_dim <= 0 || a.head_dim % 16 != 0 || a.head_dim > kMaxHeadDim) {
    return bad("head_dim must be a positive multiple of 16 up to " + std::to_string(kMaxHeadDim) + ", got " +
               std::to_string(a.head_dim));
  }
  if (a.num_kv_heads <= 0 || a.num_q_heads <= 0 || a.num_q_heads % a.num_kv_heads != 0) {
    return bad("num_q_heads (" + std::to_string(a.num_q_heads) + ") must be a positive multiple of num_kv_heads (" +
               std::to_string(a.num_kv_heads) + ")");
  }
  if (a.block_size <= 0 || a.num_blocks < 0 || a.num_requests < 0 || a.num_tokens < 0) {
    return bad("block_size must be > 0 and num_blocks, num_requests, num_tokens >= 0");
  }
  if (decode && a.num_tokens != a.num_requests) {
    return bad("decode needs one token per request, got " + std::to_string(a.num_tokens) + " tokens for " +
               std::to_string(a.num_requests) + " requests");
  }
  if (a.num_requests == 0) return a.num_tokens == 0 ? Status::Ok() : bad("tokens without requests");
  if (a.context_lens == nullptr || a.block_tables == nullptr || a.k_cache == nullptr || a.v_cache == nullptr) {
    return bad("null context_lens, block_tables or cache pointer");
  }
  if (a.num_tokens > 0 && (a.query == nullptr || a.out == nullptr)) return bad("null query or out pointer");
  if (!decode) {
    if (a.query_start_loc == nullptr) return bad("extend needs query_start_loc");
    if (a.query_start_loc[0] != 0 || a.query_start_loc[a.num_requests] != a.num_tokens) {
      return bad("query_start_loc must run from 0 to num_tokens (" + std::to_string(a.num_tokens) + ")");
    }
  }
  for (int32_t r = 0; r < a.num_requests; ++r) {
    const int32_t ctx = a.context_lens[r];
    const int32_t qlen = decode ? 1 : a.query_start_loc[r + 1] - a.query_start_loc[r];
    if (qlen < 0 || ctx < qlen || (decode && ctx < 1)) {
      return bad("request " + std::to_string(r) + ": need 0 <= query_len <= context_len (and context_len >= 1 "
                 "for decode), got query_len " + std::to_string(qlen) + ", context_len " + std::to_string(ctx));
    }
    const int64_t blocks = (static_cast<int64_t>(ctx) + a.block_size - 1) / a.block_size;
    if (blocks > a.block_table_stride) {
      return bad("request " + std::to_string(r) + ": context_len " + std::to_string(ctx) + " needs " +
                 std::to_string(blocks) + " blocks, the block table has " + std::to_string(a.block_table_stride));
    }
    const int32_t* table = a.block_tables + r * a.block_table_stride;
    for (int64_t b = 0; b < blocks; ++b) {
      if (table[b] < 0 || table[b] >= a.num_blocks) {
        return bad("request " + std::to_string(r) + ": block id " + std::to_string(table[b]) + " outside [0, " +
                   std::to_string(a.num_blocks) + ")");
      }
    }
  }
  return Status::Ok();
}

// ------------------------------------------------------------------------------------ helpers
int thread_count(const PagedAttentionArgs& a) {
#ifdef _OPENMP
  return a.num_threads > 0 ? a.num_threads : omp_get_max_threads();
#else
  (void)a;
  return 1;
#endif
}

float load_elem(const void* base, DType t, int64_t i) {
  return t == DType::kF32 ? static_cast<const float*>(base)[i] : bf16_to_f32(static_cast<const bf16_t*>(base)[i]);
}

// Query rows of `num_tokens` tokens from `token`, heads [head, head + G): fp32, times scale * log2(e).
// Row order: token-major, then head ([i * G + g]).
void load_queries(const PagedAttentionArgs& a, int64_t token, int32_t num_tokens, int32_t head, int32_t G, float* dst) {
  const float s = a.scale * kLog2e;
  for (int32_t i = 0; i < num_tokens; ++i) {
    for (int32_t g = 0; g < G; ++g) {
      const int64_t base = (token + i) * a.query_stride_token + (head + g) * a.query_stride_head;
      float* row = dst + (static_cast<int64_t>(i) * G + g) * a.head_dim;
      for (int32_t d = 0; d < a.head_dim; ++d) row[d] = load_elem(a.query, a.query_dtype, base + d) * s;
    }
  }
}

// out[token + i, head + g] = acc[row] / l[row] for the same row order as load_queries.
void write_rows(const PagedAttentionArgs& a, int64_t token, int32_t num_tokens, int32_t head, int32_t G,
                const float* acc, const float* l) {
  for (int32_t i = 0; i < num_tokens; ++i) {
    for (int32_t g = 0; g < G; ++g) {
      const int64_t row = static_cast<int64_t>(i) * G + g;
      const float inv = 1.0f / l[row];
      const float* src = acc + row * a.head_dim;
      const int64_t base = (token + i) * a.out_stride_token + (head + g) * a.out_stride_head;
      if (a.out_dtype == DType::kF32) {
        float* o = static_cast<float*>(a.out) + base;
        for (int32_t d = 0; d < a.head_dim; ++d) o[d] = src[d] * inv;
      } else {
        bf16_t* o = static_cast<bf16_t*>(a.out) + base;
        for (int32_t d = 0; d < a.head_dim; ++d) o[d] = f32_to_bf16(src[d] * inv);
      }
    }
  }
}

KVView kv_view(const PagedAttentionArgs& a, int32_t request, int32_t kv_head) {
  KVView kv;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * a.head_dim;
  const int64_t esize = dtype_size(a.kv_dtype);
  kv.k = static_cast<const char*>(a.k_cache) + head_offset * esize;
  kv.v = static_cast<const char*>(a.v_cache) + head_offset * esize;
  kv.block_table = a.block_tables + request * a.block_table_stride;
  kv.token_stride = static_cast<int64_t>(a.num_kv_heads) * a.head_dim;
  kv.block_stride = kv.token_stride * a.block_size;
  kv.block_size = a.block_size;
  kv.head_dim = a.head_dim;
  return kv;
}

// Per-thread scratch, grown on demand and kept for the next call (OpenMP threads persist).
float* thread_scratch(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}

// One query token attending over the first `ctx` keys of request `request`'s pool, all heads.
struct DecodeRow {
  int64_t token;
  int32_t request, ctx;
};

// Key range length of a decode row's splits: a function of its context length only (never of the
// batch, the step's shape or the thread count), so a row's result is the same bits whichever
// step computes it -- a decode step, a verify step's draft row, a mixed step. Speculative
// decoding's lossless outputs rest on that.
int64_t split_len_for(int32_t ctx, int32_t block_size) {
  const int64_t len = std::max<int64_t>(kMinSplitKeys, (static_cast<int64_t>(ctx) + kSplitsMax - 1) / kSplitsMax);
  return (len + block_size - 1) / block_size * block_size;
}

// The decode loop over `rows` (validated by the caller): long contexts are split into key ranges
// (split_len_for) whose partial states are merged in range order by the last one to finish.
void run_decode_rows(const PagedAttentionArgs& a, const std::vector<DecodeRow>& todo) {
  const int32_t H = a.num_kv_heads, G = a.num_q_heads / a.num_kv_heads, D = a.head_dim;
  const int32_t rows = H * G;
  const int threads = thread_count(a);
  const kernels::DecodeFn decode = isa_kernels(kernel_isa()).decode[a.kv_dtype == DType::kBF16];
  const auto n = static_cast<int32_t>(todo.size());

  struct Item {
    int32_t row, key_begin, key_end, split, num_splits;
  };
  std::vector<Item> items;
  std::vector<int64_t> first_partial(static_cast<size_t>(n), -1);  // partial slot of (row, split 0)
  std::vector<int32_t> num_splits(static_cast<size_t>(n), 1);
  int64_t num_partials = 0;
  for (int32_t r = 0; r < n; ++r) {
    const int32_t ctx = todo[static_cast<size_t>(r)].ctx;
    const int64_t split_len = split_len_for(ctx, a.block_size);
    const auto splits = static_cast<int32_t>((ctx + split_len - 1) / split_len);
    num_splits[static_cast<size_t>(r)] = splits;
    if (splits > 1) {
      first_partial[static_cast<size_t>(r)] = num_partials;
      num_partials += splits;
    }
    for (int32_t s = 0; s < splits; ++s) {
      const auto begin = static_cast<int32_t>(s * split_len);
      const auto end = static_cast<int32_t>(std::min<int64_t>(ctx, begin + split_len));
      items.push_back({r, begin, end, s, splits});
    }
  }
  // Partial states of split items: [slot][rows * (D + 2)] = acc [rows, D], m [rows], l [rows].
  const int64_t slot_floats = static_cast<int64_t>(rows) * (D + 2);
  std::vector<float> partials(static_cast<size_t>(num_partials * slot_floats));
  std::vector<std::atomic<int32_t>> remaining(static_cast<size_t>(num_partials > 0 ? n : 0));
  for (int32_t r = 0; r < n && num_partials > 0; ++r) {
    remaining[static_cast<size_t>(r)].store(num_splits[static_cast<size_t>(r)], std::memory_order_relaxed);
  }

  const int64_t num_items = static_cast<int64_t>(items.size());
  const int64_t own_floats = static_cast<int64_t>(rows) * D * 2 + 2 * rows;
  const int64_t scratch_floats = own_floats + kernels::decode_scratch_floats(D, rows);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && num_items > 1)
  for (int64_t i = 0; i < num_items; ++i) {
    const Item& it = items[static_cast<size_t>(i)];
    const DecodeRow& row = todo[static_cast<size_t>(it.row)];
    float* buf = thread_scratch(scratch_floats);
    float* q = buf;
    float* acc = q + rows * D;
    float* l = acc + rows * D + rows;
    DecodeWork w;
    w.kv = kv_view(a, row.request, /*kv_head=*/0);
    w.num_kv_heads = H;
    w.group = G;
    w.q = q;
    w.key_begin = it.key_begin;
    w.key_end = it.key_end;
    w.scratch = buf + own_floats;
    load_queries(a, row.token, 1, 0, rows, q);
    if (it.num_splits == 1) {
      w.acc = acc;
      w.m = acc + rows * D;
      w.l = l;
      decode(w);
      write_rows(a, row.token, 1, 0, rows, acc, l);
      continue;
    }
    const int64_t first_slot = first_partial[static_cast<size_t>(it.row)];
    float* slot = partials.data() + (first_slot + it.split) * slot_floats;
    w.acc = slot;
    w.m = slot + rows * D;
    w.l = w.m + rows;
    decode(w);
    // The last split of this row to finish merges all of them, in range order (acq_rel: it sees
    // every other split's writes).
    if (remaining[static_cast<size_t>(it.row)].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
    for (int32_t hr = 0; hr < rows; ++hr) {
      float m_max = -INFINITY;
      for (int32_t s = 0; s < it.num_splits; ++s) {
        m_max = std::max(m_max, partials[(first_slot + s) * slot_floats + rows * D + hr]);
      }
      float l_sum = 0.0f;
      float* out_row = acc + hr * D;
      std::fill(out_row, out_row + D, 0.0f);
      for (int32_t s = 0; s < it.num_splits; ++s) {
        const float* p = partials.data() + (first_slot + s) * slot_floats;
        const float weight = std::exp2(p[rows * D + hr] - m_max);
        l_sum += p[rows * D + rows + hr] * weight;
        for (int32_t d = 0; d < D; ++d) out_row[d] += p[hr * D + d] * weight;
      }
      l[hr] = l_sum;
    }
    write_rows(a, row.token, 1, 0, rows, acc, l);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------- API
Status paged_attention_decode(const PagedAttentionArgs& a) {
  if (Status st = validate(a, /*decode=*/true); !st.ok()) return st;
  std::vector<DecodeRow> rows(static_cast<size_t>(a.num_requests));
  for (int32_t r = 0; r < a.num_requests; ++r) rows[static_cast<size_t>(r)] = {r, r, a.context_lens[r]};
  run_decode_rows(a, rows);
  return Status::Ok();
}

Status paged_attention_extend(const PagedAttentionArgs& a) {
  if (Status st = validate(a, /*decode=*/false); !st.ok()) return st;
  if (a.num_tokens == 0) return Status::Ok();
  const int32_t R = a.num_requests, H = a.num_kv_heads, G = a.num_q_heads / a.num_kv_heads, D = a.head_dim;
  const int threads = thread_count(a);
  const IsaKernels& k = isa_kernels(kernel_isa());
  const int dt = a.kv_dtype == DType::kBF16;
  const auto qlen_of = [&](int32_t r) { return a.query_start_loc[r + 1] - a.query_start_loc[r]; };
  // Requests with few new tokens (decodes, speculative verify steps, short chunks) run each token
  // as a decode row over the keys it sees: the same arithmetic as a decode step's.
  std::vector<DecodeRow> decode_rows;
  for (int32_t r = 0; r < R; ++r) {
    const int32_t qlen = qlen_of(r);
    if (qlen > kMaxDecodeRowsQuery) continue;
    const int32_t ctx = a.context_lens[r];
    for (int32_t i = 0; i < qlen; ++i) decode_rows.push_back({a.query_start_loc[r] + i, r, ctx - qlen + i + 1});
  }
  if (!decode_rows.empty()) run_decode_rows(a, decode_rows);

  // Query tokens per item: big tiles amortize each K chunk's transpose over more rows; halve them
  // while there would be fewer than ~4 items per thread.
  int32_t tile = std::max<int32_t>(1, kTileRows / G);
  const auto count_items = [&](int32_t t) {
    int64_t n = 0;
    for (int32_t r = 0; r < R; ++r) {
      const int32_t qlen = qlen_of(r);
      if (qlen > kMaxDecodeRowsQuery) n += static_cast<int64_t>(H) * ((qlen + t - 1) / t);
    }
    return n;
  };
  while (tile * G > kMinTileRows && count_items(tile) < 4 * threads) tile = std::max(1, tile / 2);

  struct Item {
    int32_t request, kv_head, first_query, num_queries;
    int64_t cost;  // ~ rows x keys, to start the expensive items first
  };
  std::vector<Item> items;
  for (int32_t r = 0; r < R; ++r) {
    const int32_t qlen = qlen_of(r);
    if (qlen <= kMaxDecodeRowsQuery) continue;
    const int32_t ctx = a.context_lens[r];
    for (int32_t i0 = 0; i0 < qlen; i0 += tile) {
      const int32_t nq = std::min(tile, qlen - i0);
      const int64_t keys = ctx - qlen + i0 + nq;
      for (int32_t h = 0; h < H; ++h) items.push_back({r, h, i0, nq, keys * nq});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.cost > y.cost; });

  const int64_t num_items = static_cast<int64_t>(items.size());
  const int64_t rows_max = static_cast<int64_t>(tile) * G;
  const int64_t own_floats = rows_max * D * 2 + 2 * rows_max;
  const int64_t scratch_floats = own_floats + kernels::extend_scratch_floats(D, static_cast<int32_t>(rows_max));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && num_items > 1)
  for (int64_t i = 0; i < num_items; ++i) {
    const Item& it = items[static_cast<size_t>(i)];
    const int32_t qlen = qlen_of(it.request);
    const int32_t ctx = a.context_lens[it.request];
    const int64_t token = a.query_start_loc[it.request] + it.first_query;
    const int32_t first_head = it.kv_head * G;
    const int64_t rows = static_cast<int64_t>(it.num_queries) * G;
    float* buf = thread_scratch(scratch_floats);
    float* q = buf;
    float* acc = q + rows * D;
    float* m = acc + rows * D;
    float* l = m + rows;
    load_queries(a, token, it.num_queries, first_head, G, q);
    ExtendWork w;
    w.kv = kv_view(a, it.request, it.kv_head);
    w.group = G;
    w.num_queries = it.num_queries;
    w.first_pos = ctx - qlen + it.first_query;
    w.q = q;
    w.acc = acc;
    w.m = m;
    w.l = l;
    w.scratch = buf + own_floats;
    k.extend[dt](w);
    write_rows(a, token, it.num_queries, first_head, G, acc, l);
  }
  return Status::Ok();
}

}  // namespace trillium
