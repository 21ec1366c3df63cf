// Tests of the C API (trillium/c_api.h) as a C host sees it: a happy path per area (allocator,
// prefix cache, store_kv + paged attention against a naive loop, token bitmask, spec verify), and
// the error paths: every bad argument and null handle returns its code and leaves a message naming
// the function, changes nothing, and never aborts. Plain ctest executable.
#include "trillium/c_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

namespace {

// expr must return TRILLIUM_OK.
#define CHECK_C_OK(expr)                                                                              \
  do {                                                                                                \
    const trillium_status _st = (expr);                                                               \
    if (_st != TRILLIUM_OK) {                                                                         \
      std::fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr, trillium_status_name(_st), \
                   trillium_last_error());                                                            \
      ++::trillium::test::failures();                                                                 \
    }                                                                                                 \
  } while (0)

// expr must fail with `code`, and the message must now start with the function's name `fn`.
#define CHECK_FAILS(expr, code, fn)                                                                   \
  do {                                                                                                \
    const trillium_status _st = (expr);                                                               \
    CHECK(_st == (code));                                                                             \
    CHECK(std::strncmp(trillium_last_error(), fn, std::strlen(fn)) == 0);                             \
    CHECK(std::strlen(trillium_last_error()) > std::strlen(fn) + 2);                                  \
  } while (0)

void test_version_and_thread_local_error() {
  CHECK(trillium_abi_version() == TRILLIUM_ABI_VERSION);
  CHECK(std::strlen(trillium_version()) >= 5);  // "x.y.z"
  CHECK(std::string(trillium_status_name(TRILLIUM_OUT_OF_BLOCKS)) == "out of blocks");
  CHECK(std::string(trillium_status_name(static_cast<trillium_status>(99))) == "unknown");
  CHECK_FAILS(trillium_block_allocator_check_invariants(nullptr), TRILLIUM_INVALID_ARGUMENT,
              "trillium_block_allocator_check_invariants");
  std::string other_thread = "unset";
  std::thread([&] { other_thread = trillium_last_error(); }).join();
  CHECK(other_thread.empty());  // the failure above belongs to this thread only
  CHECK_C_OK(trillium_block_allocator_destroy(nullptr));
  CHECK(std::strlen(trillium_last_error()) > 0);  // success leaves the last message alone
}

