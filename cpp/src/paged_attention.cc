// Paged attention driver: validates once, splits the batch into work items, runs them over OpenMP
// threads through the active ISA's inner loops (kernels/attention_impl.h), merges split-key partial
// states and writes the output in its dtype.
//
// Work items:
//   decode  (request, key range, tokens)    ranges of >= kMinSplitKeys keys (block multiples, from
//                                           key 0 or a sliding window's first key); the last
//                                           range of a token to finish merges them all; a
//                                           request's several tokens share one item's K/V reads
//   extend  (request, KV head, query tile)  tiles of ~kTileRows query rows (tokens x G heads);
//                                           requests of <= kMaxDecodeRowsQuery new tokens run
//                                           each token as a decode row instead
// A decode row's split depends on its context length (and the layer's window) alone, so a token's
// attention is the same bits in every kind of step (see split_len_for).
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
  if (isa >= KernelIsa::kAvx512) return avx512;  // no VNNI loops: attention is fp32
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
  if (a.window < 0) return bad("window must be >= 0 (0: none), got " + std::to_string(a.window));
  if (!(a.softcap >= 0.0f) || std::isinf(a.softcap)) return bad("softcap must be finite and >= 0 (0: none)");
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

// Consecutive query tokens of one request: token t (t < num_tokens) is query row `token + t` and
// attends over the first `ctx + t` keys. A decode step's request is a group of one; a request
// with few new tokens (a speculative verify step) is one group, so K and V are read once for all.
struct DecodeGroup {
  int64_t token;
  int32_t request, ctx, num_tokens;
};

// Key range length of a decode row's splits: a function of its context length only (never of the
// batch, the step's shape, the thread count or the tokens it shares a work item with), so a row's
// result is the same bits whichever step computes it -- a decode step, a verify step's draft row,
// a mixed step. Speculative decoding's lossless outputs rest on that.
int64_t split_len_for(int32_t ctx, int32_t block_size) {
  const int64_t len = std::max<int64_t>(kMinSplitKeys, (static_cast<int64_t>(ctx) + kSplitsMax - 1) / kSplitsMax);
  return (len + block_size - 1) / block_size * block_size;
}

// Groups whose tokens all have the same split length (true below ~4k keys; else one group per
// token), each token's index in the flattened token list, and split counts per token.
struct DecodePlan {
  std::vector<DecodeGroup> groups;
  std::vector<int32_t> first_token;  // per group: index of its token 0 among all tokens
  std::vector<int64_t> split_len;    // per group
  std::vector<int32_t> key_lo;       // per group: its lowest visible key (a window's start, else 0)
  int32_t num_tokens = 0;
};

// With a sliding window every token is its own group, its keys [ctx - window, ctx) (from 0 when
// shorter), split as a context of that many keys: again a function of the row's own position only.
DecodePlan plan_groups(const std::vector<DecodeGroup>& todo, int32_t block_size, int32_t window) {
  DecodePlan plan;
  const auto lo_of = [window](int32_t ctx) { return window > 0 && ctx > window ? ctx - window : 0; };
  for (const DecodeGroup& g : todo) {
    const int64_t len = split_len_for(g.ctx, block_size);
    if (g.num_tokens > 1 && (window > 0 || split_len_for(g.ctx + g.num_tokens - 1, block_size) != len)) {
      for (int32_t t = 0; t < g.num_tokens; ++t) {
        const int32_t ctx = g.ctx + t;
        plan.groups.push_back({g.token + t, g.request, ctx, 1});
        plan.split_len.push_back(split_len_for(ctx - lo_of(ctx), block_size));
        plan.key_lo.push_back(lo_of(ctx));
        plan.first_token.push_back(plan.num_tokens++);
      }
      continue;
    }
    plan.groups.push_back(g);
    plan.split_len.push_back(g.num_tokens == 1 ? split_len_for(g.ctx - lo_of(g.ctx), block_size) : len);
    plan.key_lo.push_back(g.num_tokens == 1 ? lo_of(g.ctx) : 0);
    plan.first_token.push_back(plan.num_tokens);
    plan.num_tokens += g.num_tokens;
  }
  return plan;
}

