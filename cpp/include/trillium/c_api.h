/* trillium C API: a stable, exception-free C ABI over the C++ core, for hosts that are not C++
 * (C programs, FFI from Rust, Go, Zig, ctypes) or C++ hosts that want one ABI across compilers.
 *
 * A thin layer: each function makes one call into trillium/block_allocator.h, radix_tree.h or a
 * kernels/ header and maps its result. Those headers hold the full semantics; this one holds the
 * contracts a C caller needs. Valid C11 and C++17; no C++ type crosses it, no exception escapes.
 *
 * Errors. Every fallible function returns a trillium_status. TRILLIUM_OK (0) is success; any other
 * code means the call failed, and unless a function says otherwise it changed nothing and wrote no
 * output. trillium_last_error() then names the function and the bad value. Query functions that
 * return a count return -1 for a null handle (and set the message).
 *
 * Ownership. *_create() hands the caller a handle that it destroys exactly once with the matching
 * *_destroy(); the library never keeps a caller pointer beyond the call (kernel arguments
 * included). A prefix cache holds on to the allocator it was created over: destroy every cache
 * before its allocator (trillium_block_allocator_destroy refuses otherwise). Using a handle after
 * destroying it is undefined behaviour, as in any C API.
 *
 * Threads. A handle is not thread-safe: the calls on one allocator and on every prefix cache over
 * it must be serialized by the caller (one mutex per allocator is enough; the cache mutates the
 * allocator). Different allocators may be used on different threads. The kernels keep no state
 * and may run concurrently on different buffers; each call may itself use OpenMP threads.
 *
 * Compatibility. trillium_abi_version() changes only when an existing function, struct layout or
 * enum value changes; new functions keep it. Compare it with TRILLIUM_ABI_VERSION at start-up.
 */
#ifndef TRILLIUM_C_API_H_
#define TRILLIUM_C_API_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TRILLIUM_ABI_VERSION 1

/* The shared library exports only trillium_* and trillium:: (cpp/trillium.map); this keeps the
 * C API visible in builds that hide symbols by default. */
#if defined(__GNUC__)
#define TRILLIUM_API __attribute__((visibility("default")))
#else
#define TRILLIUM_API
#endif

