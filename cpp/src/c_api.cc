// The C API (trillium/c_api.h): one C++ call per function, its Status mapped to a trillium_status.
//
// Every exported body runs inside guarded(), which turns any C++ exception into a status code:
// unwinding through a C caller's frames is undefined behaviour, and noexcept alone would turn a
// std::bad_alloc into std::terminate. The last-error message lives in a fixed thread-local buffer
// so that recording an error never allocates, and so can never throw while handling one.
#include "trillium/c_api.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>
#include <vector>

#include "trillium/block_allocator.h"
#include "trillium/cpu_isa.h"
#include "trillium/kernels/dtype.h"
#include "trillium/kernels/kv_store.h"
#include "trillium/kernels/paged_attention.h"
#include "trillium/kernels/spec_verify.h"
#include "trillium/kernels/token_bitmask.h"
#include "trillium/radix_tree.h"
#include "trillium/status.h"

#ifndef TRILLIUM_VERSION
#define TRILLIUM_VERSION "0.0.0"
#endif

// The C enums restate C++ values; a change on either side must break the build, not the ABI.
static_assert(TRILLIUM_INVALID_ARGUMENT == static_cast<int>(trillium::StatusCode::kInvalidArgument), "status");
static_assert(TRILLIUM_OUT_OF_BLOCKS == static_cast<int>(trillium::StatusCode::kOutOfBlocks), "status");
static_assert(TRILLIUM_INTERNAL == static_cast<int>(trillium::StatusCode::kInternal), "status");
static_assert(TRILLIUM_DTYPE_F32 == static_cast<int>(trillium::DType::kF32), "dtype");
static_assert(TRILLIUM_DTYPE_BF16 == static_cast<int>(trillium::DType::kBF16), "dtype");
static_assert(TRILLIUM_SPEC_GREEDY == static_cast<int>(trillium::SpecVerifyMode::kGreedy), "mode");
static_assert(TRILLIUM_SPEC_POINT_MASS == static_cast<int>(trillium::SpecVerifyMode::kPointMass), "mode");
static_assert(TRILLIUM_SPEC_DRAFT_PROBS == static_cast<int>(trillium::SpecVerifyMode::kDraftProbs), "mode");
static_assert(TRILLIUM_MAX_SPEC_DRAFT_TOKENS == trillium::kMaxSpecDraftTokens, "max draft");
static_assert(sizeof(trillium_node_handle) == sizeof(uint64_t), "node handle");

// The opaque handles. An allocator counts the caches built over it so that destroying it first is
// an error rather than a dangling pointer inside each cache.
struct trillium_block_allocator {
  explicit trillium_block_allocator(int32_t num_blocks) : core(num_blocks) {}
  trillium::BlockAllocator core;
  int32_t num_caches = 0;
};

struct trillium_prefix_cache {
  trillium_prefix_cache(trillium_block_allocator* owner_, int32_t block_size)
      : tree(&owner_->core, block_size), owner(owner_) {}
  trillium::RadixTree tree;
  trillium_block_allocator* owner;
  std::vector<trillium::CacheEvent> taken;   // the last take_events' journal ...
  std::vector<trillium_cache_event> views;  // ... and the C views into it
};