// The decode loop over groups of tokens (validated by the caller). Long contexts are split into
// key ranges (split_len_for) whose partial states are merged per token, in range order, by the
// last item to finish that token. A work item is (group, key range, a run of the group's tokens):
// a group's tokens are cut into runs only when there would be too few items for the threads.
void run_decode_groups(const PagedAttentionArgs& a, const std::vector<DecodeGroup>& todo) {
  const int32_t H = a.num_kv_heads, G = a.num_q_heads / a.num_kv_heads, D = a.head_dim;
  const int32_t HG = H * G;  // query rows of one token
  const int threads = thread_count(a);
  const kernels::DecodeFn decode = isa_kernels(kernel_isa()).decode[a.kv_dtype == DType::kBF16];
  const DecodePlan plan = plan_groups(todo, a.block_size, a.window);
  const auto num_groups = static_cast<int32_t>(plan.groups.size());

  int64_t range_items = 0;
  for (int32_t gi = 0; gi < num_groups; ++gi) {
    const DecodeGroup& g = plan.groups[static_cast<size_t>(gi)];
    range_items += (g.ctx + g.num_tokens - 1 - plan.key_lo[static_cast<size_t>(gi)] +
                    plan.split_len[static_cast<size_t>(gi)] - 1) /
                   plan.split_len[static_cast<size_t>(gi)];
  }
  // Runs per group: enough items for ~2 per thread (each run reads the keys again).
  const int64_t runs_wanted = std::max<int64_t>(1, (2 * threads + range_items - 1) / std::max<int64_t>(range_items, 1));

  struct Item {
    int32_t group, t_begin, t_end, split, key_begin, key_end;
  };
  std::vector<Item> items;
  std::vector<int32_t> num_splits(static_cast<size_t>(plan.num_tokens), 1);
  std::vector<int64_t> first_partial(static_cast<size_t>(plan.num_tokens), -1);  // slot of (token, split 0)
  int64_t num_partials = 0;
  int32_t max_run = 1;
  for (int32_t gi = 0; gi < num_groups; ++gi) {
    const DecodeGroup& g = plan.groups[static_cast<size_t>(gi)];
    const int64_t L = plan.split_len[static_cast<size_t>(gi)];
    const int32_t lo = plan.key_lo[static_cast<size_t>(gi)];  // 0 for a group of several tokens
    for (int32_t t = 0; t < g.num_tokens; ++t) {
      const size_t tok = static_cast<size_t>(plan.first_token[static_cast<size_t>(gi)] + t);
      num_splits[tok] = static_cast<int32_t>((g.ctx + t - lo + L - 1) / L);
      if (num_splits[tok] > 1) {
        first_partial[tok] = num_partials;
        num_partials += num_splits[tok];
      }
    }
    const auto runs = static_cast<int32_t>(std::min<int64_t>(g.num_tokens, runs_wanted));
    const int32_t run_len = (g.num_tokens + runs - 1) / runs;
    max_run = std::max(max_run, run_len);
    const int32_t last_ctx = g.ctx + g.num_tokens - 1;
    for (int32_t s = 0; lo + static_cast<int64_t>(s) * L < last_ctx; ++s) {
      const auto key_begin = static_cast<int32_t>(lo + s * L);
      for (int32_t t0 = 0; t0 < g.num_tokens; t0 += run_len) {
        // Tokens of the run that see a key of this range: ctx + t > key_begin.
        const int32_t t_begin = std::max(t0, key_begin - g.ctx + 1);
        const int32_t t_end = std::min(g.num_tokens, t0 + run_len);
        if (t_begin >= t_end) continue;
        const auto key_end = static_cast<int32_t>(std::min<int64_t>(g.ctx + t_end - 1, key_begin + L));
        items.push_back({gi, t_begin, t_end, s, key_begin, key_end});
      }
    }
  }
  // Partial states of split tokens: [slot][HG * (D + 2)] = acc [HG, D], m [HG], l [HG].
  const int64_t slot_floats = static_cast<int64_t>(HG) * (D + 2);
  std::vector<float> partials(static_cast<size_t>(num_partials * slot_floats));
  std::vector<std::atomic<int32_t>> remaining(static_cast<size_t>(num_partials > 0 ? plan.num_tokens : 0));
  for (int32_t t = 0; t < plan.num_tokens && num_partials > 0; ++t) {
    remaining[static_cast<size_t>(t)].store(num_splits[static_cast<size_t>(t)], std::memory_order_relaxed);
  }

  const int64_t num_items = static_cast<int64_t>(items.size());
  const int64_t rows_max = static_cast<int64_t>(max_run) * HG;
  // q, acc [rows_max, D]; m, l [rows_max]; one token's acc [HG, D] and l [HG].
  const int64_t own_floats = rows_max * D * 2 + 2 * rows_max + static_cast<int64_t>(HG) * (D + 1);
  const int64_t scratch_floats = own_floats + kernels::decode_scratch_floats(D, static_cast<int32_t>(rows_max));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && num_items > 1)
  for (int64_t i = 0; i < num_items; ++i) {
    const Item& it = items[static_cast<size_t>(i)];
    const DecodeGroup& g = plan.groups[static_cast<size_t>(it.group)];
    const int32_t T = it.t_end - it.t_begin;
    const int32_t GT = T * G;  // the item's rows per KV head
    float* buf = thread_scratch(scratch_floats);
    float* q = buf;
    float* acc = q + rows_max * D;
    float* m = acc + rows_max * D;
    float* l = m + rows_max;
    float* tok_acc = l + rows_max;
    float* tok_l = tok_acc + static_cast<int64_t>(HG) * D;
    thread_local std::vector<int32_t> key_ends;  // the run's tokens' key ends
    key_ends.resize(static_cast<size_t>(T));
    // Rows in [KV head][token][head of its group] order (DecodeWork's several-token layout): per
    // KV head, load_queries' token-major rows of its G heads.
    for (int32_t h = 0; h < H; ++h) load_queries(a, g.token + it.t_begin, T, h * G, G, q + static_cast<int64_t>(h) * GT * D);
    for (int32_t t = 0; t < T; ++t) key_ends[static_cast<size_t>(t)] = std::min(g.ctx + it.t_begin + t, it.key_end);
    DecodeWork w;
    w.kv = kv_view(a, g.request, /*kv_head=*/0);
    w.num_kv_heads = H;
    w.group = GT;
    w.q = q;
    w.key_begin = it.key_begin;
    w.key_end = it.key_end;
    w.heads_per_token = G;
    w.token_key_end = T > 1 ? key_ends.data() : nullptr;
    w.softcap = a.softcap * kLog2e;
    w.acc = acc;
    w.m = m;
    w.l = l;
    w.scratch = buf + own_floats;
    decode(w);
    for (int32_t t = 0; t < T; ++t) {
      const int32_t tok = plan.first_token[static_cast<size_t>(it.group)] + it.t_begin + t;
      const int64_t token = g.token + it.t_begin + t;
      const int32_t splits = num_splits[static_cast<size_t>(tok)];
      // This token's rows, back in head order (hr = h * G + g).
      float* dst_acc = tok_acc;
      float* dst_m = nullptr;
      float* dst_l = tok_l;
      if (splits > 1) {
        dst_acc = partials.data() + (first_partial[static_cast<size_t>(tok)] + it.split) * slot_floats;
        dst_m = dst_acc + static_cast<int64_t>(HG) * D;
        dst_l = dst_m + HG;
      }
      for (int32_t h = 0; h < H; ++h) {
        for (int32_t gg = 0; gg < G; ++gg) {
          const int64_t src = static_cast<int64_t>(h) * GT + t * G + gg, hr = h * G + gg;
          std::copy(acc + src * D, acc + (src + 1) * D, dst_acc + hr * D);
          if (dst_m) dst_m[hr] = m[src];
          dst_l[hr] = l[src];
        }
      }
      if (splits == 1) {
        write_rows(a, token, 1, 0, HG, tok_acc, tok_l);
        continue;
      }
      // The last split of this token to finish merges all of them, in range order (acq_rel: it
      // sees every other split's writes).
      if (remaining[static_cast<size_t>(tok)].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
      const int64_t first_slot = first_partial[static_cast<size_t>(tok)];
      for (int32_t hr = 0; hr < HG; ++hr) {
        float m_max = -INFINITY;
        for (int32_t s = 0; s < splits; ++s) {
          m_max = std::max(m_max, partials[(first_slot + s) * slot_floats + HG * D + hr]);
        }
        float l_sum = 0.0f;
        float* out_row = tok_acc + hr * D;
        std::fill(out_row, out_row + D, 0.0f);
        for (int32_t s = 0; s < splits; ++s) {
          const float* p = partials.data() + (first_slot + s) * slot_floats;
          const float weight = std::exp2(p[HG * D + hr] - m_max);
          l_sum += p[HG * D + HG + hr] * weight;
          for (int32_t d = 0; d < D; ++d) out_row[d] += p[hr * D + d] * weight;
        }
        tok_l[hr] = l_sum;
      }
      write_rows(a, token, 1, 0, HG, tok_acc, tok_l);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------- API
Status paged_attention_decode(const PagedAttentionArgs& a) {
  if (Status st = validate(a, /*decode=*/true); !st.ok()) return st;
  std::vector<DecodeGroup> groups(static_cast<size_t>(a.num_requests));
  for (int32_t r = 0; r < a.num_requests; ++r) groups[static_cast<size_t>(r)] = {r, r, a.context_lens[r], 1};
  run_decode_groups(a, groups);
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
  // as a decode row over the keys it sees: the same arithmetic as a decode step's (one group per
  // request, so the tokens share their reads of K and V).
  std::vector<DecodeGroup> decode_groups;
  for (int32_t r = 0; r < R; ++r) {
    const int32_t qlen = qlen_of(r);
    if (qlen > kMaxDecodeRowsQuery || qlen == 0) continue;
    decode_groups.push_back({a.query_start_loc[r], r, a.context_lens[r] - qlen + 1, qlen});
  }
  if (!decode_groups.empty()) run_decode_groups(a, decode_groups);

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
    w.window = a.window;
    w.softcap = a.softcap * kLog2e;
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
