// A C++ host embedding trillium's core through the installed package (no Python, no torch): the
// block allocator and the radix prefix cache place two requests that share a 32-token prompt
// prefix, store_kv writes their K/V, and one decode step of paged attention is checked against a
// naive loop. Prints one line; exits nonzero on any mismatch.
#include <trillium/block_allocator.h>
#include <trillium/cpu_isa.h>
#include <trillium/kernels/kv_store.h>
#include <trillium/kernels/paged_attention.h>
#include <trillium/radix_tree.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

constexpr int32_t kBlockSize = 16, kKvHeads = 2, kQHeads = 4, kHeadDim = 32, kBlocks = 16;
constexpr int32_t kRow = kKvHeads * kHeadDim;  // one token's K (or V)

bool ok(const trillium::Status& st, const char* what) {
  if (!st.ok()) std::fprintf(stderr, "%s: %s\n", what, st.message().c_str());
  return st.ok();
}

}  // namespace

int main() {
  trillium::BlockAllocator alloc(kBlocks);
  trillium::RadixTree cache(&alloc, kBlockSize);
  std::vector<float> k_cache(static_cast<size_t>(kBlocks) * kBlockSize * kRow), v_cache(k_cache.size());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;

  // Request A: 37 tokens. Request B: A's first 32 tokens, then 9 of its own.
  std::vector<int32_t> a(37), b;
  for (int32_t i = 0; i < 37; ++i) a[i] = 100 + i;
  b.assign(a.begin(), a.begin() + 32);
  for (int32_t i = 0; i < 9; ++i) b.push_back(900 + i);
  const std::vector<std::vector<int32_t>> prompts = {a, b};

  std::vector<std::vector<int32_t>> tables(2);
  std::vector<float> keys(static_cast<size_t>(kBlocks) * kBlockSize * kRow), values(keys.size());  // by slot
  int32_t reused = 0;
  for (int r = 0; r < 2; ++r) {
    const auto& tokens = prompts[r];
    trillium::MatchResult hit = cache.match(/*ns=*/0, tokens);  // A finds nothing, B its prefix
    reused += hit.num_tokens;
    tables[r] = hit.block_ids;
    for (int32_t id : hit.block_ids)
      if (!ok(alloc.incref(id), "incref")) return 1;  // the request's own reference
    const int32_t need = (static_cast<int32_t>(tokens.size()) + kBlockSize - 1) / kBlockSize;
    std::vector<int32_t> fresh;
    if (!ok(alloc.allocate(need - static_cast<int32_t>(tables[r].size()), &fresh), "allocate")) return 1;
    tables[r].insert(tables[r].end(), fresh.begin(), fresh.end());

    // K/V of the tokens not already cached, written through store_kv.
    std::vector<int64_t> slots;
    std::vector<float> k_new, v_new;
    for (int32_t p = hit.num_tokens; p < static_cast<int32_t>(tokens.size()); ++p) {
      const int64_t slot = static_cast<int64_t>(tables[r][p / kBlockSize]) * kBlockSize + p % kBlockSize;
      slots.push_back(slot);
      for (int32_t e = 0; e < kRow; ++e) {
        k_new.push_back(keys[slot * kRow + e] = normal(rng));
        v_new.push_back(values[slot * kRow + e] = normal(rng));
      }
    }
    trillium::KVStoreArgs store;
    store.key = k_new.data();
    store.value = v_new.data();
    store.key_stride_token = store.value_stride_token = kRow;
    store.key_stride_head = store.value_stride_head = kHeadDim;
    store.k_cache = k_cache.data();
    store.v_cache = v_cache.data();
    store.num_blocks = kBlocks;
    store.block_size = kBlockSize;
    store.num_kv_heads = kKvHeads;
    store.head_dim = kHeadDim;
    store.slot_mapping = slots.data();
    store.num_tokens = static_cast<int64_t>(slots.size());
    if (!ok(trillium::store_kv(store), "store_kv")) return 1;
    trillium::InsertResult inserted;
    if (!ok(cache.insert(0, tokens, tables[r], &inserted), "insert")) return 1;
  }

  // One decode step: each request's last token attends to its whole context.
  const std::vector<int32_t> context = {static_cast<int32_t>(a.size()), static_cast<int32_t>(b.size())};
  const int32_t stride = 3;
  std::vector<int32_t> block_tables(2 * stride, 0);
  for (int r = 0; r < 2; ++r) std::copy(tables[r].begin(), tables[r].end(), block_tables.begin() + r * stride);
  std::vector<float> query(2 * kQHeads * kHeadDim), out(query.size(), NAN);
  for (float& x : query) x = normal(rng);
  trillium::PagedAttentionArgs attn;
  attn.query = query.data();
  attn.query_stride_token = attn.out_stride_token = kQHeads * kHeadDim;
  attn.query_stride_head = attn.out_stride_head = kHeadDim;
  attn.out = out.data();
  attn.k_cache = k_cache.data();
  attn.v_cache = v_cache.data();
  attn.num_blocks = kBlocks;
  attn.block_size = kBlockSize;
  attn.num_kv_heads = kKvHeads;
  attn.head_dim = kHeadDim;
  attn.num_q_heads = kQHeads;
  attn.num_requests = 2;
  attn.num_tokens = 2;
  attn.context_lens = context.data();
  attn.block_tables = block_tables.data();
  attn.block_table_stride = stride;
  attn.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  if (!ok(trillium::paged_attention_decode(attn), "paged_attention_decode")) return 1;

  double max_err = 0;
  for (int r = 0; r < 2; ++r) {
    for (int32_t qh = 0; qh < kQHeads; ++qh) {
      const int32_t kh = qh / (kQHeads / kKvHeads);
      const float* q = query.data() + (r * kQHeads + qh) * kHeadDim;
      std::vector<double> w(context[r]);
      double mx = -INFINITY, sum = 0;
      for (int32_t p = 0; p < context[r]; ++p) {
        const int64_t slot = static_cast<int64_t>(tables[r][p / kBlockSize]) * kBlockSize + p % kBlockSize;
        double dot = 0;
        for (int32_t d = 0; d < kHeadDim; ++d) dot += q[d] * keys[slot * kRow + kh * kHeadDim + d];
        mx = std::max(mx, w[p] = dot * attn.scale);
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int32_t d = 0; d < kHeadDim; ++d) {
        double expected = 0;
        for (int32_t p = 0; p < context[r]; ++p) {
          const int64_t slot = static_cast<int64_t>(tables[r][p / kBlockSize]) * kBlockSize + p % kBlockSize;
          expected += w[p] / sum * values[slot * kRow + kh * kHeadDim + d];
        }
        max_err = std::max(max_err, std::abs(expected - out[(r * kQHeads + qh) * kHeadDim + d]));
      }
    }
  }
  for (auto& t : tables)
    if (!ok(alloc.free(t), "free")) return 1;
  int32_t dropped = 0;
  if (!ok(cache.clear(&dropped), "clear")) return 1;
  const bool all_free = alloc.num_free_blocks() == alloc.num_total_blocks();
  std::printf("embed_cpp: %d prefix tokens reused, decode attention max |error| %.2e (%s kernels), all blocks free: %s\n",
              reused, max_err, trillium::kernel_isa_name(trillium::kernel_isa()), all_free ? "yes" : "no");
  return max_err < 1e-4 && reused == 32 && all_free ? 0 : 1;
}