namespace {

thread_local char last_error[1024] = "";

// Records "function: message" (truncated to the buffer) and returns code.
trillium_status fail(trillium_status code, const char* fn, const char* message) noexcept {
  std::snprintf(last_error, sizeof last_error, "%s: %s", fn, message);
  return code;
}

trillium_status to_c(trillium::StatusCode code) noexcept {
  switch (code) {
    case trillium::StatusCode::kOk: return TRILLIUM_OK;
    case trillium::StatusCode::kInvalidArgument: return TRILLIUM_INVALID_ARGUMENT;
    case trillium::StatusCode::kOutOfBlocks: return TRILLIUM_OUT_OF_BLOCKS;
    case trillium::StatusCode::kInternal: return TRILLIUM_INTERNAL;
  }
  return TRILLIUM_INTERNAL;  // a code added in C++ but not here: still a failure
}

// What a body gets to report with: the exported function's name rides along for the message.
struct Call {
  const char* fn;
  trillium_status invalid(const char* message) const noexcept { return fail(TRILLIUM_INVALID_ARGUMENT, fn, message); }
  trillium_status result(const trillium::Status& st) const noexcept {
    return st.ok() ? TRILLIUM_OK : fail(to_c(st.code()), fn, st.message().c_str());
  }
};

// Runs body(call) and maps every exception: bad_alloc -> OUT_OF_MEMORY; invalid_argument (what
// the C++ constructors throw for bad sizes) -> INVALID_ARGUMENT; anything else -> INTERNAL.
template <class Body>
trillium_status guarded(const char* fn, Body&& body) noexcept {
  const Call call{fn};
  try {
    return body(call);
  } catch (const std::bad_alloc&) {
    return fail(TRILLIUM_OUT_OF_MEMORY, fn, "out of memory");
  } catch (const std::invalid_argument& e) {
    return fail(TRILLIUM_INVALID_ARGUMENT, fn, e.what());
  } catch (const std::exception& e) {
    return fail(TRILLIUM_INTERNAL, fn, e.what());
  } catch (...) {
    return fail(TRILLIUM_INTERNAL, fn, "unknown C++ exception");
  }
}

// For the count queries: value(h) when h is non-null, otherwise (or on any exception) -1.
template <class Handle, class Value>
int32_t count_or_minus_one(const char* fn, const Handle* h, Value&& value) noexcept {
  int32_t out = -1;
  const trillium_status st = guarded(fn, [&](const Call& call) {
    if (h == nullptr) return call.invalid("null handle");
    out = value(*h);
    return TRILLIUM_OK;
  });
  return st == TRILLIUM_OK ? out : -1;
}

trillium::DType dtype(int32_t d) { return static_cast<trillium::DType>(d); }  // the kernels reject unknown values

}  // namespace

// ------------------------------------------------------------------------------------ errors

extern "C" const char* trillium_last_error(void) noexcept { return last_error; }

extern "C" const char* trillium_status_name(trillium_status status) noexcept {
  switch (status) {
    case TRILLIUM_OK: return "ok";
    case TRILLIUM_INVALID_ARGUMENT: return "invalid argument";
    case TRILLIUM_OUT_OF_BLOCKS: return "out of blocks";
    case TRILLIUM_INTERNAL: return "internal error";
    case TRILLIUM_OUT_OF_MEMORY: return "out of memory";
  }
  return "unknown";
}

extern "C" const char* trillium_version(void) noexcept { return TRILLIUM_VERSION; }

extern "C" int trillium_abi_version(void) noexcept { return TRILLIUM_ABI_VERSION; }

// ---------------------------------------------------------------------------- block allocator

extern "C" trillium_status trillium_block_allocator_create(int32_t num_blocks,
                                                           trillium_block_allocator** out) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (out == nullptr) return call.invalid("out is null");
    *out = new trillium_block_allocator(num_blocks);  // throws invalid_argument for num_blocks < 0
    return TRILLIUM_OK;
  });
}

extern "C" trillium_status trillium_block_allocator_destroy(trillium_block_allocator* allocator) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (allocator == nullptr) return TRILLIUM_OK;
    if (allocator->num_caches > 0) return call.invalid("prefix caches over this allocator still exist");
    delete allocator;
    return TRILLIUM_OK;
  });
}

extern "C" trillium_status trillium_block_allocator_allocate(trillium_block_allocator* allocator, int32_t n,
                                                             int32_t* out_block_ids) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (allocator == nullptr) return call.invalid("null allocator");
    if (out_block_ids == nullptr && n > 0) return call.invalid("out_block_ids is null");
    std::vector<int32_t> ids;
    if (n > 0) ids.reserve(static_cast<size_t>(n));  // before allocate: a bad_alloc then changes nothing
    const trillium_status st = call.result(allocator->core.allocate(n, &ids));
    if (st == TRILLIUM_OK) std::copy(ids.begin(), ids.end(), out_block_ids);
    return st;
  });
}

