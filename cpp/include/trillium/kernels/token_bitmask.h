// Token bitmask application: structured output's per-step constraint on the logits.
//
// A bitmask row holds one bit per vocabulary token, packed little-endian into int32 words:
// token t is allowed iff bit (t % 32) of word (t / 32) is 1 -- the layout llguidance and vLLM
// use, so a grammar engine fills the mask straight into the buffer this kernel reads. Every
// logit of a disallowed token becomes -inf; allowed logits are left untouched (so a softmax
// afterwards is the model's distribution renormalized over the allowed tokens). Tokens at or
// beyond 32 * num_words (a mask narrower than the logits) are disallowed.
//
// Framework-free: raw pointers, sizes and strides in elements. The same struct drives the CPU
// kernel below and the CUDA launcher (cuda/launchers.h), with device pointers there.
#pragma once

#include <cstdint>
#include <string>

#include "trillium/kernels/dtype.h"
#include "trillium/status.h"

namespace trillium {

//   logits  [num_rows, vocab_size]        (row stride logits_stride, float32 or bfloat16; in/out)
//   bitmask [num_mask_rows, num_words]    (row stride bitmask_stride, int32)
//   mask_rows [num_rows] int32 or null:   logits row r takes bitmask row mask_rows[r]; -1 leaves
//                                         row r unmasked. null means row r takes bitmask row r.
struct TokenBitmaskArgs {
  void* logits = nullptr;
  DType logits_dtype = DType::kF32;
  int64_t logits_stride = 0;
  int64_t num_rows = 0;
  int64_t vocab_size = 0;
  const int32_t* bitmask = nullptr;
  int64_t bitmask_stride = 0;
  int64_t num_mask_rows = 0;
  int64_t num_words = 0;
  const int32_t* mask_rows = nullptr;
};

// Checks sizes and strides (and, on the CPU, every mask_rows entry) before writing anything:
// InvalidArgument with nothing changed on a bad value.
Status apply_token_bitmask(const TokenBitmaskArgs& args);

// Host-side checks of the sizes and pointers (not of mask_rows contents), shared by the CPU
// kernel and the CUDA launcher; inline so that the CUDA module needs no link to the core.
inline Status check_token_bitmask_args(const TokenBitmaskArgs& a) {
  if (a.num_rows < 0 || a.vocab_size < 0 || a.num_words < 0 || a.num_mask_rows < 0) {
    return Status::InvalidArgument("apply_token_bitmask: sizes must be >= 0");
  }
  if (!valid_dtype(a.logits_dtype)) return Status::InvalidArgument("apply_token_bitmask: unknown logits dtype");
  if (a.num_rows == 0 || a.vocab_size == 0) return Status::Ok();
  if (a.logits == nullptr || (a.bitmask == nullptr && a.num_mask_rows > 0)) {
    return Status::InvalidArgument("apply_token_bitmask: null logits or bitmask pointer");
  }
  if (a.logits_stride < a.vocab_size) {
    return Status::InvalidArgument("apply_token_bitmask: logits_stride " + std::to_string(a.logits_stride) +
                                   " is smaller than vocab_size " + std::to_string(a.vocab_size));
  }
  if (a.bitmask_stride < a.num_words) {
    return Status::InvalidArgument("apply_token_bitmask: bitmask_stride is smaller than num_words");
  }
  if (a.mask_rows == nullptr && a.num_mask_rows < a.num_rows) {
    return Status::InvalidArgument("apply_token_bitmask: without mask_rows the bitmask needs a row per logits row");
  }
  return Status::Ok();
}

}  // namespace trillium