void test_allocator() {
  trillium_block_allocator* a = nullptr;
  CHECK_C_OK(trillium_block_allocator_create(8, &a));
  int32_t ids[3] = {-1, -1, -1};
  CHECK_C_OK(trillium_block_allocator_allocate(a, 3, ids));
  CHECK(ids[0] == 0 && ids[1] == 1 && ids[2] == 2);
  CHECK(trillium_block_allocator_num_free(a) == 5 && trillium_block_allocator_num_total(a) == 8);
  CHECK_C_OK(trillium_block_allocator_incref(a, ids, 1));
  CHECK(trillium_block_allocator_ref_count(a, ids[0]) == 2 && trillium_block_allocator_ref_count(a, 7) == 0);
  CHECK_C_OK(trillium_block_allocator_free(a, ids, 3));
  CHECK(trillium_block_allocator_ref_count(a, ids[0]) == 1 && trillium_block_allocator_num_free(a) == 7);
  CHECK_C_OK(trillium_block_allocator_check_invariants(a));

  // All-or-nothing failures: the caller's buffer and the allocator are unchanged.
  int32_t many[16] = {-7};
  CHECK_FAILS(trillium_block_allocator_allocate(a, 9, many), TRILLIUM_OUT_OF_BLOCKS,
              "trillium_block_allocator_allocate");
  CHECK(many[0] == -7 && trillium_block_allocator_num_free(a) == 7);
  CHECK_FAILS(trillium_block_allocator_allocate(a, -1, many), TRILLIUM_INVALID_ARGUMENT,
              "trillium_block_allocator_allocate");
  CHECK_FAILS(trillium_block_allocator_allocate(a, 1, nullptr), TRILLIUM_INVALID_ARGUMENT,
              "trillium_block_allocator_allocate");
  CHECK_C_OK(trillium_block_allocator_allocate(a, 0, nullptr));
  const int32_t double_free[2] = {ids[0], ids[0]};  // one reference left, listed twice
  CHECK_FAILS(trillium_block_allocator_free(a, double_free, 2), TRILLIUM_INVALID_ARGUMENT,
              "trillium_block_allocator_free");
  CHECK(trillium_block_allocator_ref_count(a, ids[0]) == 1);
  CHECK_FAILS(trillium_block_allocator_free(a, nullptr, 1), TRILLIUM_INVALID_ARGUMENT, "trillium_block_allocator_free");
  const int32_t free_block = 5;
  CHECK_FAILS(trillium_block_allocator_incref(a, &free_block, 1), TRILLIUM_INVALID_ARGUMENT,
              "trillium_block_allocator_incref");
  CHECK(trillium_block_allocator_ref_count(a, 99) == -1 && trillium_block_allocator_ref_count(a, -1) == -1);
  CHECK_C_OK(trillium_block_allocator_free(a, ids, 1));
  CHECK(trillium_block_allocator_num_free(a) == 8);
  CHECK_C_OK(trillium_block_allocator_check_invariants(a));
  CHECK_C_OK(trillium_block_allocator_destroy(a));

  // The constructor's std::invalid_argument comes back as a code, and *out is left alone.
  trillium_block_allocator* bad = nullptr;
  CHECK_FAILS(trillium_block_allocator_create(-1, &bad), TRILLIUM_INVALID_ARGUMENT, "trillium_block_allocator_create");
  CHECK(bad == nullptr);
  CHECK_FAILS(trillium_block_allocator_create(4, nullptr), TRILLIUM_INVALID_ARGUMENT,
              "trillium_block_allocator_create");

  // Null handles everywhere.
  CHECK_FAILS(trillium_block_allocator_allocate(nullptr, 1, many), TRILLIUM_INVALID_ARGUMENT,
              "trillium_block_allocator_allocate");
  CHECK_FAILS(trillium_block_allocator_incref(nullptr, ids, 1), TRILLIUM_INVALID_ARGUMENT,
              "trillium_block_allocator_incref");
  CHECK_FAILS(trillium_block_allocator_free(nullptr, ids, 1), TRILLIUM_INVALID_ARGUMENT,
              "trillium_block_allocator_free");
  CHECK(trillium_block_allocator_ref_count(nullptr, 0) == -1);
  CHECK(trillium_block_allocator_num_free(nullptr) == -1 && trillium_block_allocator_num_total(nullptr) == -1);
}