extern "C" trillium_status trillium_block_allocator_incref(trillium_block_allocator* allocator,
                                                           const int32_t* block_ids, size_t num_block_ids) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (allocator == nullptr) return call.invalid("null allocator");
    if (block_ids == nullptr && num_block_ids > 0) return call.invalid("block_ids is null");
    return call.result(allocator->core.incref(std::vector<int32_t>(block_ids, block_ids + num_block_ids)));
  });
}

extern "C" trillium_status trillium_block_allocator_free(trillium_block_allocator* allocator, const int32_t* block_ids,
                                                         size_t num_block_ids) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (allocator == nullptr) return call.invalid("null allocator");
    if (block_ids == nullptr && num_block_ids > 0) return call.invalid("block_ids is null");
    return call.result(allocator->core.free(std::vector<int32_t>(block_ids, block_ids + num_block_ids)));
  });
}

extern "C" int32_t trillium_block_allocator_ref_count(const trillium_block_allocator* allocator,
                                                      int32_t block_id) noexcept {
  return count_or_minus_one(__func__, allocator, [&](const trillium_block_allocator& a) {
    return a.core.ref_count(block_id);
  });
}

extern "C" int32_t trillium_block_allocator_num_free(const trillium_block_allocator* allocator) noexcept {
  return count_or_minus_one(__func__, allocator, [](const trillium_block_allocator& a) {
    return a.core.num_free_blocks();
  });
}

extern "C" int32_t trillium_block_allocator_num_total(const trillium_block_allocator* allocator) noexcept {
  return count_or_minus_one(__func__, allocator, [](const trillium_block_allocator& a) {
    return a.core.num_total_blocks();
  });
}

extern "C" trillium_status trillium_block_allocator_check_invariants(
    const trillium_block_allocator* allocator) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (allocator == nullptr) return call.invalid("null allocator");
    return call.result(allocator->core.check_invariants());
  });
}

// ------------------------------------------------------------------------------- prefix cache

extern "C" trillium_status trillium_prefix_cache_create(trillium_block_allocator* allocator, int32_t block_size,
                                                        trillium_prefix_cache** out) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (allocator == nullptr) return call.invalid("null allocator");
    if (out == nullptr) return call.invalid("out is null");
    *out = new trillium_prefix_cache(allocator, block_size);  // throws invalid_argument for block_size < 1
    ++allocator->num_caches;
    return TRILLIUM_OK;
  });
}

extern "C" void trillium_prefix_cache_destroy(trillium_prefix_cache* cache) noexcept {
  (void)guarded(__func__, [&](const Call&) {
    if (cache == nullptr) return TRILLIUM_OK;
    --cache->owner->num_caches;
    delete cache;  // ~RadixTree frees the tree's reference on every cached block
    return TRILLIUM_OK;
  });
}

extern "C" trillium_status trillium_prefix_cache_match(trillium_prefix_cache* cache, uint64_t ns,
                                                       const int32_t* tokens, size_t num_tokens,
                                                       int32_t* out_block_ids, size_t block_ids_capacity,
                                                       int32_t* out_num_tokens,
                                                       trillium_node_handle* out_handle) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (cache == nullptr) return call.invalid("null cache");
    if (tokens == nullptr && num_tokens > 0) return call.invalid("tokens is null");
    if (out_num_tokens == nullptr || out_handle == nullptr) return call.invalid("out_num_tokens or out_handle is null");
    // Checked before the match, which touches LRU times and counters: the most it can return.
    const size_t max_blocks = num_tokens / static_cast<size_t>(cache->tree.block_size());
    if (out_block_ids != nullptr && block_ids_capacity < max_blocks) {
      return call.invalid("block_ids_capacity is smaller than num_tokens / block_size");
    }
    const trillium::MatchResult m = cache->tree.match(ns, tokens, num_tokens);
    if (out_block_ids != nullptr) std::copy(m.block_ids.begin(), m.block_ids.end(), out_block_ids);
    *out_num_tokens = m.num_tokens;
    *out_handle = m.handle.value();
    return TRILLIUM_OK;
  });
}

