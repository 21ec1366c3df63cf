// Unit tests for trillium::apply_token_bitmask: exactly the tokens whose bit is 0 become -inf
// (float32 and bfloat16), rows with mask_rows = -1 are untouched, tokens beyond the mask's words
// are disallowed, and a bad mask row writes nothing. Plain ctest executable.
#include "trillium/kernels/token_bitmask.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "check.h"

using trillium::bf16_t;
using trillium::DType;

namespace {

bool allowed(const std::vector<int32_t>& mask, int64_t row, int64_t words, int64_t t) {
  if (t >= words * 32) return false;
  return (static_cast<uint32_t>(mask[row * words + t / 32]) >> (t % 32)) & 1u;
}

void test_f32_rows_and_skip() {
  constexpr int64_t kRows = 5, kVocab = 1000, kStride = 1003, kMaskRows = 3;
  constexpr int64_t kWords = (kVocab + 31) / 32;
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int64_t> any;
  std::vector<int32_t> mask(kMaskRows * kWords);
  for (size_t i = 0; i < mask.size(); ++i) {
    const int kind = static_cast<int>(i % 3);  // all ones, all zeros, random bits
    mask[i] = kind == 0 ? -1 : kind == 1 ? 0 : static_cast<int32_t>(any(rng));
  }
  std::vector<float> logits(kRows * kStride), before;
  std::normal_distribution<float> normal;
  for (float& x : logits) x = normal(rng);
  before = logits;
  const std::vector<int32_t> rows = {2, -1, 0, 2, 1};

  trillium::TokenBitmaskArgs a;
  a.logits = logits.data();
  a.logits_stride = kStride;
  a.num_rows = kRows;
  a.vocab_size = kVocab;
  a.bitmask = mask.data();
  a.bitmask_stride = kWords;
  a.num_mask_rows = kMaskRows;
  a.num_words = kWords;
  a.mask_rows = rows.data();
  CHECK_OK(trillium::apply_token_bitmask(a));
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t t = 0; t < kStride; ++t) {
      const float got = logits[r * kStride + t], was = before[r * kStride + t];
      if (t >= kVocab || rows[r] < 0 || allowed(mask, rows[r], kWords, t)) {
        CHECK(got == was);
      } else {
        CHECK(std::isinf(got) && got < 0);
      }
    }
  }
}

void test_bf16_and_narrow_mask() {
  constexpr int64_t kVocab = 100, kWords = 2;  // the mask covers 64 tokens: the rest are disallowed
  std::vector<int32_t> mask = {0x0f0f0f0f, -1};
  std::vector<bf16_t> logits(kVocab, trillium::f32_to_bf16(1.5f));
  trillium::TokenBitmaskArgs a;
  a.logits = logits.data();
  a.logits_dtype = DType::kBF16;
  a.logits_stride = kVocab;
  a.num_rows = 1;
  a.vocab_size = kVocab;
  a.bitmask = mask.data();
  a.bitmask_stride = kWords;
  a.num_mask_rows = 1;
  a.num_words = kWords;
  CHECK_OK(trillium::apply_token_bitmask(a));
  for (int64_t t = 0; t < kVocab; ++t) {
    const float v = trillium::bf16_to_f32(logits[t]);
    if (allowed(mask, 0, kWords, t)) {
      CHECK(v == 1.5f);
    } else {
      CHECK(std::isinf(v) && v < 0);
    }
  }
}

void test_bad_row_writes_nothing() {
  std::vector<int32_t> mask(4, 0);
  std::vector<float> logits(2 * 64, 3.0f);
  const std::vector<int32_t> rows = {0, 5};
  trillium::TokenBitmaskArgs a;
  a.logits = logits.data();
  a.logits_stride = 64;
  a.num_rows = 2;
  a.vocab_size = 64;
  a.bitmask = mask.data();
  a.bitmask_stride = 2;
  a.num_mask_rows = 2;
  a.num_words = 2;
  a.mask_rows = rows.data();
  CHECK(!trillium::apply_token_bitmask(a).ok());
  for (float x : logits) CHECK(x == 3.0f);
  a.mask_rows = nullptr;
  a.logits_stride = 10;  // smaller than the vocabulary
  CHECK(!trillium::apply_token_bitmask(a).ok());
}

}  // namespace

int main() {
  test_f32_rows_and_skip();
  test_bf16_and_narrow_mask();
  test_bad_row_writes_nothing();
  return trillium::test::test_exit_code();
}
