// CPU token-bitmask application (trillium/kernels/token_bitmask.h). Word-at-a-time: a word of
// all ones (the common case under a loose grammar) is skipped, a zero word clears 32 logits in
// one loop the compiler vectorizes, and only mixed words are walked bit by bit. The cost is
// O(num_rows * vocab / 32) word reads plus the writes, a few microseconds per row for a 50k
// vocabulary, so it runs on the calling thread (no OpenMP: the step's other work is elsewhere).
#include "trillium/kernels/token_bitmask.h"

#include <limits>
#include <string>

namespace trillium {
namespace {

template <typename T>
T neg_inf();
template <>
float neg_inf<float>() {
  return -std::numeric_limits<float>::infinity();
}
template <>
bf16_t neg_inf<bf16_t>() {
  return bf16_t{0xff80};
}

template <typename T>
void mask_row(T* row, const int32_t* words, int64_t num_words, int64_t vocab) {
  const T inf = neg_inf<T>();
  const int64_t covered = num_words * 32 < vocab ? num_words * 32 : vocab;
  for (int64_t w = 0; w * 32 < covered; ++w) {
    const uint32_t bits = static_cast<uint32_t>(words[w]);
    if (bits == 0xffffffffu) continue;
    const int64_t begin = w * 32;
    const int64_t end = begin + 32 < covered ? begin + 32 : covered;
    if (bits == 0) {
      for (int64_t t = begin; t < end; ++t) row[t] = inf;
      continue;
    }
    for (int64_t t = begin; t < end; ++t) {
      if (((bits >> (t - begin)) & 1u) == 0) row[t] = inf;
    }
  }
  for (int64_t t = covered; t < vocab; ++t) row[t] = inf;  // beyond the mask: never allowed
}

template <typename T>
void run(const TokenBitmaskArgs& a) {
  T* logits = static_cast<T*>(a.logits);
  for (int64_t r = 0; r < a.num_rows; ++r) {
    const int64_t m = a.mask_rows == nullptr ? r : a.mask_rows[r];
    if (m < 0) continue;
    mask_row(logits + r * a.logits_stride, a.bitmask + m * a.bitmask_stride, a.num_words, a.vocab_size);
  }
}

}  // namespace

Status apply_token_bitmask(const TokenBitmaskArgs& a) {
  Status st = check_token_bitmask_args(a);
  if (!st.ok() || a.num_rows == 0 || a.vocab_size == 0) return st;
  if (a.mask_rows != nullptr) {
    for (int64_t r = 0; r < a.num_rows; ++r) {
      if (a.mask_rows[r] >= a.num_mask_rows || a.mask_rows[r] < -1) {
        return Status::InvalidArgument("apply_token_bitmask: mask_rows[" + std::to_string(r) + "] = " +
                                       std::to_string(a.mask_rows[r]) + " is outside [-1, " +
                                       std::to_string(a.num_mask_rows) + ")");
      }
    }
  }
  if (a.logits_dtype == DType::kF32) {
    run<float>(a);
  } else {
    run<bf16_t>(a);
  }
  return Status::Ok();
}

}  // namespace trillium