extern "C" trillium_status trillium_prefix_cache_insert(trillium_prefix_cache* cache, uint64_t ns,
                                                        const int32_t* tokens, size_t num_tokens,
                                                        const int32_t* block_ids, size_t num_block_ids,
                                                        int32_t* out_duplicate_block_ids, size_t duplicate_capacity,
                                                        trillium_prefix_cache_insert_result* out_result) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (cache == nullptr) return call.invalid("null cache");
    if ((tokens == nullptr && num_tokens > 0) || (block_ids == nullptr && num_block_ids > 0)) {
      return call.invalid("tokens or block_ids is null");
    }
    const size_t max_blocks = num_tokens / static_cast<size_t>(cache->tree.block_size());
    if (out_duplicate_block_ids != nullptr && duplicate_capacity < max_blocks) {
      return call.invalid("duplicate_capacity is smaller than num_tokens / block_size");
    }
    trillium::InsertResult r;
    const trillium_status st = call.result(cache->tree.insert(ns, tokens, num_tokens, block_ids, num_block_ids, &r));
    if (st != TRILLIUM_OK) return st;
    if (out_duplicate_block_ids != nullptr) {
      std::copy(r.duplicate_block_ids.begin(), r.duplicate_block_ids.end(), out_duplicate_block_ids);
    }
    if (out_result != nullptr) {
      out_result->num_new_blocks = r.num_new_blocks;
      out_result->num_duplicate_blocks = static_cast<int32_t>(r.duplicate_block_ids.size());
    }
    return TRILLIUM_OK;
  });
}

extern "C" trillium_status trillium_prefix_cache_lock(trillium_prefix_cache* cache,
                                                      trillium_node_handle handle) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (cache == nullptr) return call.invalid("null cache");
    return call.result(cache->tree.lock(trillium::NodeHandle::from_value(handle)));
  });
}

extern "C" trillium_status trillium_prefix_cache_unlock(trillium_prefix_cache* cache,
                                                        trillium_node_handle handle) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (cache == nullptr) return call.invalid("null cache");
    return call.result(cache->tree.unlock(trillium::NodeHandle::from_value(handle)));
  });
}

extern "C" trillium_status trillium_prefix_cache_evict(trillium_prefix_cache* cache, int32_t num_blocks,
                                                       int32_t* out_num_freed) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (cache == nullptr) return call.invalid("null cache");
    return call.result(cache->tree.evict(num_blocks, out_num_freed));  // the tree rejects a null out
  });
}

extern "C" trillium_status trillium_prefix_cache_clear(trillium_prefix_cache* cache,
                                                       int32_t* out_num_dropped) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (cache == nullptr) return call.invalid("null cache");
    int32_t dropped = 0;
    const trillium_status st = call.result(cache->tree.clear(&dropped));
    if (st == TRILLIUM_OK && out_num_dropped != nullptr) *out_num_dropped = dropped;
    return st;
  });
}

extern "C" int32_t trillium_prefix_cache_block_size(const trillium_prefix_cache* cache) noexcept {
  return count_or_minus_one(__func__, cache, [](const trillium_prefix_cache& c) { return c.tree.block_size(); });
}

extern "C" int32_t trillium_prefix_cache_num_cached_blocks(const trillium_prefix_cache* cache) noexcept {
  return count_or_minus_one(__func__, cache, [](const trillium_prefix_cache& c) { return c.tree.num_cached_blocks(); });
}

extern "C" int32_t trillium_prefix_cache_num_evictable_blocks(const trillium_prefix_cache* cache) noexcept {
  return count_or_minus_one(__func__, cache,
                            [](const trillium_prefix_cache& c) { return c.tree.num_evictable_blocks(); });
}

extern "C" int32_t trillium_prefix_cache_num_nodes(const trillium_prefix_cache* cache) noexcept {
  return count_or_minus_one(__func__, cache, [](const trillium_prefix_cache& c) { return c.tree.num_nodes(); });
}

