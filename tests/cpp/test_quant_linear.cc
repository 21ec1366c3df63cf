// trillium::quant_linear from C++ (no Python): pack random 4-, 5-, 6- and 8-bit codes, with and
// without mins, run the kernel on every ISA this CPU has, in the three activation modes (int8: 4
// and 8 bits), and compare with naive double loops (the dequantized matmul for exact mode; the
// same activation rounding for int8 mode), and bit for bit with a rounding-exact fp32 oracle for
// int16 mode; and the row lookup against the same dequantized weights.
// Plain ctest executable.
#include "trillium/kernels/quant_linear.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "check.h"
#include "trillium/cpu_isa.h"

namespace {

// Naive oracle: the kernel's activation rounding (per row and 32-block, nearest-even) in double.
std::vector<double> naive(const std::vector<float>& x, int64_t M, int64_t K, const std::vector<int8_t>& codes,
                          const std::vector<float>& scale, const std::vector<float>& mins, int64_t N) {
  const int64_t nb = K / 32;
  std::vector<double> out(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      float amax = 0.0f;
      for (int64_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[m * K + b * 32 + i]));
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      int32_t q[32];
      for (int64_t i = 0; i < 32; ++i) q[i] = static_cast<int32_t>(std::nearbyint(x[m * K + b * 32 + i] * id));
      for (int64_t n = 0; n < N; ++n) {
        double dot = 0.0, sum = 0.0;
        for (int64_t i = 0; i < 32; ++i) {
          dot += static_cast<double>(codes[n * K + b * 32 + i]) * q[i];
          sum += q[i];
        }
        out[m * N + n] += dot * d * scale[n * nb + b] + mins[n * nb + b] * d * sum;
      }
    }
  }
  return out;
}

// Rounding-exact oracle of the int16 mode (quant_linear.h, kernels/quant_linear_i16.h), written
// from the contract: x rounded per row and 32-block to int16 (max|x| / 32767, nearest-even), the
// integer dot product of each scale block exact, then acc = fma(dot, scale * sx, acc) and
// acc = fma(min, sx * sum of the scale block's codes, acc) in fp32, block after block.
std::vector<float> emulate_i16(const std::vector<float>& x, int64_t M, int64_t K, const std::vector<int8_t>& codes,
                               const std::vector<float>& scale, const std::vector<float>& mins, int64_t N,
                               int32_t bits) {
  const int64_t S = bits == 6 ? 16 : 32, ns = K / S, nb = K / 32;
  std::vector<float> out(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m) {
    std::vector<int32_t> q(static_cast<size_t>(K));
    std::vector<float> sx(static_cast<size_t>(nb));
    for (int64_t b = 0; b < nb; ++b) {
      float amax = 0.0f;
      for (int64_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[m * K + b * 32 + i]));
      const float d = amax / 32767.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      sx[b] = d;
      for (int64_t i = 0; i < 32; ++i) {
        const float v = std::nearbyint(x[m * K + b * 32 + i] * id);
        q[b * 32 + i] = static_cast<int32_t>(std::min(32767.0f, std::max(-32767.0f, v)));
      }
    }
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t s = 0; s < ns; ++s) {
        int32_t dot = 0, sum = 0;
        for (int64_t k = s * S; k < (s + 1) * S; ++k) {
          dot += static_cast<int32_t>(codes[n * K + k]) * q[k];
          sum += q[k];
        }
        const float d = sx[s * S / 32];
        acc = std::fma(static_cast<float>(dot), scale[n * ns + s] * d, acc);
        acc = std::fma(mins[n * ns + s], d * static_cast<float>(sum), acc);
      }
      out[m * N + n] = acc;
    }
  }
  return out;
}