void test_prefix_cache() {
  constexpr int32_t kBs = 4;
  trillium_block_allocator* a = nullptr;
  CHECK_C_OK(trillium_block_allocator_create(8, &a));
  trillium_prefix_cache* c = nullptr;
  CHECK_C_OK(trillium_prefix_cache_create(a, kBs, &c));
  CHECK(trillium_prefix_cache_block_size(c) == kBs);

  // A request of 10 tokens in 3 blocks: the 2 full blocks get cached, the tail does not.
  const int32_t prompt[10] = {11, 12, 13, 14, 21, 22, 23, 24, 31, 32};
  int32_t blocks[3];
  CHECK_C_OK(trillium_block_allocator_allocate(a, 3, blocks));
  trillium_prefix_cache_insert_result ins = {-1, -1};
  CHECK_C_OK(trillium_prefix_cache_insert(c, 7, prompt, 10, blocks, 3, nullptr, 0, &ins));
  CHECK(ins.num_new_blocks == 2 && ins.num_duplicate_blocks == 0);
  CHECK(trillium_prefix_cache_num_cached_blocks(c) == 2 && trillium_block_allocator_ref_count(a, blocks[0]) == 2);

  // A second request shares the first block only; another namespace shares nothing.
  const int32_t other[6] = {11, 12, 13, 14, 99, 98};
  int32_t matched[2] = {-1, -1};
  int32_t num_tokens = -1;
  trillium_node_handle h = 12345;
  CHECK_C_OK(trillium_prefix_cache_match(c, 7, other, 6, matched, 2, &num_tokens, &h));
  CHECK(num_tokens == 4 && matched[0] == blocks[0] && matched[1] == -1 && h != TRILLIUM_NULL_NODE_HANDLE);
  trillium_node_handle none = 1;
  CHECK_C_OK(trillium_prefix_cache_match(c, 8, prompt, 10, nullptr, 0, &num_tokens, &none));
  CHECK(num_tokens == 0 && none == TRILLIUM_NULL_NODE_HANDLE);
  CHECK_C_OK(trillium_prefix_cache_lock(c, none));  // the null handle: a no-op

  // Re-inserting the same tokens under other block ids reports them as duplicates.
  int32_t dup_src[2];
  CHECK_C_OK(trillium_block_allocator_allocate(a, 2, dup_src));
  int32_t dups[2] = {-1, -1};
  CHECK_C_OK(trillium_prefix_cache_insert(c, 7, prompt, 8, dup_src, 2, dups, 2, &ins));
  CHECK(ins.num_new_blocks == 0 && ins.num_duplicate_blocks == 2 && dups[0] == dup_src[0] && dups[1] == dup_src[1]);
  CHECK_C_OK(trillium_block_allocator_free(a, dup_src, 2));

  // The request finishes; the locked prefix survives eviction, then goes once unlocked.
  CHECK_C_OK(trillium_prefix_cache_lock(c, h));
  CHECK_C_OK(trillium_block_allocator_free(a, blocks, 3));
  int32_t freed = -1;
  CHECK_C_OK(trillium_prefix_cache_evict(c, 8, &freed));
  CHECK(freed == 1 && trillium_prefix_cache_num_cached_blocks(c) == 1);  // the unlocked second block
  CHECK(trillium_prefix_cache_num_evictable_blocks(c) == 0);
  CHECK_C_OK(trillium_prefix_cache_unlock(c, h));
  CHECK_FAILS(trillium_prefix_cache_unlock(c, h), TRILLIUM_INVALID_ARGUMENT, "trillium_prefix_cache_unlock");
  CHECK_C_OK(trillium_prefix_cache_check_invariants(c));
  CHECK_C_OK(trillium_prefix_cache_evict(c, 8, &freed));
  CHECK(freed == 1 && trillium_prefix_cache_num_cached_blocks(c) == 0 && trillium_block_allocator_num_free(a) == 8);
  CHECK_FAILS(trillium_prefix_cache_lock(c, h), TRILLIUM_INVALID_ARGUMENT, "trillium_prefix_cache_lock");  // stale
  trillium_prefix_cache_stats stats;
  CHECK_C_OK(trillium_prefix_cache_get_stats(c, &stats));
  CHECK(stats.num_queries == 2 && stats.num_query_tokens == 16 && stats.num_hit_tokens == 4);
  CHECK(stats.num_inserted_blocks == 2 && stats.num_evicted_blocks == 2);

  // Bad arguments change nothing.
  CHECK_FAILS(trillium_prefix_cache_match(c, 7, prompt, 10, matched, 1, &num_tokens, &h), TRILLIUM_INVALID_ARGUMENT,
              "trillium_prefix_cache_match");  // room for 1 block, 2 possible
  CHECK_FAILS(trillium_prefix_cache_match(c, 7, nullptr, 4, nullptr, 0, &num_tokens, &h), TRILLIUM_INVALID_ARGUMENT,
              "trillium_prefix_cache_match");
  CHECK_FAILS(trillium_prefix_cache_match(c, 7, prompt, 4, nullptr, 0, nullptr, &h), TRILLIUM_INVALID_ARGUMENT,
              "trillium_prefix_cache_match");
  CHECK_FAILS(trillium_prefix_cache_insert(c, 7, prompt, 8, blocks, 1, nullptr, 0, nullptr),
              TRILLIUM_INVALID_ARGUMENT, "trillium_prefix_cache_insert");  // 2 full blocks, 1 id
  CHECK_FAILS(trillium_prefix_cache_insert(c, 7, prompt, 4, blocks, 1, nullptr, 0, nullptr),
              TRILLIUM_INVALID_ARGUMENT, "trillium_prefix_cache_insert");  // blocks[0] is free now
  CHECK_FAILS(trillium_prefix_cache_evict(c, -1, &freed), TRILLIUM_INVALID_ARGUMENT, "trillium_prefix_cache_evict");
  CHECK_FAILS(trillium_prefix_cache_evict(c, 1, nullptr), TRILLIUM_INVALID_ARGUMENT, "trillium_prefix_cache_evict");
  CHECK(trillium_prefix_cache_num_cached_blocks(c) == 0 && trillium_block_allocator_num_free(a) == 8);

  // The allocator outlives its caches: destroying it first is refused.
  CHECK_C_OK(trillium_block_allocator_allocate(a, 1, blocks));
  CHECK_C_OK(trillium_prefix_cache_insert(c, 1, prompt, 4, blocks, 1, nullptr, 0, nullptr));
  CHECK_C_OK(trillium_block_allocator_free(a, blocks, 1));
  CHECK_FAILS(trillium_block_allocator_destroy(a), TRILLIUM_INVALID_ARGUMENT, "trillium_block_allocator_destroy");
  int32_t dropped = -1;
  CHECK_C_OK(trillium_prefix_cache_clear(c, &dropped));
  CHECK(dropped == 1 && trillium_prefix_cache_num_namespaces(c) == 0 && trillium_prefix_cache_num_nodes(c) == 0);
  CHECK_C_OK(trillium_block_allocator_allocate(a, 1, blocks));
  CHECK_C_OK(trillium_prefix_cache_insert(c, 1, prompt, 4, blocks, 1, nullptr, 0, nullptr));
  trillium_prefix_cache_destroy(c);  // drops the cache's reference, the request keeps its own
  CHECK(trillium_block_allocator_ref_count(a, blocks[0]) == 1);
  CHECK_C_OK(trillium_block_allocator_free(a, blocks, 1));
  CHECK_C_OK(trillium_block_allocator_destroy(a));

  // Construction errors and null handles.
  CHECK_C_OK(trillium_block_allocator_create(2, &a));
  CHECK_FAILS(trillium_prefix_cache_create(a, 0, &c), TRILLIUM_INVALID_ARGUMENT, "trillium_prefix_cache_create");
  CHECK_FAILS(trillium_prefix_cache_create(nullptr, 4, &c), TRILLIUM_INVALID_ARGUMENT, "trillium_prefix_cache_create");
  CHECK_C_OK(trillium_block_allocator_destroy(a));  // the failed creates did not count as caches
  CHECK_FAILS(trillium_prefix_cache_lock(nullptr, 1), TRILLIUM_INVALID_ARGUMENT, "trillium_prefix_cache_lock");
  CHECK_FAILS(trillium_prefix_cache_match(nullptr, 0, prompt, 4, nullptr, 0, &num_tokens, &h),
              TRILLIUM_INVALID_ARGUMENT, "trillium_prefix_cache_match");
  CHECK_FAILS(trillium_prefix_cache_clear(nullptr, &dropped), TRILLIUM_INVALID_ARGUMENT, "trillium_prefix_cache_clear");
  CHECK_FAILS(trillium_prefix_cache_get_stats(nullptr, &stats), TRILLIUM_INVALID_ARGUMENT,
              "trillium_prefix_cache_get_stats");
  CHECK(trillium_prefix_cache_num_cached_blocks(nullptr) == -1 && trillium_prefix_cache_num_nodes(nullptr) == -1);
  trillium_prefix_cache_destroy(nullptr);
}

