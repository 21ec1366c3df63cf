// CPU token-bitmask application (trillium/kernels/token_bitmask.h). Word-at-a-time: a word of
// all ones (the common case under a loose grammar) is skipped; any other word is a branchless
// select over its 32 logits (see LogitBits). The cost is
// O(num_rows * vocab / 32) word reads plus the writes, a few microseconds per row for a 50k
// vocabulary, so it runs on the calling thread (no OpenMP: the step's other work is elsewhere).
#include "trillium/kernels/token_bitmask.h"

#include <cstring>
#include <string>

namespace trillium {
namespace {

// Logits are rewritten through their bit patterns (same-size unsigned integers): a whole
// 32-token word is then a branchless select against per-lane constants, which the compiler
// vectorizes with baseline SSE2 (AND, compare, blend). Inside a JSON string most words are
// mixed, and a branch per bit would mispredict on every other token.
template <typename T>
struct LogitBits;
template <>
struct LogitBits<float> {
  using Bits = uint32_t;
  static constexpr Bits kNegInf = 0xff800000u;
};
template <>
struct LogitBits<bf16_t> {
  using Bits = uint16_t;
  static constexpr Bits kNegInf = 0xff80u;
};

template <typename T>
void mask_row(T* row, const int32_t* words, int64_t num_words, int64_t vocab) {
  using Bits = typename LogitBits<T>::Bits;
  static_assert(sizeof(Bits) == sizeof(T), "logit and its bit pattern differ in size");
  constexpr Bits kInf = LogitBits<T>::kNegInf;
  const int64_t covered = num_words * 32 < vocab ? num_words * 32 : vocab;
  for (int64_t w = 0; w * 32 < covered; ++w) {
    const uint32_t bits = static_cast<uint32_t>(words[w]);
    if (bits == 0xffffffffu) continue;
    const int64_t begin = w * 32;
    const int n = static_cast<int>((begin + 32 < covered ? begin + 32 : covered) - begin);
    Bits lanes[32];
    if (bits == 0) {  // the common word under a tight grammar: nothing allowed, nothing to read
      for (int i = 0; i < n; ++i) lanes[i] = kInf;
      std::memcpy(row + begin, lanes, n * sizeof(Bits));
      continue;
    }
    std::memcpy(lanes, row + begin, n * sizeof(Bits));
    if (n == 32) {
      for (int i = 0; i < 32; ++i) {
        const Bits keep = static_cast<Bits>(0) - static_cast<Bits>((bits & (1u << i)) != 0);
        lanes[i] = static_cast<Bits>((lanes[i] & keep) | (kInf & ~keep));
      }
    } else {
      for (int i = 0; i < n; ++i) {
        if ((bits & (1u << i)) == 0) lanes[i] = kInf;
      }
    }
    std::memcpy(row + begin, lanes, n * sizeof(Bits));
  }
  const Bits inf = kInf;
  for (int64_t t = covered; t < vocab; ++t) std::memcpy(row + t, &inf, sizeof(Bits));  // beyond the mask
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