void run(int32_t bits, bool with_mins, int64_t M, int64_t N, int64_t K, std::mt19937& rng) {
  const int64_t S = bits == 6 ? 16 : 32, ns = K / S;  // weights per scale, scales per row
  std::uniform_int_distribution<int> code(bits == 8 ? -128 : 0, bits == 8 ? 127 : (1 << bits) - 1);
  std::uniform_real_distribution<float> uni(0.001f, 0.02f);
  std::normal_distribution<float> normal;
  std::vector<int8_t> codes(static_cast<size_t>(N * K));
  for (auto& c : codes) c = static_cast<int8_t>(code(rng));
  std::vector<float> scale(static_cast<size_t>(N * ns)), mins(scale.size()), x(static_cast<size_t>(M * K));
  for (auto& s : scale) s = uni(rng);
  for (size_t i = 0; i < mins.size(); ++i) {
    // Without mins the format's symmetric codes: w = scale * (q - offset).
    const float offset = bits == 8 ? 0.0f : static_cast<float>(1 << (bits - 1));
    mins[i] = with_mins ? normal(rng) * 0.05f : -offset * scale[i];
  }
  for (auto& v : x) v = normal(rng);

  std::vector<uint8_t> packed(static_cast<size_t>(trillium::quant_linear_packed_bytes(N, K, bits)));
  std::vector<float> ps(static_cast<size_t>(trillium::quant_linear_scale_count(N, K, bits))), pm(ps.size());
  CHECK_OK(trillium::quant_linear_pack(codes.data(), scale.data(), with_mins ? mins.data() : nullptr, N, K, bits,
                                       packed.data(), ps.data(), with_mins ? pm.data() : nullptr));
  // The exact mode's oracle: fp32 activations times the dequantized weights, in double.
  std::vector<float> weights(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      weights[n * K + k] = std::fma(static_cast<float>(codes[n * K + k]), scale[n * ns + k / S], mins[n * ns + k / S]);
    }
  }
  std::vector<double> dense(static_cast<size_t>(M * N), 0.0);
  double dense_max = 0.0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(weights[n * K + k]) * x[m * K + k];
      dense[m * N + n] = acc;
      dense_max = std::max(dense_max, std::fabs(acc));
    }
  }
  const bool int8_mode = bits == 4 || bits == 8;
  const std::vector<float> i16_expected = emulate_i16(x, M, K, codes, scale, mins, N, bits);
  std::vector<double> ref;
  double ref_max = 0.0;
  if (int8_mode) {
    ref = naive(x, M, K, codes, scale, mins, N);
    for (double v : ref) ref_max = std::max(ref_max, std::fabs(v));
  }

  for (trillium::KernelIsa isa : trillium::kAllKernelIsas) {
    if (!trillium::kernel_isa_supported(isa)) continue;
    CHECK_OK(trillium::set_kernel_isa(isa));
    std::vector<float> out(static_cast<size_t>(M * N), -1e30f);
    trillium::QuantLinearArgs a;
    a.x = x.data();
    a.num_rows = M;
    a.x_stride = K;
    a.weight = {N, K, bits, packed.data(), ps.data(), with_mins ? pm.data() : nullptr};
    a.out = out.data();
    a.out_stride = N;
    a.activations = trillium::QuantActivations::kInt8;
    if (int8_mode) {
      CHECK_OK(trillium::quant_linear(a));
      double worst = 0.0;
      for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(out[i] - ref[i]));
      CHECK(worst <= 1e-5 * ref_max + 1e-6);
    } else {
      CHECK(trillium::quant_linear(a).code() == trillium::StatusCode::kInvalidArgument);
    }
    // int16 mode: bit-identical to the oracle on every ISA, for all rows at once and row by row,
    // and within its rounding of the exact product.
    a.activations = trillium::QuantActivations::kInt16;
    CHECK_OK(trillium::quant_linear(a));
    CHECK(out == i16_expected);
    std::vector<float> alone(static_cast<size_t>(N));
    for (int64_t m = 0; m < M; ++m) {
      trillium::QuantLinearArgs one = a;
      one.x = x.data() + m * K;
      one.num_rows = 1;
      one.out = alone.data();
      CHECK_OK(trillium::quant_linear(one));
      CHECK(std::equal(alone.begin(), alone.end(), out.begin() + m * N));
    }
    double worst = 0.0;
    for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(out[i] - dense[i]));
    CHECK(worst <= 2e-4 * dense_max + 1e-6);
    a.activations = trillium::QuantActivations::kExact;
    CHECK_OK(trillium::quant_linear(a));
    worst = 0.0;
    for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(out[i] - dense[i]));
    CHECK(worst <= 1e-5 * dense_max + 1e-6);
  }
  // Row lookup: bit-identical to the dequantized weights.
  std::vector<int64_t> rows = {N - 1, 0, N / 2};
  std::vector<float> looked(rows.size() * static_cast<size_t>(K));
  CHECK_OK(trillium::quant_linear_dequantize_rows({N, K, bits, packed.data(), ps.data(), with_mins ? pm.data() : nullptr},
                                                  rows.data(), static_cast<int64_t>(rows.size()), looked.data(), K));
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t k = 0; k < K; ++k) CHECK(looked[i * K + k] == weights[rows[i] * K + k]);
  }
}