// ---- kernels: two requests of 5 and 11 tokens in a paged fp32 pool, checked against naive loops.

constexpr int32_t kBs = 4, kKvHeads = 2, kQHeads = 4, kDim = 16, kNumBlocks = 8, kTableStride = 4;
constexpr int32_t kRow = kKvHeads * kDim;  // one token's K (or V)

struct Pool {
  std::vector<float> k_cache = std::vector<float>(kNumBlocks * kBs * kRow, NAN);
  std::vector<float> v_cache = k_cache;
  std::vector<int32_t> context_lens = {5, 11};
  std::vector<int32_t> block_tables = std::vector<int32_t>(2 * kTableStride, 0);
  std::vector<std::vector<float>> keys, values;  // [ctx, Hkv, D] per request, what was stored
};

trillium_kv_store_args store_args(Pool& p, const float* key, const float* value, const int64_t* slots, int64_t n) {
  trillium_kv_store_args s{};
  s.key = key;
  s.value = value;
  s.key_stride_token = s.value_stride_token = kRow;
  s.key_stride_head = s.value_stride_head = kDim;
  s.src_dtype = s.cache_dtype = TRILLIUM_DTYPE_F32;
  s.k_cache = p.k_cache.data();
  s.v_cache = p.v_cache.data();
  s.num_blocks = kNumBlocks;
  s.block_size = kBs;
  s.num_kv_heads = kKvHeads;
  s.head_dim = kDim;
  s.slot_mapping = slots;
  s.num_tokens = n;
  return s;
}

