/* A C host of trillium's core through the C API only (trillium/c_api.h), built against the
 * installed package:
 *
 *   cmake -S examples/embed/c -B build-embed-c -DCMAKE_PREFIX_PATH=<install prefix>
 *
 * Two requests share a system prompt. Request A runs first and leaves its full blocks in the prefix
 * cache; request B finds them there, stores K/V only for its own tokens, and both then take one
 * decode step of paged attention, checked against a naive loop over the K/V they should see.
 * Prints one summary line; exits nonzero on any failure or mismatch.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "trillium/c_api.h"

enum {
  kBlockSize = 4,
  kNumBlocks = 16,
  kKvHeads = 2,
  kQHeads = 4,
  kHeadDim = 16,
  kRow = kKvHeads * kHeadDim, /* one token's K (or V) */
  kMaxBlocksPerRequest = 4,   /* block-table row length */
  kMaxTokens = kBlockSize * kMaxBlocksPerRequest
};

static const uint64_t kNamespace = 0x7e57; /* the caller's hash of model + adapter + tenant */

/* A toy model: K and V of a token depend only on its id and position, as in a real model with
 * the same prefix, so a cached block holds exactly what recomputing it would give. */
static float toy_kv(int32_t token, int32_t pos, int32_t head, int32_t d, int is_value) {
  const uint32_t h = (uint32_t)token * 2654435761u ^ (uint32_t)(pos * 40503 + head * 977 + d * 131 + is_value * 7919);
  return (float)(h % 2001u) / 1000.0f - 1.0f;
}

static int ok(trillium_status st, const char* what) {
  if (st != TRILLIUM_OK) {
    fprintf(stderr, "embed_c: %s: %s (%s)\n", what, trillium_status_name(st), trillium_last_error());
  }
  return st == TRILLIUM_OK;
}

/* Stores positions [first, ctx) of a request's tokens into the pool through its block table. */
static int store(float* k_cache, float* v_cache, const int32_t* table, const int32_t* tokens, int32_t first,
                 int32_t ctx) {
  static float key[kMaxTokens * kRow], value[kMaxTokens * kRow];
  int64_t slots[kMaxTokens];
  int32_t n = 0;
  for (int32_t pos = first; pos < ctx; ++pos, ++n) {
    for (int32_t h = 0; h < kKvHeads; ++h) {
      for (int32_t d = 0; d < kHeadDim; ++d) {
        key[n * kRow + h * kHeadDim + d] = toy_kv(tokens[pos], pos, h, d, 0);
        value[n * kRow + h * kHeadDim + d] = toy_kv(tokens[pos], pos, h, d, 1);
      }
    }
    slots[n] = (int64_t)table[pos / kBlockSize] * kBlockSize + pos % kBlockSize;
  }
  trillium_kv_store_args args;
  memset(&args, 0, sizeof args);
  args.key = key;
  args.value = value;
  args.key_stride_token = args.value_stride_token = kRow;
  args.key_stride_head = args.value_stride_head = kHeadDim;
  args.src_dtype = args.cache_dtype = TRILLIUM_DTYPE_F32;
  args.k_cache = k_cache;
  args.v_cache = v_cache;
  args.num_blocks = kNumBlocks;
  args.block_size = kBlockSize;
  args.num_kv_heads = kKvHeads;
  args.head_dim = kHeadDim;
  args.slot_mapping = slots;
  args.num_tokens = n;
  return ok(trillium_store_kv(&args), "store_kv");
}

/* Max |error| of one decode row (the last of ctx tokens) against softmax attention computed from
 * toy_kv directly, so a wrong cached block or slot shows up as a mismatch. */
static double decode_error(const int32_t* tokens, int32_t ctx, const float* query, const float* out, float scale) {
  double max_err = 0.0;
  for (int32_t qh = 0; qh < kQHeads; ++qh) {
    const int32_t kh = qh / (kQHeads / kKvHeads);
    const float* q = query + qh * kHeadDim;
    double w[kMaxTokens], mx = -INFINITY, sum = 0.0;
    for (int32_t p = 0; p < ctx; ++p) {
      double dot = 0.0;
      for (int32_t d = 0; d < kHeadDim; ++d) dot += (double)q[d] * toy_kv(tokens[p], p, kh, d, 0);
      w[p] = dot * scale;
      if (w[p] > mx) mx = w[p];
    }
    for (int32_t p = 0; p < ctx; ++p) sum += (w[p] = exp(w[p] - mx));
    for (int32_t d = 0; d < kHeadDim; ++d) {
      double want = 0.0;
      for (int32_t p = 0; p < ctx; ++p) want += w[p] / sum * toy_kv(tokens[p], p, kh, d, 1);
      const double err = fabs(want - out[qh * kHeadDim + d]);
      if (err > max_err) max_err = err;
    }
  }
  return max_err;
}