/* C++ callers see the no-throw guarantee in the type; the definitions catch everything. */
#ifdef __cplusplus
#define TRILLIUM_NOEXCEPT noexcept
extern "C" {
#else
#define TRILLIUM_NOEXCEPT
#endif

/* ------------------------------------------------------------------------------------ errors */

/* Values 0..3 are trillium::StatusCode's; the rest arise at this boundary only. */
typedef enum trillium_status {
  TRILLIUM_OK = 0,
  TRILLIUM_INVALID_ARGUMENT = 1, /* a bad value from the caller (null handle, bad id, bad size) */
  TRILLIUM_OUT_OF_BLOCKS = 2,    /* not enough free blocks; nothing was changed */
  TRILLIUM_INTERNAL = 3,         /* an invariant of the core does not hold: a bug in trillium */
  TRILLIUM_OUT_OF_MEMORY = 4     /* a host allocation failed (std::bad_alloc) */
} trillium_status;

/* The message of the last call that failed on the calling thread, "" if none has. Never null.
 * Successful calls leave it alone (like errno). The pointer stays valid until the next failing
 * call on this thread; copy the text to keep it. Messages are for people: match on the code. */
TRILLIUM_API const char* trillium_last_error(void) TRILLIUM_NOEXCEPT;

/* Short name of a code ("ok", "invalid argument", ...); "unknown" for other values. */
TRILLIUM_API const char* trillium_status_name(trillium_status status) TRILLIUM_NOEXCEPT;

/* The library version, "major.minor.patch" (static storage). */
TRILLIUM_API const char* trillium_version(void) TRILLIUM_NOEXCEPT;

/* The C ABI version this library implements: TRILLIUM_ABI_VERSION of the header it was built with. */
TRILLIUM_API int trillium_abi_version(void) TRILLIUM_NOEXCEPT;

/* ----------------------------------------------------------------------------- block allocator
 * Ref-counted KV block ids in [0, num_blocks); metadata only, never memory. A block is used while
 * its ref count is > 0 and free at 0. Freed blocks are reused tail-first (see block_allocator.h).
 *
 * TRILLIUM_OUT_OF_MEMORY from a mutating call other than create (an internal list could not grow)
 * may leave that call half done; treat the allocator as lost. */

typedef struct trillium_block_allocator trillium_block_allocator;

/* A new allocator with num_blocks free blocks, into *out. INVALID_ARGUMENT: num_blocks < 0 or out
 * null. OUT_OF_MEMORY: the metadata (12 bytes per block) could not be allocated. */
TRILLIUM_API trillium_status trillium_block_allocator_create(int32_t num_blocks,
                                                             trillium_block_allocator** out) TRILLIUM_NOEXCEPT;

/* Destroys an allocator (null: no-op, TRILLIUM_OK). INVALID_ARGUMENT, and nothing destroyed, while
 * a prefix cache created over it still exists. */
TRILLIUM_API trillium_status trillium_block_allocator_destroy(trillium_block_allocator* allocator) TRILLIUM_NOEXCEPT;

/* Takes n free blocks (ref count 0 -> 1) and writes their ids to out_block_ids[0, n), which the
 * caller provides (may be null when n == 0). All-or-nothing: OUT_OF_BLOCKS if fewer than n are
 * free; INVALID_ARGUMENT if n < 0 or a pointer is null. */
TRILLIUM_API trillium_status trillium_block_allocator_allocate(trillium_block_allocator* allocator, int32_t n,
                                                               int32_t* out_block_ids) TRILLIUM_NOEXCEPT;

/* Adds one reference to each listed used block (an id listed k times gains k). All-or-nothing:
 * INVALID_ARGUMENT for an id outside [0, num_blocks) or a free block. */
TRILLIUM_API trillium_status trillium_block_allocator_incref(trillium_block_allocator* allocator,
                                                             const int32_t* block_ids,
                                                             size_t num_block_ids) TRILLIUM_NOEXCEPT;

/* Drops one reference per listed id; blocks reaching 0 become free. All-or-nothing:
 * INVALID_ARGUMENT for a bad id, a free block (double free), or an id listed more times than it
 * has references. */
TRILLIUM_API trillium_status trillium_block_allocator_free(trillium_block_allocator* allocator,
                                                           const int32_t* block_ids,
                                                           size_t num_block_ids) TRILLIUM_NOEXCEPT;

/* Ref count of a block: 0 when free, -1 for an id outside [0, num_blocks) or a null allocator. */
TRILLIUM_API int32_t trillium_block_allocator_ref_count(const trillium_block_allocator* allocator,
                                                        int32_t block_id) TRILLIUM_NOEXCEPT;

/* Free / total block counts; -1 for a null allocator. */
TRILLIUM_API int32_t trillium_block_allocator_num_free(const trillium_block_allocator* allocator) TRILLIUM_NOEXCEPT;
TRILLIUM_API int32_t trillium_block_allocator_num_total(const trillium_block_allocator* allocator) TRILLIUM_NOEXCEPT;

/* O(num_blocks) self-check. INTERNAL naming the first violated invariant (a bug in trillium). */
TRILLIUM_API trillium_status trillium_block_allocator_check_invariants(
    const trillium_block_allocator* allocator) TRILLIUM_NOEXCEPT;

/* -------------------------------------------------------------------------------- prefix cache
 * The radix tree of radix_tree.h: token prefixes, whole blocks of block_size tokens, each naming
 * the KV block that holds them. Namespaces (a caller hash of model + adapter + tenant) never share
 * nodes. The cache holds exactly one allocator reference per block it caches: insert increfs,
 * evict and clear (and destroy) free.
 *
 * A node handle names the deepest node of a match. It stays valid while the node exists; the
 * node can only be removed by evict/clear while unlocked, after which lock/unlock reject the
 * handle. Handle 0 (TRILLIUM_NULL_NODE_HANDLE) means "nothing matched"; locking it is a no-op. */

typedef struct trillium_prefix_cache trillium_prefix_cache;
typedef uint64_t trillium_node_handle;
#define TRILLIUM_NULL_NODE_HANDLE ((trillium_node_handle)0)

/* Cumulative counters, never reset (clear keeps them). */
typedef struct trillium_prefix_cache_stats {
  uint64_t num_queries;         /* match calls */
  uint64_t num_query_tokens;    /* tokens passed to match, partial blocks included */
  uint64_t num_hit_tokens;      /* tokens match found cached */
  uint64_t num_inserted_blocks; /* blocks insert adopted */
  uint64_t num_evicted_blocks;  /* blocks evict or clear dropped */
} trillium_prefix_cache_stats;

/* A new, empty cache over allocator, into *out; the allocator must outlive it. INVALID_ARGUMENT:
 * null allocator or out, block_size < 1. */
TRILLIUM_API trillium_status trillium_prefix_cache_create(trillium_block_allocator* allocator, int32_t block_size,
                                                          trillium_prefix_cache** out) TRILLIUM_NOEXCEPT;

/* Destroys a cache (null: no-op), freeing its reference on every block it caches. Blocks that
 * requests still reference stay allocated. */
TRILLIUM_API void trillium_prefix_cache_destroy(trillium_prefix_cache* cache) TRILLIUM_NOEXCEPT;

/* The longest cached prefix of tokens[0, num_tokens) in namespace ns, in whole blocks. Writes
 * *out_num_tokens (matched tokens, a multiple of block_size; the matched block count is that /
 * block_size), the blocks' ids to out_block_ids[0, matched blocks) unless out_block_ids is null,
 * and *out_handle (TRILLIUM_NULL_NODE_HANDLE when nothing matched). out_block_ids, when given,
 * must hold num_tokens / block_size ids (the most a match can return; block_ids_capacity says
 * how many it holds). Takes no reference and no lock: lock the handle right away to keep the
 * blocks. INVALID_ARGUMENT: null cache or outputs, tokens null with num_tokens > 0, capacity too
 * small. Updates LRU time and may split a node (the cached content does not change). */
TRILLIUM_API trillium_status trillium_prefix_cache_match(trillium_prefix_cache* cache, uint64_t ns,
                                                         const int32_t* tokens, size_t num_tokens,
                                                         int32_t* out_block_ids, size_t block_ids_capacity,
                                                         int32_t* out_num_tokens,
                                                         trillium_node_handle* out_handle) TRILLIUM_NOEXCEPT;

/* What insert did: the suffix blocks the cache adopted (incref'd), and how many caller blocks
 * were duplicates (a position already cached under another block id; the cache keeps its own). */
typedef struct trillium_prefix_cache_insert_result {
  int32_t num_new_blocks;
  int32_t num_duplicate_blocks;
} trillium_prefix_cache_insert_result;

/* Caches the full blocks of tokens[0, num_tokens): n = num_tokens / block_size blocks, block_ids[i]
 * holding tokens [i*bs, (i+1)*bs), so num_block_ids >= n (extra ids are ignored). The caller keeps
 * its own references. The duplicate caller ids are written to out_duplicate_block_ids unless it is
 * null; when given it must hold n ids (duplicate_capacity). out_result may be null. All-or-nothing
 * INVALID_ARGUMENT: null cache, too few ids or capacity, a new-suffix block that is out of range,
 * free, listed twice or cached elsewhere. */
TRILLIUM_API trillium_status trillium_prefix_cache_insert(
    trillium_prefix_cache* cache, uint64_t ns, const int32_t* tokens, size_t num_tokens, const int32_t* block_ids,
    size_t num_block_ids, int32_t* out_duplicate_block_ids, size_t duplicate_capacity,
    trillium_prefix_cache_insert_result* out_result) TRILLIUM_NOEXCEPT;

/* +1 / -1 on the lock count of the handle's node and all its ancestors; a locked node is never
 * evicted. Null handle: no-op. INVALID_ARGUMENT (no change): null cache, stale handle, or unlock of
 * a node that is not locked. */
TRILLIUM_API trillium_status trillium_prefix_cache_lock(trillium_prefix_cache* cache,
                                                        trillium_node_handle handle) TRILLIUM_NOEXCEPT;
TRILLIUM_API trillium_status trillium_prefix_cache_unlock(trillium_prefix_cache* cache,
                                                          trillium_node_handle handle) TRILLIUM_NOEXCEPT;

/* Frees up to num_blocks cached blocks, least recently used unlocked leaves first, tails first;
 * skips blocks a request still references. *out_num_freed = blocks returned to the free list
 * (fewer when nothing else is evictable). INVALID_ARGUMENT: null cache or out, num_blocks < 0. */
TRILLIUM_API trillium_status trillium_prefix_cache_evict(trillium_prefix_cache* cache, int32_t num_blocks,
                                                         int32_t* out_num_freed) TRILLIUM_NOEXCEPT;

/* Drops every unlocked node; *out_num_dropped = blocks the cache let go of (null: not written). */
TRILLIUM_API trillium_status trillium_prefix_cache_clear(trillium_prefix_cache* cache,
                                                         int32_t* out_num_dropped) TRILLIUM_NOEXCEPT;

/* Counts; -1 for a null cache. num_evictable_blocks is what evict(infinity) would free, O(nodes);
 * num_nodes counts namespace roots. */
TRILLIUM_API int32_t trillium_prefix_cache_block_size(const trillium_prefix_cache* cache) TRILLIUM_NOEXCEPT;
TRILLIUM_API int32_t trillium_prefix_cache_num_cached_blocks(const trillium_prefix_cache* cache) TRILLIUM_NOEXCEPT;
TRILLIUM_API int32_t trillium_prefix_cache_num_evictable_blocks(const trillium_prefix_cache* cache) TRILLIUM_NOEXCEPT;
TRILLIUM_API int32_t trillium_prefix_cache_num_nodes(const trillium_prefix_cache* cache) TRILLIUM_NOEXCEPT;
TRILLIUM_API int32_t trillium_prefix_cache_num_namespaces(const trillium_prefix_cache* cache) TRILLIUM_NOEXCEPT;

/* Copies the counters into *out. INVALID_ARGUMENT: null cache or out. */
TRILLIUM_API trillium_status trillium_prefix_cache_get_stats(const trillium_prefix_cache* cache,
                                                             trillium_prefix_cache_stats* out) TRILLIUM_NOEXCEPT;

/* O(nodes + blocks) self-check of the tree, then of its allocator: INTERNAL naming the first
 * violated invariant. */
TRILLIUM_API trillium_status trillium_prefix_cache_check_invariants(const trillium_prefix_cache* cache)
    TRILLIUM_NOEXCEPT;

/* The event journal, for hosts that tell a cache-aware router what this cache holds (trillium's
 * server publishes it as vLLM's KV events). While recording, insert journals each adopted suffix
 * as one STORED event (its blocks, their tokens, and the cached block just before it, -1 at the
 * start of a sequence) and evict/clear journal each dropped tail as one REMOVED event, in order:
 * a block is always reported removed before its id can be stored again. Off by default. */
#define TRILLIUM_CACHE_EVENT_STORED 0
#define TRILLIUM_CACHE_EVENT_REMOVED 1
typedef struct trillium_cache_event {
  int32_t kind; /* TRILLIUM_CACHE_EVENT_STORED or _REMOVED */
  uint64_t ns;
  const int32_t* block_ids; /* in sequence order */
  size_t num_blocks;
  int32_t parent_block_id; /* STORED: the cached block before block_ids[0]; -1 at the start */
  const int32_t* tokens;   /* STORED: num_blocks * block_size tokens; null for REMOVED */
  size_t num_tokens;
} trillium_cache_event;

/* Journal from now on (on != 0), or stop and drop the journal (on == 0). INVALID_ARGUMENT: null
 * cache. */
TRILLIUM_API trillium_status trillium_prefix_cache_record_events(trillium_prefix_cache* cache, int on) TRILLIUM_NOEXCEPT;

/* Journals the whole cache as STORED events, parents first, after what is journalled already
 * (for a subscriber starting from an empty view). No-op unless recording. */
TRILLIUM_API trillium_status trillium_prefix_cache_journal_cached(trillium_prefix_cache* cache) TRILLIUM_NOEXCEPT;

/* Hands over the journal, oldest first, and empties it: *out_events points at *out_count events
 * owned by the cache, valid until the next take_events or destroy. INVALID_ARGUMENT: null cache
 * or outputs. */
TRILLIUM_API trillium_status trillium_prefix_cache_take_events(trillium_prefix_cache* cache,
                                                               const trillium_cache_event** out_events,
                                                               size_t* out_count) TRILLIUM_NOEXCEPT;

/* ------------------------------------------------------------------------------------ kernels
 * CPU kernels over caller memory: raw pointers, sizes, and strides counted in elements (not
 * bytes). Each validates all of its arguments before writing anything: INVALID_ARGUMENT (nothing
 * written) on a bad value, including an unknown dtype. Zero-initialize an argument struct, then
 * set its fields; fields typed int32_t "dtype" hold trillium_dtype values. */

typedef enum trillium_dtype {
  TRILLIUM_DTYPE_F32 = 0,  /* float */
  TRILLIUM_DTYPE_BF16 = 1  /* uint16_t bit patterns: the top half of an IEEE float32 */
} trillium_dtype;

/* Which instruction set the kernels run on: "portable", "avx2" or "avx512". */
TRILLIUM_API const char* trillium_kernel_isa(void) TRILLIUM_NOEXCEPT;

/* Forces the kernels onto the named instruction set, process-wide (tests, benchmarks). Call it
 * while no kernel runs. INVALID_ARGUMENT: unknown name or not supported by this CPU. */
TRILLIUM_API trillium_status trillium_set_kernel_isa(const char* name) TRILLIUM_NOEXCEPT;

/* store_kv (kernels/kv_store.h): writes this step's K and V rows into their slots of one layer's
 * paged pool. Slot = block_id * block_size + offset; a negative slot skips the token (padding),
 * any other must lie in [0, num_blocks * block_size). fp32 -> bf16 rounds to nearest even. */
typedef struct trillium_kv_store_args {
  const void* key;   /* [num_tokens, num_kv_heads, head_dim], strides (token, head), dim stride 1 */
  const void* value; /* same shape as key */
  int64_t key_stride_token, key_stride_head;
  int64_t value_stride_token, value_stride_head;
  int32_t src_dtype; /* of key and value */

  void* k_cache; /* [num_blocks, block_size, num_kv_heads, head_dim], contiguous */
  void* v_cache;
  int32_t cache_dtype;
  int32_t num_blocks, block_size, num_kv_heads, head_dim;

  const int64_t* slot_mapping; /* [num_tokens] */
  int64_t num_tokens;

  int32_t num_threads; /* 0: the OpenMP default */
} trillium_kv_store_args;

TRILLIUM_API trillium_status trillium_store_kv(const trillium_kv_store_args* args) TRILLIUM_NOEXCEPT;

/* Paged attention (kernels/paged_attention.h) for R requests whose T new tokens are flattened
 * request-major. Request r has context_lens[r] tokens in the pool, the new ones last; position p
 * lives in block block_tables[r * block_table_stride + p / block_size] at offset p % block_size.
 * Causal; query head q reads KV head q / (num_q_heads / num_kv_heads). head_dim must be a
 * multiple of 16. Softmax and accumulation in fp32. */
typedef struct trillium_paged_attention_args {
  const void* query; /* [T, num_q_heads, head_dim], strides (token, head), dim stride 1 */
  int64_t query_stride_token, query_stride_head;
  int32_t query_dtype;

  void* out; /* [T, num_q_heads, head_dim], strides (token, head), dim stride 1; written */
  int64_t out_stride_token, out_stride_head;
  int32_t out_dtype;

  const void* k_cache; /* [num_blocks, block_size, num_kv_heads, head_dim], contiguous */
  const void* v_cache;
  int32_t kv_dtype;
  int32_t num_blocks, block_size, num_kv_heads, head_dim;
  int32_t num_q_heads;

  int32_t num_requests;           /* R */
  int64_t num_tokens;             /* T; == R for decode */
  const int32_t* query_start_loc; /* [R+1], extend only: request r owns rows [start[r], start[r+1]) */
  const int32_t* context_lens;    /* [R] */
  const int32_t* block_tables;    /* [R, block_table_stride]; entries past a request's blocks unread */
  int64_t block_table_stride;

  float scale;         /* softmax scale, usually 1/sqrt(head_dim); no default, 0 is taken as given */
  int32_t window;      /* > 0: sliding window, position p sees keys (p - window, p]; 0: none */
  float softcap;       /* > 0: scores become softcap * tanh(s / softcap); 0: none */
  int32_t num_threads; /* 0: the OpenMP default */
} trillium_paged_attention_args;

/* Decode: one new token per request (row r is request r; query_start_loc unused), context_lens[r]
 * >= 1. A row's result does not depend on the batch or the thread count. */
TRILLIUM_API trillium_status trillium_paged_attention_decode(const trillium_paged_attention_args* args)
    TRILLIUM_NOEXCEPT;

/* Extend (prefill, chunked prefill, prefix reuse, mixed batches): any number of new tokens per
 * request, causal over cached prefix + new tokens; requests with no new tokens are skipped. */
TRILLIUM_API trillium_status trillium_paged_attention_extend(const trillium_paged_attention_args* args)
    TRILLIUM_NOEXCEPT;

/* Token bitmask (kernels/token_bitmask.h): token t of a row is allowed iff bit t % 32 of word
 * t / 32 of its mask row is set; every disallowed logit becomes -inf, allowed ones are untouched.
 * Tokens at or past 32 * num_words are disallowed. */
typedef struct trillium_token_bitmask_args {
  void* logits; /* [num_rows, vocab_size], row stride logits_stride; in/out */
  int32_t logits_dtype;
  int64_t logits_stride;
  int64_t num_rows;
  int64_t vocab_size;
  const int32_t* bitmask; /* [num_mask_rows, num_words], row stride bitmask_stride */
  int64_t bitmask_stride;
  int64_t num_mask_rows;
  int64_t num_words;
  const int32_t* mask_rows; /* [num_rows] mask row per logits row, -1: unmasked; null: row r uses row r */
} trillium_token_bitmask_args;

TRILLIUM_API trillium_status trillium_apply_token_bitmask(const trillium_token_bitmask_args* args)
    TRILLIUM_NOEXCEPT;

/* Speculative decoding's verify step (kernels/spec_verify.h, which defines each mode exactly).
 * Per request i with n = num_draft[i] drafts (n <= max_draft = k), writes num_accepted[i] = a and
 * output_tokens[i] = [d_0 .. d_{a-1}, next, -1 ...] (k + 1 entries). */
typedef enum trillium_spec_verify_mode {
  TRILLIUM_SPEC_GREEDY = 0,     /* accept while the draft is the target's argmax */
  TRILLIUM_SPEC_POINT_MASS = 1, /* sampled, drafts without probabilities (n-gram) */
  TRILLIUM_SPEC_DRAFT_PROBS = 2 /* sampled, lossless rejection sampling against draft_probs */
} trillium_spec_verify_mode;

#define TRILLIUM_MAX_SPEC_DRAFT_TOKENS 64

typedef struct trillium_spec_verify_args {
  int64_t num_requests; /* N */
  int64_t max_draft;    /* k, in [0, TRILLIUM_MAX_SPEC_DRAFT_TOKENS] */
  int64_t vocab_size;   /* V */
  const float* target;  /* [N, k+1, V], strides below (>= 0), rows contiguous */
  int64_t target_stride_request, target_stride_position;
  const void* draft_tokens;  /* [N, k] int32 (int64 when draft_tokens_int64), contiguous */
  bool draft_tokens_int64;
  const int32_t* num_draft;  /* [N] in [0, k] */
  const int32_t* modes;      /* [N] trillium_spec_verify_mode */
  const float* draft_probs;  /* [N, k, V]; read by DRAFT_PROBS requests with drafts */
  int64_t draft_probs_stride_request, draft_probs_stride_position;
  const double* uniforms;          /* [N, k+1] in [0, 1); null when every request is GREEDY */
  const double* residual_uniforms; /* [N] in [0, 1); read by DRAFT_PROBS requests with drafts */
  int32_t* num_accepted;           /* [N], written */
  int32_t* output_tokens;          /* [N, k+1], contiguous, written */
  int32_t num_threads;             /* 0: the OpenMP default */
} trillium_spec_verify_args;

TRILLIUM_API trillium_status trillium_spec_verify(const trillium_spec_verify_args* args) TRILLIUM_NOEXCEPT;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TRILLIUM_C_API_H_ */