// Blocks from a C allocator, then one store_kv call for both requests (plus a padding token).
void fill_pool(Pool& p, trillium_block_allocator* a, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> key, value;
  std::vector<int64_t> slots;
  for (int r = 0; r < 2; ++r) {
    const int32_t ctx = p.context_lens[r], num_blocks = (ctx + kBs - 1) / kBs;
    CHECK_C_OK(trillium_block_allocator_allocate(a, num_blocks, p.block_tables.data() + r * kTableStride));
    p.keys.emplace_back(ctx * kRow);
    p.values.emplace_back(ctx * kRow);
    for (float& x : p.keys[r]) x = normal(rng);
    for (float& x : p.values[r]) x = normal(rng);
    key.insert(key.end(), p.keys[r].begin(), p.keys[r].end());
    value.insert(value.end(), p.values[r].begin(), p.values[r].end());
    for (int32_t pos = 0; pos < ctx; ++pos) {
      slots.push_back(int64_t{p.block_tables[r * kTableStride + pos / kBs]} * kBs + pos % kBs);
    }
  }
  key.resize(key.size() + kRow, 1e9f);  // a padding token: slot -1, never written
  value.resize(key.size(), 1e9f);
  slots.push_back(-1);
  const trillium_kv_store_args s = store_args(p, key.data(), value.data(), slots.data(), int64_t(slots.size()));
  CHECK_C_OK(trillium_store_kv(&s));
}

// Max |error| of out rows [row, row + qlen) (request r's new tokens) against plain causal softmax.
double naive_error(const Pool& p, int r, int32_t qlen, const float* query, const float* out, float scale) {
  const int32_t ctx = p.context_lens[r];
  double max_err = 0;
  for (int32_t i = 0; i < qlen; ++i) {
    const int32_t visible = ctx - qlen + i + 1;
    for (int32_t qh = 0; qh < kQHeads; ++qh) {
      const int32_t kh = qh / (kQHeads / kKvHeads);
      const float* q = query + (i * kQHeads + qh) * kDim;
      std::vector<double> w(visible);
      double mx = -INFINITY, sum = 0;
      for (int32_t j = 0; j < visible; ++j) {
        double dot = 0;
        for (int32_t d = 0; d < kDim; ++d) dot += double{q[d]} * p.keys[r][(j * kKvHeads + kh) * kDim + d];
        w[j] = dot * scale;
        mx = std::max(mx, w[j]);
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int32_t d = 0; d < kDim; ++d) {
        double want = 0;
        for (int32_t j = 0; j < visible; ++j) want += w[j] / sum * p.values[r][(j * kKvHeads + kh) * kDim + d];
        max_err = std::max(max_err, std::abs(want - out[(i * kQHeads + qh) * kDim + d]));
      }
    }
  }
  return max_err;
}

trillium_paged_attention_args attention_args(const Pool& p, const float* query, float* out, int64_t num_tokens) {
  trillium_paged_attention_args a{};
  a.query = query;
  a.query_stride_token = a.out_stride_token = kQHeads * kDim;
  a.query_stride_head = a.out_stride_head = kDim;
  a.out = out;
  a.query_dtype = a.out_dtype = a.kv_dtype = TRILLIUM_DTYPE_F32;
  a.k_cache = p.k_cache.data();
  a.v_cache = p.v_cache.data();
  a.num_blocks = kNumBlocks;
  a.block_size = kBs;
  a.num_kv_heads = kKvHeads;
  a.head_dim = kDim;
  a.num_q_heads = kQHeads;
  a.num_requests = 2;
  a.num_tokens = num_tokens;
  a.context_lens = p.context_lens.data();
  a.block_tables = p.block_tables.data();
  a.block_table_stride = kTableStride;
  a.scale = 1.0f / std::sqrt(float{kDim});
  return a;
}

