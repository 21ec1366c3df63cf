// A C++ host embedding trillium_core with no Python: allocate KV blocks for two requests, store
// their K/V with store_kv, run one decode step of paged attention, and check it against a naive
// loop. Exits nonzero on any mismatch, so ctest runs it as a smoke test.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "trillium/block_allocator.h"
#include "trillium/cpu_isa.h"
#include "trillium/kernels/kv_store.h"
#include "trillium/kernels/paged_attention.h"

namespace {

constexpr int32_t kBlockSize = 16, kKvHeads = 3, kQHeads = 9, kHeadDim = 64;  // SmolLM2-135M's shapes
constexpr int32_t kRowElems = kKvHeads * kHeadDim;                           // one token's K (or V)

bool report(const trillium::Status& st, const char* what) {
  if (!st.ok()) std::fprintf(stderr, "%s: %s\n", what, st.message().c_str());
  return st.ok();
}

}  // namespace

int main() {
  trillium::BlockAllocator alloc(/*num_blocks=*/32);
  std::vector<float> k_cache(32 * kBlockSize * kRowElems), v_cache(k_cache.size());

  // Two requests of 37 and 5 tokens: block tables from the allocator, K/V stored slot by slot.
  const std::vector<int32_t> context_lens = {37, 5};
  std::vector<std::vector<int32_t>> tables(2);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> keys(2), values(2);  // [ctx, Hkv, D] per request, for the check
  for (int r = 0; r < 2; ++r) {
    const int32_t blocks = (context_lens[r] + kBlockSize - 1) / kBlockSize;
    if (!report(alloc.allocate(blocks, &tables[r]), "allocate")) return 1;
    keys[r].resize(static_cast<size_t>(context_lens[r]) * kRowElems);
    values[r].resize(keys[r].size());
    for (float& x : keys[r]) x = normal(rng);
    for (float& x : values[r]) x = normal(rng);
    std::vector<int64_t> slots;
    for (int32_t p = 0; p < context_lens[r]; ++p) slots.push_back(tables[r][p / kBlockSize] * kBlockSize + p % kBlockSize);
    trillium::KVStoreArgs store;
    store.key = keys[r].data();
    store.value = values[r].data();
    store.key_stride_token = store.value_stride_token = kRowElems;
    store.key_stride_head = store.value_stride_head = kHeadDim;
    store.k_cache = k_cache.data();
    store.v_cache = v_cache.data();
    store.num_blocks = alloc.num_total_blocks();
    store.block_size = kBlockSize;
    store.num_kv_heads = kKvHeads;
    store.head_dim = kHeadDim;
    store.slot_mapping = slots.data();
    store.num_tokens = context_lens[r];
    if (!report(trillium::store_kv(store), "store_kv")) return 1;
  }

  // One decode step: the query of each request's last token against all of its KV.
  const int32_t stride = 3;  // padded block-table rows
  std::vector<int32_t> block_tables(2 * stride, 0);
  for (int r = 0; r < 2; ++r)
    for (size_t b = 0; b < tables[r].size(); ++b) block_tables[r * stride + b] = tables[r][b];
  std::vector<float> query(2 * kQHeads * kHeadDim), out(query.size(), NAN);
  for (float& x : query) x = normal(rng);
  trillium::PagedAttentionArgs attn;
  attn.query = query.data();
  attn.query_stride_token = attn.out_stride_token = kQHeads * kHeadDim;
  attn.query_stride_head = attn.out_stride_head = kHeadDim;
  attn.out = out.data();
  attn.k_cache = k_cache.data();
  attn.v_cache = v_cache.data();
  attn.num_blocks = alloc.num_total_blocks();
  attn.block_size = kBlockSize;
  attn.num_kv_heads = kKvHeads;
  attn.head_dim = kHeadDim;
  attn.num_q_heads = kQHeads;
  attn.num_requests = 2;
  attn.num_tokens = 2;
  attn.context_lens = context_lens.data();
  attn.block_tables = block_tables.data();
  attn.block_table_stride = stride;
  attn.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  if (!report(trillium::paged_attention_decode(attn), "paged_attention_decode")) return 1;

  double max_err = 0;
  for (int r = 0; r < 2; ++r) {
    for (int32_t qh = 0; qh < kQHeads; ++qh) {
      const int32_t kh = qh / (kQHeads / kKvHeads);
      const float* q = query.data() + (r * kQHeads + qh) * kHeadDim;
      std::vector<double> w(context_lens[r]);
      double mx = -INFINITY, sum = 0;
      for (int32_t p = 0; p < context_lens[r]; ++p) {
        double dot = 0;
        for (int32_t d = 0; d < kHeadDim; ++d) dot += q[d] * keys[r][(p * kKvHeads + kh) * kHeadDim + d];
        w[p] = dot * attn.scale;
        mx = std::max(mx, w[p]);
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int32_t d = 0; d < kHeadDim; ++d) {
        double expected = 0;
        for (int32_t p = 0; p < context_lens[r]; ++p) expected += w[p] / sum * values[r][(p * kKvHeads + kh) * kHeadDim + d];
        max_err = std::max(max_err, std::abs(expected - out[(r * kQHeads + qh) * kHeadDim + d]));
      }
    }
  }
  std::printf("decode attention for 2 requests (%s kernels): max |error| %.2e\n",
              trillium::kernel_isa_name(trillium::kernel_isa()), max_err);
  for (auto& t : tables)
    if (!report(alloc.free(t), "free")) return 1;
  return max_err < 1e-4 && alloc.num_free_blocks() == alloc.num_total_blocks() ? 0 : 1;
}