extern "C" int32_t trillium_prefix_cache_num_namespaces(const trillium_prefix_cache* cache) noexcept {
  return count_or_minus_one(__func__, cache, [](const trillium_prefix_cache& c) { return c.tree.num_namespaces(); });
}

extern "C" trillium_status trillium_prefix_cache_get_stats(const trillium_prefix_cache* cache,
                                                           trillium_prefix_cache_stats* out) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (cache == nullptr || out == nullptr) return call.invalid("null cache or out");
    const trillium::RadixTreeStats& s = cache->tree.stats();
    out->num_queries = s.num_queries;
    out->num_query_tokens = s.num_query_tokens;
    out->num_hit_tokens = s.num_hit_tokens;
    out->num_inserted_blocks = s.num_inserted_blocks;
    out->num_evicted_blocks = s.num_evicted_blocks;
    return TRILLIUM_OK;
  });
}

extern "C" trillium_status trillium_prefix_cache_check_invariants(const trillium_prefix_cache* cache) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (cache == nullptr) return call.invalid("null cache");
    return call.result(cache->tree.check_invariants());
  });
}

extern "C" trillium_status trillium_prefix_cache_record_events(trillium_prefix_cache* cache, int on) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (cache == nullptr) return call.invalid("null cache");
    cache->tree.set_record_events(on != 0);
    return TRILLIUM_OK;
  });
}

extern "C" trillium_status trillium_prefix_cache_journal_cached(trillium_prefix_cache* cache) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (cache == nullptr) return call.invalid("null cache");
    cache->tree.journal_cached();
    return TRILLIUM_OK;
  });
}

extern "C" trillium_status trillium_prefix_cache_take_events(trillium_prefix_cache* cache,
                                                             const trillium_cache_event** out_events,
                                                             size_t* out_count) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (cache == nullptr || out_events == nullptr || out_count == nullptr) {
      return call.invalid("null cache or outputs");
    }
    cache->taken = cache->tree.take_events();
    cache->views.clear();
    cache->views.reserve(cache->taken.size());
    for (const trillium::CacheEvent& e : cache->taken) {
      trillium_cache_event v{};
      v.kind = e.kind == trillium::CacheEvent::Kind::kStored ? TRILLIUM_CACHE_EVENT_STORED : TRILLIUM_CACHE_EVENT_REMOVED;
      v.ns = e.ns;
      v.block_ids = e.block_ids.data();
      v.num_blocks = e.block_ids.size();
      v.parent_block_id = e.parent_block_id;
      v.tokens = e.tokens.empty() ? nullptr : e.tokens.data();
      v.num_tokens = e.tokens.size();
      cache->views.push_back(v);
    }
    *out_events = cache->views.data();
    *out_count = cache->views.size();
    return TRILLIUM_OK;
  });
}

// ------------------------------------------------------------------------------------ kernels

extern "C" const char* trillium_kernel_isa(void) noexcept {
  try {
    return trillium::kernel_isa_name(trillium::kernel_isa());
  } catch (...) {  // detection has nothing that throws today; the boundary holds regardless
    return "portable";
  }
}

extern "C" trillium_status trillium_set_kernel_isa(const char* name) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (name == nullptr) return call.invalid("name is null");
    trillium::KernelIsa isa;
    const trillium_status st = call.result(trillium::parse_kernel_isa(name, &isa));
    return st != TRILLIUM_OK ? st : call.result(trillium::set_kernel_isa(isa));
  });
}

extern "C" trillium_status trillium_store_kv(const trillium_kv_store_args* args) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (args == nullptr) return call.invalid("args is null");
    trillium::KVStoreArgs a;
    a.key = args->key;
    a.value = args->value;
    a.key_stride_token = args->key_stride_token;
    a.key_stride_head = args->key_stride_head;
    a.value_stride_token = args->value_stride_token;
    a.value_stride_head = args->value_stride_head;
    a.src_dtype = dtype(args->src_dtype);
    a.k_cache = args->k_cache;
    a.v_cache = args->v_cache;
    a.cache_dtype = dtype(args->cache_dtype);
    a.num_blocks = args->num_blocks;
    a.block_size = args->block_size;
    a.num_kv_heads = args->num_kv_heads;
    a.head_dim = args->head_dim;
    a.slot_mapping = args->slot_mapping;
    a.num_tokens = args->num_tokens;
    a.num_threads = args->num_threads;
    return call.result(trillium::store_kv(a));
  });
}

