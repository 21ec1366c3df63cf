// Unit tests for the CPU paged-attention kernels (trillium/kernels/paged_attention.h) against a
// naive double-precision loop, on every ISA this machine runs, fp32 and bf16, with fresh random
// shapes each run (the seed is printed on failure). Plain ctest executable, see check.h.
#include "trillium/kernels/paged_attention.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "attention_problem.h"
#include "check.h"
#include "trillium/cpu_isa.h"

using trillium::DType;
using trillium::KernelIsa;
using trillium::test::Problem;

namespace {

double tolerance(DType t) { return t == DType::kF32 ? 1e-4 : 2e-2; }

bool run_case(std::mt19937& rng, const std::vector<std::pair<int32_t, int32_t>>& lens, bool decode, DType dtype,
              int threads, const char* what) {
  std::uniform_int_distribution<int> pick(0, 1);
  const int32_t kv_heads = 1 + pick(rng), group = std::vector<int32_t>{1, 3, 4, 8}[rng() % 4];
  const int32_t head_dim = pick(rng) ? 64 : 128, block_size = pick(rng) ? 16 : 32;
  Problem p(rng, lens, kv_heads, group, head_dim, block_size, dtype);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  trillium::PagedAttentionArgs a = p.args(scale);
  a.num_threads = threads;
  const trillium::Status st = decode ? paged_attention_decode(a) : paged_attention_extend(a);
  CHECK_OK(st);
  const double err = p.relative_error(p.reference(scale));
  if (!(err < tolerance(dtype))) {
    std::fprintf(stderr, "%s [%s, %s, %d threads]: relative error %g (Hkv %d, G %d, D %d, bs %d, R %zu)\n", what,
                 kernel_isa_name(trillium::kernel_isa()), dtype_name(dtype), threads, err, kv_heads, group, head_dim,
                 block_size, lens.size());
    ++trillium::test::failures();
    return false;
  }
  return true;
}

void test_decode_and_extend_random(uint32_t seed) {
  std::mt19937 rng(seed);
  for (KernelIsa isa : trillium::kAllKernelIsas) {
    if (!trillium::kernel_isa_supported(isa)) continue;
    CHECK_OK(trillium::set_kernel_isa(isa));
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      // Decode: ragged contexts, some not block multiples, one long enough to be split.
      std::vector<std::pair<int32_t, int32_t>> decode;
      const int batch = 1 + static_cast<int>(rng() % 6);
      for (int r = 0; r < batch; ++r) decode.push_back({1 + static_cast<int32_t>(rng() % 700), 1});
      decode.push_back({1500 + static_cast<int32_t>(rng() % 600), 1});
      for (int threads : {1, 3}) {
        if (!run_case(rng, decode, true, dtype, threads, "decode")) std::fprintf(stderr, "seed %u\n", seed);
      }
      // Extend: fresh prefill, chunk on a cached prefix, a decode row, mixed in one call.
      const std::vector<std::pair<int32_t, int32_t>> extend = {
          {1 + static_cast<int32_t>(rng() % 90), 0},
          {200 + static_cast<int32_t>(rng() % 300), 1 + static_cast<int32_t>(rng() % 150)},
          {1 + static_cast<int32_t>(rng() % 500), 1},
          {40, 40},
          {17, 0}};
      std::vector<std::pair<int32_t, int32_t>> fixed = extend;
      for (auto& [ctx, qlen] : fixed) qlen = qlen == 0 ? ctx : qlen;  // 0 above means "all new"
      fixed.push_back({25, 0});  // a request with no new token this step: skipped
      if (!run_case(rng, fixed, false, dtype, 2, "extend")) std::fprintf(stderr, "seed %u\n", seed);
    }
  }
  CHECK_OK(trillium::set_kernel_isa(KernelIsa::kPortable));
}

void test_rejects_bad_input() {
  std::mt19937 rng(1);
  Problem p(rng, {{20, 1}}, 1, 2, 64, 16, DType::kF32);
  trillium::PagedAttentionArgs a = p.args(0.125f);
  const float before = p.out.at(0);
  const int32_t saved = p.block_tables[1];
  p.block_tables[1] = p.num_blocks;  // out of range
  CHECK(paged_attention_decode(a).code() == trillium::StatusCode::kInvalidArgument);
  CHECK(std::isnan(before) && std::isnan(p.out.at(0)));  // nothing written
  p.block_tables[1] = saved;
  trillium::PagedAttentionArgs bad = a;
  bad.head_dim = 24;
  CHECK(paged_attention_decode(bad).code() == trillium::StatusCode::kInvalidArgument);
  bad = a;
  bad.num_q_heads = 3;  // not a multiple of num_kv_heads
  bad.num_kv_heads = 2;
  CHECK(paged_attention_decode(bad).code() == trillium::StatusCode::kInvalidArgument);
  bad = a;
  bad.num_tokens = 2;  // decode needs one token per request
  CHECK(paged_attention_decode(bad).code() == trillium::StatusCode::kInvalidArgument);
  bad = a;
  p.context_lens[0] = 40;  // more than the 2-block table holds
  CHECK(paged_attention_extend(bad).code() == trillium::StatusCode::kInvalidArgument);
  p.context_lens[0] = 20;
  bad = a;
  bad.kv_dtype = static_cast<DType>(7);
  CHECK(paged_attention_extend(bad).code() == trillium::StatusCode::kInvalidArgument);
  CHECK_OK(paged_attention_decode(a));
  CHECK(!std::isnan(p.out.at(0)));
}

}  // namespace

int main() {
  const uint32_t seed = std::random_device{}();
  test_decode_and_extend_random(seed);
  test_rejects_bad_input();
  return trillium::test::test_exit_code();
}