void test_attention() {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  trillium_block_allocator* alloc = nullptr;
  CHECK_C_OK(trillium_block_allocator_create(kNumBlocks, &alloc));
  Pool p;
  fill_pool(p, alloc, rng);

  // Decode: one new token per request.
  std::vector<float> query(5 * kQHeads * kDim), out(query.size(), NAN);
  for (float& x : query) x = normal(rng);
  trillium_paged_attention_args a = attention_args(p, query.data(), out.data(), 2);
  CHECK_C_OK(trillium_paged_attention_decode(&a));
  const int64_t row = kQHeads * kDim;
  CHECK(naive_error(p, 0, 1, query.data(), out.data(), a.scale) < 1e-4);
  CHECK(naive_error(p, 1, 1, query.data() + row, out.data() + row, a.scale) < 1e-4);

  // Extend: 2 and 3 new tokens, each causal over its request's prefix.
  const int32_t starts[3] = {0, 2, 5};
  a = attention_args(p, query.data(), out.data(), 5);
  a.query_start_loc = starts;
  CHECK_C_OK(trillium_paged_attention_extend(&a));
  CHECK(naive_error(p, 0, 2, query.data(), out.data(), a.scale) < 1e-4);
  CHECK(naive_error(p, 1, 3, query.data() + 2 * row, out.data() + 2 * row, a.scale) < 1e-4);

  // Bad values: an error code, a message, nothing written.
  const std::vector<float> out_before = out, k_before = p.k_cache;
  a = attention_args(p, query.data(), out.data(), 5);  // decode needs T == R
  CHECK_FAILS(trillium_paged_attention_decode(&a), TRILLIUM_INVALID_ARGUMENT, "trillium_paged_attention_decode");
  a = attention_args(p, query.data(), out.data(), 2);
  a.head_dim = 8;  // not a multiple of 16
  CHECK_FAILS(trillium_paged_attention_decode(&a), TRILLIUM_INVALID_ARGUMENT, "trillium_paged_attention_decode");
  a = attention_args(p, query.data(), out.data(), 2);
  a.kv_dtype = 7;
  CHECK_FAILS(trillium_paged_attention_decode(&a), TRILLIUM_INVALID_ARGUMENT, "trillium_paged_attention_decode");
  a = attention_args(p, query.data(), out.data(), 5);  // extend without query_start_loc
  CHECK_FAILS(trillium_paged_attention_extend(&a), TRILLIUM_INVALID_ARGUMENT, "trillium_paged_attention_extend");
  CHECK_FAILS(trillium_paged_attention_decode(nullptr), TRILLIUM_INVALID_ARGUMENT, "trillium_paged_attention_decode");
  CHECK(std::memcmp(out.data(), out_before.data(), out.size() * sizeof(float)) == 0);

  const float one_row[kRow] = {1.0f};
  const int64_t outside = int64_t{kNumBlocks} * kBs;
  trillium_kv_store_args s = store_args(p, one_row, one_row, &outside, 1);
  CHECK_FAILS(trillium_store_kv(&s), TRILLIUM_INVALID_ARGUMENT, "trillium_store_kv");
  const int64_t slot0 = 0;
  s = store_args(p, one_row, one_row, &slot0, 1);
  s.src_dtype = -1;
  CHECK_FAILS(trillium_store_kv(&s), TRILLIUM_INVALID_ARGUMENT, "trillium_store_kv");
  CHECK_FAILS(trillium_store_kv(nullptr), TRILLIUM_INVALID_ARGUMENT, "trillium_store_kv");
  CHECK(std::memcmp(p.k_cache.data(), k_before.data(), k_before.size() * sizeof(float)) == 0);

  // fp32 -> bf16 cache: 1.0f is 0x3f80 in bf16.
  std::vector<uint16_t> k16(kNumBlocks * kBs * kRow, 0), v16(k16.size(), 0);
  s = store_args(p, one_row, one_row, &slot0, 1);
  s.cache_dtype = TRILLIUM_DTYPE_BF16;
  s.k_cache = k16.data();
  s.v_cache = v16.data();
  CHECK_C_OK(trillium_store_kv(&s));
  CHECK(k16[0] == 0x3f80 && v16[0] == 0x3f80 && k16[1] == 0);

  CHECK_FAILS(trillium_set_kernel_isa("bogus"), TRILLIUM_INVALID_ARGUMENT, "trillium_set_kernel_isa");
  CHECK_C_OK(trillium_set_kernel_isa(trillium_kernel_isa()));
  CHECK_C_OK(trillium_block_allocator_free(alloc, p.block_tables.data(), 2));
  CHECK_C_OK(trillium_block_allocator_free(alloc, p.block_tables.data() + kTableStride, 3));
  CHECK(trillium_block_allocator_num_free(alloc) == kNumBlocks);
  CHECK_C_OK(trillium_block_allocator_destroy(alloc));
}