namespace {

trillium::PagedAttentionArgs to_cpp(const trillium_paged_attention_args& c) {
  trillium::PagedAttentionArgs a;
  a.query = c.query;
  a.query_stride_token = c.query_stride_token;
  a.query_stride_head = c.query_stride_head;
  a.query_dtype = dtype(c.query_dtype);
  a.out = c.out;
  a.out_stride_token = c.out_stride_token;
  a.out_stride_head = c.out_stride_head;
  a.out_dtype = dtype(c.out_dtype);
  a.k_cache = c.k_cache;
  a.v_cache = c.v_cache;
  a.kv_dtype = dtype(c.kv_dtype);
  a.num_blocks = c.num_blocks;
  a.block_size = c.block_size;
  a.num_kv_heads = c.num_kv_heads;
  a.head_dim = c.head_dim;
  a.num_q_heads = c.num_q_heads;
  a.num_requests = c.num_requests;
  a.num_tokens = c.num_tokens;
  a.query_start_loc = c.query_start_loc;
  a.context_lens = c.context_lens;
  a.block_tables = c.block_tables;
  a.block_table_stride = c.block_table_stride;
  a.scale = c.scale;
  a.window = c.window;
  a.softcap = c.softcap;
  a.num_threads = c.num_threads;
  return a;
}

}  // namespace

extern "C" trillium_status trillium_paged_attention_decode(const trillium_paged_attention_args* args) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (args == nullptr) return call.invalid("args is null");
    return call.result(trillium::paged_attention_decode(to_cpp(*args)));
  });
}

extern "C" trillium_status trillium_paged_attention_extend(const trillium_paged_attention_args* args) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (args == nullptr) return call.invalid("args is null");
    return call.result(trillium::paged_attention_extend(to_cpp(*args)));
  });
}

extern "C" trillium_status trillium_apply_token_bitmask(const trillium_token_bitmask_args* args) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (args == nullptr) return call.invalid("args is null");
    trillium::TokenBitmaskArgs a;
    a.logits = args->logits;
    a.logits_dtype = dtype(args->logits_dtype);
    a.logits_stride = args->logits_stride;
    a.num_rows = args->num_rows;
    a.vocab_size = args->vocab_size;
    a.bitmask = args->bitmask;
    a.bitmask_stride = args->bitmask_stride;
    a.num_mask_rows = args->num_mask_rows;
    a.num_words = args->num_words;
    a.mask_rows = args->mask_rows;
    return call.result(trillium::apply_token_bitmask(a));
  });
}

extern "C" trillium_status trillium_spec_verify(const trillium_spec_verify_args* args) noexcept {
  return guarded(__func__, [&](const Call& call) {
    if (args == nullptr) return call.invalid("args is null");
    trillium::SpecVerifyArgs a;
    a.num_requests = args->num_requests;
    a.max_draft = args->max_draft;
    a.vocab_size = args->vocab_size;
    a.target = args->target;
    a.target_stride_request = args->target_stride_request;
    a.target_stride_position = args->target_stride_position;
    a.draft_tokens = args->draft_tokens;
    a.draft_tokens_int64 = args->draft_tokens_int64;
    a.num_draft = args->num_draft;
    a.modes = args->modes;
    a.draft_probs = args->draft_probs;
    a.draft_probs_stride_request = args->draft_probs_stride_request;
    a.draft_probs_stride_position = args->draft_probs_stride_position;
    a.uniforms = args->uniforms;
    a.residual_uniforms = args->residual_uniforms;
    a.num_accepted = args->num_accepted;
    a.output_tokens = args->output_tokens;
    a.num_threads = args->num_threads;
    return call.result(trillium::spec_verify(a));
  });
}