int main(void) {
  if (trillium_abi_version() != TRILLIUM_ABI_VERSION) {
    fprintf(stderr, "embed_c: built for C ABI %d, library has %d\n", TRILLIUM_ABI_VERSION, trillium_abi_version());
    return 1;
  }
  static float k_cache[kNumBlocks * kBlockSize * kRow], v_cache[kNumBlocks * kBlockSize * kRow];
  /* Shared system prompt (8 tokens, 2 full blocks), then each request's own tokens. */
  const int32_t prompt_a[9] = {1, 15, 27, 3, 99, 42, 7, 8, /* A: */ 500};
  const int32_t prompt_b[11] = {1, 15, 27, 3, 99, 42, 7, 8, /* B: */ 600, 601, 602};
  const int32_t ctx[2] = {9, 11};
  int32_t tables[2 * kMaxBlocksPerRequest] = {0}; /* block-table rows of A and B */

  trillium_block_allocator* alloc = NULL;
  trillium_prefix_cache* cache = NULL;
  if (!ok(trillium_block_allocator_create(kNumBlocks, &alloc), "create allocator")) return 1;
  if (!ok(trillium_prefix_cache_create(alloc, kBlockSize, &cache), "create prefix cache")) return 1;

  /* Request A: nothing cached yet; 3 fresh blocks, K/V for all 9 tokens, then its 2 full blocks
   * go into the cache (which takes its own reference on them). */
  int32_t hit_a = -1, hit_b = -1;
  trillium_node_handle handle_b = TRILLIUM_NULL_NODE_HANDLE, unused = TRILLIUM_NULL_NODE_HANDLE;
  if (!ok(trillium_prefix_cache_match(cache, kNamespace, prompt_a, 9, NULL, 0, &hit_a, &unused), "match A")) return 1;
  if (!ok(trillium_block_allocator_allocate(alloc, 3, tables), "allocate A")) return 1;
  if (!store(k_cache, v_cache, tables, prompt_a, 0, ctx[0])) return 1;
  if (!ok(trillium_prefix_cache_insert(cache, kNamespace, prompt_a, 9, tables, 3, NULL, 0, NULL), "insert A")) {
    return 1;
  }

  /* Request B: the cache holds its first 8 tokens. Lock them, take a reference of its own, and
   * store K/V only for positions 8..10 in one new block. */
  int32_t* table_b = tables + kMaxBlocksPerRequest;
  if (!ok(trillium_prefix_cache_match(cache, kNamespace, prompt_b, 11, table_b, kMaxBlocksPerRequest, &hit_b,
                                      &handle_b), "match B")) {
    return 1;
  }
  if (!ok(trillium_prefix_cache_lock(cache, handle_b), "lock B")) return 1;
  const int32_t cached_blocks = hit_b / kBlockSize;
  if (!ok(trillium_block_allocator_incref(alloc, table_b, (size_t)cached_blocks), "incref B")) return 1;
  if (!ok(trillium_block_allocator_allocate(alloc, 3 - cached_blocks, table_b + cached_blocks), "allocate B")) return 1;
  if (!store(k_cache, v_cache, table_b, prompt_b, hit_b, ctx[1])) return 1;

  /* One decode step for both: the query of each request's last token against all of its K/V. */
  float query[2 * kQHeads * kHeadDim], out[2 * kQHeads * kHeadDim];
  for (int32_t i = 0; i < 2 * kQHeads * kHeadDim; ++i) query[i] = toy_kv(i, 7, 0, 0, 0);
  trillium_paged_attention_args attn;
  memset(&attn, 0, sizeof attn);
  attn.query = query;
  attn.out = out;
  attn.query_stride_token = attn.out_stride_token = kQHeads * kHeadDim;
  attn.query_stride_head = attn.out_stride_head = kHeadDim;
  attn.query_dtype = attn.out_dtype = attn.kv_dtype = TRILLIUM_DTYPE_F32;
  attn.k_cache = k_cache;
  attn.v_cache = v_cache;
  attn.num_blocks = kNumBlocks;
  attn.block_size = kBlockSize;
  attn.num_kv_heads = kKvHeads;
  attn.head_dim = kHeadDim;
  attn.num_q_heads = kQHeads;
  attn.num_requests = 2;
  attn.num_tokens = 2;
  attn.context_lens = ctx;
  attn.block_tables = tables;
  attn.block_table_stride = kMaxBlocksPerRequest;
  attn.scale = 0.25f; /* 1 / sqrt(head_dim) */
  if (!ok(trillium_paged_attention_decode(&attn), "paged_attention_decode")) return 1;
  const double err_a = decode_error(prompt_a, ctx[0], query, out, attn.scale);
  const double err_b = decode_error(prompt_b, ctx[1], query + kQHeads * kHeadDim, out + kQHeads * kHeadDim, attn.scale);
  const double max_err = err_a > err_b ? err_a : err_b;

  /* A deliberate bad call: more blocks than exist. It fails with a code and a message, changes
   * nothing, and the program goes on. */
  int32_t too_many[kNumBlocks + 1];
  const trillium_status bad = trillium_block_allocator_allocate(alloc, kNumBlocks + 1, too_many);
  char bad_message[256];
  snprintf(bad_message, sizeof bad_message, "%s", trillium_last_error());

  /* Requests finish: unlock, drop their references; the cache's blocks stay until evicted. */
  if (!ok(trillium_prefix_cache_unlock(cache, handle_b), "unlock B")) return 1;
  if (!ok(trillium_block_allocator_free(alloc, tables, 3), "free A")) return 1;
  if (!ok(trillium_block_allocator_free(alloc, table_b, 3), "free B")) return 1;
  const int32_t still_cached = trillium_prefix_cache_num_cached_blocks(cache);
  trillium_prefix_cache_destroy(cache);
  const int all_free = trillium_block_allocator_num_free(alloc) == kNumBlocks;
  if (!ok(trillium_block_allocator_check_invariants(alloc), "allocator invariants")) return 1;
  if (!ok(trillium_block_allocator_destroy(alloc), "destroy allocator")) return 1;

  const int pass = hit_a == 0 && hit_b == 8 && max_err < 1e-4 && bad == TRILLIUM_OUT_OF_BLOCKS && still_cached == 2 &&
                   all_free;
  printf("embed_c: trillium %s (C ABI %d, %s kernels): prefix hit %d/%d tokens, decode max |error| %.1e; "
         "bad call -> %s: %s; %s\n",
         trillium_version(), trillium_abi_version(), trillium_kernel_isa(), hit_b, ctx[1], max_err,
         trillium_status_name(bad), bad_message, pass ? "ok" : "MISMATCH");
  return pass ? 0 : 1;
}