void test_token_bitmask() {
  constexpr int64_t kVocab = 40, kWords = 2;
  std::vector<float> logits(2 * kVocab, 0.5f);
  const int32_t mask[kWords] = {0x5, 0x1};  // tokens 0, 2 and 32
  const int32_t rows[2] = {0, -1};          // the second row stays unmasked
  trillium_token_bitmask_args b{};
  b.logits = logits.data();
  b.logits_dtype = TRILLIUM_DTYPE_F32;
  b.logits_stride = kVocab;
  b.num_rows = 2;
  b.vocab_size = kVocab;
  b.bitmask = mask;
  b.bitmask_stride = kWords;
  b.num_mask_rows = 1;
  b.num_words = kWords;
  b.mask_rows = rows;
  CHECK_C_OK(trillium_apply_token_bitmask(&b));
  for (int64_t t = 0; t < kVocab; ++t) {
    const bool allowed = t == 0 || t == 2 || t == 32;
    CHECK(allowed ? logits[t] == 0.5f : std::isinf(logits[t]) && logits[t] < 0);
    CHECK(logits[kVocab + t] == 0.5f);
  }

  const std::vector<float> before = logits;
  const int32_t bad_rows[2] = {0, 3};  // mask row 3 does not exist
  b.mask_rows = bad_rows;
  CHECK_FAILS(trillium_apply_token_bitmask(&b), TRILLIUM_INVALID_ARGUMENT, "trillium_apply_token_bitmask");
  b.mask_rows = rows;
  b.logits_stride = kVocab - 1;
  CHECK_FAILS(trillium_apply_token_bitmask(&b), TRILLIUM_INVALID_ARGUMENT, "trillium_apply_token_bitmask");
  CHECK_FAILS(trillium_apply_token_bitmask(nullptr), TRILLIUM_INVALID_ARGUMENT, "trillium_apply_token_bitmask");
  CHECK(logits == before);
}

void test_spec_verify() {
  constexpr int64_t kN = 3, kK = 2, kV = 5;
  std::vector<float> target(kN * (kK + 1) * kV, 0.0f);
  auto row = [&](int64_t i, int64_t j) { return target.data() + (i * (kK + 1) + j) * kV; };
  const int32_t best[2][3] = {{1, 3, 4}, {2, 0, 1}};  // greedy requests' argmax per position
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) row(i, j)[best[i][j]] = 1.0f;
  const float weights[kV] = {0, 1, 1, 2, 0};  // request 2 samples: running sums 0 1 2 4 4
  std::copy(weights, weights + kV, row(2, 0));
  int32_t drafts[kN * kK] = {1, 3, /* request 1 */ 2, 4, /* request 2 */ 0, 0};
  int32_t num_draft[kN] = {2, 2, 0};
  int32_t modes[kN] = {TRILLIUM_SPEC_GREEDY, TRILLIUM_SPEC_GREEDY, TRILLIUM_SPEC_POINT_MASS};
  double uniforms[kN * (kK + 1)] = {0, 0, 0, 0, 0, 0, 0.6, 0, 0};  // 0.6 * 4 = 2.4: token 3
  int32_t accepted[kN] = {-7, -7, -7};
  int32_t out[kN * (kK + 1)];
  std::fill(out, out + kN * (kK + 1), -7);

  trillium_spec_verify_args v{};
  v.num_requests = kN;
  v.max_draft = kK;
  v.vocab_size = kV;
  v.target = target.data();
  v.target_stride_request = (kK + 1) * kV;
  v.target_stride_position = kV;
  v.draft_tokens = drafts;
  v.num_draft = num_draft;
  v.modes = modes;
  v.uniforms = uniforms;
  v.num_accepted = accepted;
  v.output_tokens = out;
  CHECK_C_OK(trillium_spec_verify(&v));
  CHECK(accepted[0] == 2 && accepted[1] == 1 && accepted[2] == 0);
  const int32_t want[kN * (kK + 1)] = {1, 3, 4, /* request 1 */ 2, 0, -1, /* request 2 */ 3, -1, -1};
  CHECK(std::memcmp(out, want, sizeof want) == 0);

  std::fill(out, out + kN * (kK + 1), -7);
  modes[1] = 5;  // not a mode
  CHECK_FAILS(trillium_spec_verify(&v), TRILLIUM_INVALID_ARGUMENT, "trillium_spec_verify");
  modes[1] = TRILLIUM_SPEC_GREEDY;
  v.uniforms = nullptr;  // request 2 samples
  CHECK_FAILS(trillium_spec_verify(&v), TRILLIUM_INVALID_ARGUMENT, "trillium_spec_verify");
  v.uniforms = uniforms;
  v.max_draft = TRILLIUM_MAX_SPEC_DRAFT_TOKENS + 1;
  CHECK_FAILS(trillium_spec_verify(&v), TRILLIUM_INVALID_ARGUMENT, "trillium_spec_verify");
  CHECK_FAILS(trillium_spec_verify(nullptr), TRILLIUM_INVALID_ARGUMENT, "trillium_spec_verify");
  CHECK(out[0] == -7 && out[kN * (kK + 1) - 1] == -7);
}

}  // namespace

