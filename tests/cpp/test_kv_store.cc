// Unit tests for trillium::store_kv: exactly the named slots change, dtype conversion rounds to
// nearest even, negative slots are skipped, a bad slot writes nothing. Plain ctest executable.
#include "trillium/kernels/kv_store.h"

#include <cstdint>
#include <random>
#include <vector>

#include "check.h"

using trillium::bf16_t;
using trillium::DType;

namespace {

void test_f32_to_bf16_slots() {
  constexpr int32_t kBlocks = 4, kBs = 16, kH = 2, kD = 64, kTokens = 5;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  // Source rows as views of a fused [T, 3 * H, D] projection: token stride 3 * H * D.
  std::vector<float> fused(static_cast<size_t>(kTokens) * 3 * kH * kD);
  for (float& x : fused) x = normal(rng);
  const bf16_t poison = trillium::f32_to_bf16(-7.0f);
  std::vector<bf16_t> k(static_cast<size_t>(kBlocks) * kBs * kH * kD, poison), v = k;
  const std::vector<int64_t> slots = {3, -1, kBs + 2, 63, 40};  // token 1 is padding

  trillium::KVStoreArgs a;
  a.key = fused.data() + kH * kD;
  a.value = fused.data() + 2 * kH * kD;
  a.key_stride_token = a.value_stride_token = 3 * kH * kD;
  a.key_stride_head = a.value_stride_head = kD;
  a.src_dtype = DType::kF32;
  a.k_cache = k.data();
  a.v_cache = v.data();
  a.cache_dtype = DType::kBF16;
  a.num_blocks = kBlocks;
  a.block_size = kBs;
  a.num_kv_heads = kH;
  a.head_dim = kD;
  a.slot_mapping = slots.data();
  a.num_tokens = kTokens;
  a.num_threads = 2;
  CHECK_OK(trillium::store_kv(a));

  std::vector<int> written(static_cast<size_t>(kBlocks) * kBs, -1);
  for (int t = 0; t < kTokens; ++t)
    if (slots[t] >= 0) written[slots[t]] = t;
  for (int64_t s = 0; s < kBlocks * kBs; ++s) {
    for (int i = 0; i < kH * kD; ++i) {
      const size_t at = s * kH * kD + i;
      if (written[s] < 0) {
        CHECK(k[at].bits == poison.bits && v[at].bits == poison.bits);
      } else {
        const size_t src = static_cast<size_t>(written[s]) * 3 * kH * kD + i;
        CHECK(k[at].bits == trillium::f32_to_bf16(fused[src + kH * kD]).bits);
        CHECK(v[at].bits == trillium::f32_to_bf16(fused[src + 2 * kH * kD]).bits);
      }
    }
  }

  // A slot past the pool: kInvalidArgument and nothing written, even for the good tokens before it.
  std::vector<bf16_t> k2(k.size(), poison), v2 = k2;
  const std::vector<int64_t> bad = {0, 1, kBlocks * kBs, 2, 3};
  a.k_cache = k2.data();
  a.v_cache = v2.data();
  a.slot_mapping = bad.data();
  CHECK(trillium::store_kv(a).code() == trillium::StatusCode::kInvalidArgument);
  for (size_t i = 0; i < k2.size(); ++i) CHECK(k2[i].bits == poison.bits && v2[i].bits == poison.bits);
}

void test_rounding() {
  // bf16 round to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> 1 (even mantissa).
  CHECK(trillium::f32_to_bf16(1.0f + 1.0f / 256).bits == trillium::f32_to_bf16(1.0f).bits);
  CHECK(trillium::f32_to_bf16(1.0f + 3.0f / 256).bits == 0x3f82);  // tie -> up to even
  CHECK(trillium::bf16_to_f32(trillium::f32_to_bf16(-2.5f)) == -2.5f);
  const float nan = trillium::bf16_to_f32(trillium::f32_to_bf16(__builtin_nanf("")));
  CHECK(nan != nan);
}

}  // namespace

int main() {
  test_f32_to_bf16_slots();
  test_rounding();
  return trillium::test::test_exit_code();
}