// Two-level scales (K-quants): fp32 super scales per 256 weights times integer sub-scales must give
// the same bits as per-block fp32 scales holding the products, on every ISA and row count.
void run_two_level(int32_t bits, bool with_mins, int64_t M, int64_t N, int64_t K, std::mt19937& rng) {
  const int64_t S = bits == 6 ? 16 : 32, ns = K / S, nsup = K / 256;
  std::uniform_int_distribution<int> code(0, (1 << bits) - 1), sub(bits == 6 ? -128 : 0, bits == 6 ? 127 : 63);
  std::uniform_real_distribution<float> uni(1e-4f, 2e-3f);
  std::normal_distribution<float> normal;
  std::vector<int8_t> codes(static_cast<size_t>(N * K)), sub_scale(static_cast<size_t>(N * ns));
  std::vector<uint8_t> sub_min(static_cast<size_t>(N * (K / 32)));
  std::vector<float> super_scale(static_cast<size_t>(N * nsup)), super_min(super_scale.size());
  for (auto& c : codes) c = static_cast<int8_t>(code(rng));
  for (auto& v : sub_scale) v = static_cast<int8_t>(sub(rng));
  for (auto& v : sub_min) v = static_cast<uint8_t>(std::uniform_int_distribution<int>(0, 63)(rng));
  for (auto& v : super_scale) v = uni(rng);
  for (auto& v : super_min) v = -uni(rng);
  // The same values as per-block fp32 scales (products exact in fp32).
  std::vector<float> scale(static_cast<size_t>(N * ns)), mins(scale.size());
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t s = 0; s < ns; ++s) {
      const float sc = super_scale[n * nsup + s * S / 256] * static_cast<float>(sub_scale[n * ns + s]);
      scale[n * ns + s] = sc;
      mins[n * ns + s] = with_mins ? super_min[n * nsup + s * S / 256] * static_cast<float>(sub_min[n * (K / 32) + s * S / 32])
                                   : -static_cast<float>(1 << (bits - 1)) * sc;
    }
  }
  std::vector<uint8_t> packed(static_cast<size_t>(trillium::quant_linear_packed_bytes(N, K, bits))), packed2(packed.size());
  const int64_t count = trillium::quant_linear_scale_count(N, K, bits);
  std::vector<float> ps(static_cast<size_t>(count)), pm(ps.size());
  std::vector<float> sup(static_cast<size_t>(trillium::quant_linear_super_count(N, K))), supm(sup.size());
  std::vector<uint8_t> subs(static_cast<size_t>(2 * count));
  CHECK_OK(trillium::quant_linear_pack(codes.data(), scale.data(), with_mins ? mins.data() : nullptr, N, K, bits,
                                       packed.data(), ps.data(), with_mins ? pm.data() : nullptr));
  CHECK_OK(trillium::quant_linear_pack_two_level(codes.data(), super_scale.data(), with_mins ? super_min.data() : nullptr,
                                                 sub_scale.data(), with_mins ? sub_min.data() : nullptr, N, K, bits,
                                                 packed2.data(), sup.data(), with_mins ? supm.data() : nullptr, subs.data(),
                                                 with_mins ? subs.data() + count : nullptr));
  CHECK(packed == packed2);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (auto& v : x) v = normal(rng);
  for (trillium::KernelIsa isa : trillium::kAllKernelIsas) {
    if (!trillium::kernel_isa_supported(isa)) continue;
    CHECK_OK(trillium::set_kernel_isa(isa));
    std::vector<float> one(static_cast<size_t>(M * N)), two(one.size());
    trillium::QuantLinearArgs a;
    a.x = x.data();
    a.num_rows = M;
    a.x_stride = K;
    a.weight = {N, K, bits, packed.data(), ps.data(), with_mins ? pm.data() : nullptr};
    a.out = one.data();
    a.out_stride = N;
    CHECK_OK(trillium::quant_linear(a));
    a.weight = {N, K, bits, packed2.data(), sup.data(), with_mins ? supm.data() : nullptr, subs.data()};
    a.out = two.data();
    CHECK_OK(trillium::quant_linear(a));
    CHECK(one == two);
    a.activations = trillium::QuantActivations::kInt16;  // two-level scales too, the same bits
    CHECK_OK(trillium::quant_linear(a));
    a.weight = {N, K, bits, packed.data(), ps.data(), with_mins ? pm.data() : nullptr};
    a.out = one.data();
    CHECK_OK(trillium::quant_linear(a));
    CHECK(one == two);
    CHECK(one == emulate_i16(x, M, K, codes, scale, mins, N, bits));
    a.activations = trillium::QuantActivations::kInt8;  // the int8 loops take per-block scales only
    a.weight = {N, K, bits, packed2.data(), sup.data(), with_mins ? supm.data() : nullptr, subs.data()};
    CHECK(trillium::quant_linear(a).code() == trillium::StatusCode::kInvalidArgument);
  }
}