// The journal through the C API: stored with tokens and parent, removed tail first, a late
// subscriber's snapshot, and the null-argument errors.
void test_cache_events() {
  constexpr int32_t kBs = 2;
  trillium_block_allocator* a = nullptr;
  CHECK_C_OK(trillium_block_allocator_create(8, &a));
  trillium_prefix_cache* c = nullptr;
  CHECK_C_OK(trillium_prefix_cache_create(a, kBs, &c));
  CHECK_C_OK(trillium_prefix_cache_record_events(c, 1));
  const int32_t tokens[4] = {5, 6, 7, 8};
  int32_t blocks[2];
  CHECK_C_OK(trillium_block_allocator_allocate(a, 2, blocks));
  CHECK_C_OK(trillium_prefix_cache_insert(c, 3, tokens, 4, blocks, 2, nullptr, 0, nullptr));
  const trillium_cache_event* events = nullptr;
  size_t n = 0;
  CHECK_C_OK(trillium_prefix_cache_take_events(c, &events, &n));
  CHECK(n == 1 && events[0].kind == TRILLIUM_CACHE_EVENT_STORED && events[0].ns == 3);
  CHECK(events[0].num_blocks == 2 && events[0].block_ids[1] == blocks[1] && events[0].parent_block_id == -1);
  CHECK(events[0].num_tokens == 4 && events[0].tokens[3] == 8);
  CHECK_C_OK(trillium_prefix_cache_journal_cached(c));
  CHECK_C_OK(trillium_prefix_cache_take_events(c, &events, &n));
  CHECK(n == 1 && events[0].num_blocks == 2);  // the whole cache again, for a late subscriber
  CHECK_C_OK(trillium_block_allocator_free(a, blocks, 2));
  int32_t freed = 0;
  CHECK_C_OK(trillium_prefix_cache_evict(c, 1, &freed));
  CHECK_C_OK(trillium_prefix_cache_take_events(c, &events, &n));
  CHECK(freed == 1 && n == 1 && events[0].kind == TRILLIUM_CACHE_EVENT_REMOVED && events[0].block_ids[0] == blocks[1]);
  CHECK(events[0].tokens == nullptr && events[0].num_tokens == 0);
  CHECK_C_OK(trillium_prefix_cache_take_events(c, &events, &n));
  CHECK(n == 0);
  CHECK_FAILS(trillium_prefix_cache_take_events(c, nullptr, &n), TRILLIUM_INVALID_ARGUMENT,
              "trillium_prefix_cache_take_events");
  CHECK_FAILS(trillium_prefix_cache_record_events(nullptr, 1), TRILLIUM_INVALID_ARGUMENT,
              "trillium_prefix_cache_record_events");
  trillium_prefix_cache_destroy(c);
  CHECK_C_OK(trillium_block_allocator_destroy(a));
}

int main() {
  test_version_and_thread_local_error();
  test_cache_events();
  test_allocator();
  test_prefix_cache();
  test_attention();
  test_token_bitmask();
  test_spec_verify();
  return trillium::test::test_exit_code();
}
