// Launchers for the CUDA kernels in this directory. Framework-free: raw device pointers, sizes,
// strides and a stream in, a cudaError_t out; asynchronous on `stream`.
//
// The attention and KV-store launchers take the same argument structs as the CPU kernels
// (cpp/include/trillium/kernels/), with device pointers (num_threads is ignored). They validate
// what the host knows (dtypes, sizes, head_dim, null pointers) and return cudaErrorInvalidValue;
// device-resident metadata is trusted, except that a slot or block id outside the pool is never
// dereferenced (store_kv skips the token; attention reads zeros for that block).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "trillium/kernels/kv_store.h"
#include "trillium/kernels/paged_attention.h"
#include "trillium/kernels/spec_verify.h"
#include "trillium/kernels/token_bitmask.h"

namespace trillium::cuda {

// Sets ptr[0..n) = value on `stream`. Asynchronous; returns the launch error (cudaSuccess when
// n == 0). ptr must be device (or managed) memory holding at least n floats.
cudaError_t fill_f32(float* ptr, int64_t n, float value, cudaStream_t stream);

// store_kv (see kv_store.h): one CTA per token. Negative slots are skipped.
cudaError_t store_kv(const KVStoreArgs& args, cudaStream_t stream);

// Paged attention, decode and extend in one kernel (see paged_attention.h for the layout and
// causality): a CTA per (tile of kRowsPerCta query rows, KV head, request); query rows are
// (token, head-in-group) pairs, so grouped-query heads share every K/V chunk the CTA stages in
// shared memory. query_start_loc is required (decode: 0, 1, ..., R). max_query_len bounds the
// grid (any upper bound of the per-request query lengths works). head_dim must be 64, 128 or 256.
cudaError_t paged_attention(const PagedAttentionArgs& args, int32_t max_query_len, cudaStream_t stream);

// Decode steps over a bf16 pool: split-KV paged attention (paged_attention_decode.cu), reading
// K/V at close to the GPU's memory bandwidth. A plan is made on the host from sizes alone:
// `max_context_len` bounds every request's context (CTAs past a request's context exit at once;
// a captured graph passes the longest context it may ever see) and `num_sms` is the GPU's
// multiprocessor count. `supported` is false where the kernel does not apply (fp32 KV, other
// head dims or group sizes, a window, soft-capping, more than one token per request): use
// paged_attention then. With more than one split the launch needs `workspace_bytes` of device
// scratch, used only during the launch's own stream order.
constexpr int32_t kMaxDecodeSplit = 512;  // tokens per split at most (shared memory)
struct DecodePlan {
  bool supported = false;
  int32_t split = 0;   // keys per split, a multiple of the block size
  int32_t splits = 0;  // splits of the longest context
  size_t workspace_bytes = 0;
};
DecodePlan plan_paged_attention_decode(const PagedAttentionArgs& args, int32_t max_context_len, int32_t num_sms);
cudaError_t paged_attention_decode(const PagedAttentionArgs& args, const DecodePlan& plan, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream);

// apply_token_bitmask (see token_bitmask.h): a thread per logit, a grid row per logits row.
// Device-resident mask_rows entries are trusted, except that an id outside [0, num_mask_rows)
// leaves its row unmasked rather than reading out of bounds.
cudaError_t apply_token_bitmask(const TokenBitmaskArgs& args, cudaStream_t stream);

// spec_verify (see spec_verify.h): a block per request. Host-known sizes and pointers are checked
// (cudaErrorInvalidValue); per-request values are device-resident, so a request failing the CPU
// kernel's checks gets num_accepted = -1 and an all -1 output row instead of an error.
cudaError_t spec_verify(const SpecVerifyArgs& args, cudaStream_t stream);

}  // namespace trillium::cuda