void test_bad_arguments() {
  trillium::QuantLinearArgs a;
  a.num_rows = 1;
  CHECK(trillium::quant_linear(a).code() == trillium::StatusCode::kInvalidArgument);  // bits 0, null weight
  {
    float x[32] = {}, y[8] = {};
    uint8_t w[128] = {};
    float sc[32] = {};
    trillium::QuantLinearArgs b;
    b.x = x;
    b.num_rows = 1;
    b.x_stride = 32;
    b.weight = {8, 32, 4, w, sc, nullptr};
    b.out = y;
    b.out_stride = 8;
    b.activations = static_cast<trillium::QuantActivations>(7);  // no such mode
    CHECK(trillium::quant_linear(b).code() == trillium::StatusCode::kInvalidArgument);
  }
  int8_t codes[32] = {};
  codes[5] = 16;  // not a 4-bit code
  float s = 1.0f, m = 0.0f, ps[8], pm[8];
  uint8_t packed[256];
  CHECK(trillium::quant_linear_pack(codes, &s, &m, 1, 32, 4, packed, ps, pm).code() ==
        trillium::StatusCode::kInvalidArgument);
  CHECK(trillium::quant_linear_pack(codes, &s, &m, 1, 33, 8, packed, ps, pm).code() ==
        trillium::StatusCode::kInvalidArgument);
  codes[5] = 32;  // not a 5-bit code
  CHECK(trillium::quant_linear_pack(codes, &s, &m, 1, 32, 5, packed, ps, pm).code() ==
        trillium::StatusCode::kInvalidArgument);
  CHECK(trillium::quant_linear_pack(codes, &s, &m, 1, 32, 7, packed, ps, pm).code() ==
        trillium::StatusCode::kInvalidArgument);  // no 7-bit format
  codes[5] = 0;
  CHECK(trillium::quant_linear_pack(codes, &s, &m, 1, 32, 8, packed, ps, nullptr).code() ==
        trillium::StatusCode::kInvalidArgument);  // min without packed_mins
  const int64_t row = 1;  // outside a one-row weight
  float out[32];
  CHECK(trillium::quant_linear_dequantize_rows({1, 32, 8, packed, ps, nullptr}, &row, 1, out, 32).code() ==
        trillium::StatusCode::kInvalidArgument);
}

}  // namespace

int main() {
  std::mt19937 rng(std::random_device{}());
  const trillium::KernelIsa best = trillium::kernel_isa();
  for (int32_t bits : {4, 5, 6, 8}) {
    for (bool with_mins : {true, false}) {
      run(bits, with_mins, 1, 8, 32, rng);
      run(bits, with_mins, 2, 24, 64, rng);
      run(bits, with_mins, 5, 19, 96, rng);
      run(bits, with_mins, 12, 33, 64, rng);
      run(bits, with_mins, 67, 40, 256, rng);
      run(bits, with_mins, 9, 80, 64, rng);  // 2 whole tiles + a pair of groups: every 512-bit int16 tile
    }
  }
  for (int32_t bits : {4, 5, 6}) {
    for (bool with_mins : {true, false}) {
      if (bits == 6 && with_mins) continue;  // Q6_K is symmetric
      for (int64_t rows : {1, 3, 7, 12}) run_two_level(bits, with_mins, rows, 40, 512, rng);
    }
  }
  CHECK_OK(trillium::set_kernel_isa(best));
  test_bad_arguments();
  return trillium::test::test_exit_code();
}
