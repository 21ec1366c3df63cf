// Unit tests for trillium::spec_verify: greedy acceptance, point-mass draws at hand-computed
// uniforms, the draft-model accept / residual / bonus cases worked out by hand, the inverse CDF
// across many chunks against a plain running-sum search, one thread against two, and bad values
// rejected with nothing written. Plain ctest executable.
#include "trillium/kernels/spec_verify.h"

#include <cstdint>
#include <random>
#include <vector>

#include "check.h"

using trillium::SpecVerifyArgs;
using trillium::SpecVerifyMode;

namespace {

constexpr int32_t kGreedy = static_cast<int32_t>(SpecVerifyMode::kGreedy);
constexpr int32_t kPointMass = static_cast<int32_t>(SpecVerifyMode::kPointMass);
constexpr int32_t kDraftProbs = static_cast<int32_t>(SpecVerifyMode::kDraftProbs);

// A batch with its buffers; args() points the kernel at them.
struct Batch {
  int64_t n = 0, k = 0, vocab = 0;
  std::vector<float> target, draft_probs;                 // [n, k+1, V], [n, k, V]
  std::vector<int32_t> drafts, num_draft, modes;          // [n, k], [n], [n]
  std::vector<double> uniforms, residual;                 // [n, k+1], [n]
  std::vector<int32_t> num_accepted, out;                 // [n], [n, k+1]

  Batch(int64_t n_, int64_t k_, int64_t vocab_)
      : n(n_), k(k_), vocab(vocab_), target(n_ * (k_ + 1) * vocab_, 0.f), draft_probs(n_ * k_ * vocab_, 0.f),
        drafts(n_ * k_, 0), num_draft(n_, 0), modes(n_, kGreedy), uniforms(n_ * (k_ + 1), 0.5), residual(n_, 0.5),
        num_accepted(n_, -7), out(n_ * (k_ + 1), -7) {}

  float* row(int64_t i, int64_t j) { return target.data() + (i * (k + 1) + j) * vocab; }
  float* q(int64_t i, int64_t j) { return draft_probs.data() + (i * k + j) * vocab; }

  SpecVerifyArgs args() {
    SpecVerifyArgs a;
    a.num_requests = n;
    a.max_draft = k;
    a.vocab_size = vocab;
    a.target = target.data();
    a.target_stride_request = (k + 1) * vocab;
    a.target_stride_position = vocab;
    a.draft_tokens = drafts.data();
    a.num_draft = num_draft.data();
    a.modes = modes.data();
    a.draft_probs = draft_probs.data();
    a.draft_probs_stride_request = k * vocab;
    a.draft_probs_stride_position = vocab;
    a.uniforms = uniforms.data();
    a.residual_uniforms = residual.data();
    a.num_accepted = num_accepted.data();
    a.output_tokens = out.data();
    return a;
  }
};

void test_greedy() {
  Batch b(2, 3, 8);
  const int32_t best[2][4] = {{5, 1, 7, 2}, {3, 3, 0, 6}};
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 4; ++j) b.row(i, j)[best[i][j]] = 2.f;
  }
  b.row(1, 1)[6] = 2.f;  // a tie: the first index (3) wins
  b.num_draft = {3, 3};
  b.drafts = {5, 1, 7, /* request 1 */ 3, 6, 0};
  CHECK_OK(trillium::spec_verify(b.args()));
  CHECK(b.num_accepted[0] == 3 && b.num_accepted[1] == 1);
  CHECK((b.out == std::vector<int32_t>{5, 1, 7, 2, /* request 1 */ 3, 3, -1, -1}));
}

void test_point_mass() {
  Batch b(1, 2, 4);
  for (int64_t j = 0; j < 3; ++j) {
    const float w[4] = {0.f, 1.f, 1.f, 2.f};  // running sums 0 1 2 4: u * 4 picks the first sum above it
    for (int v = 0; v < 4; ++v) b.row(0, j)[v] = w[v];
  }
  b.modes = {kPointMass};
  b.num_draft = {2};
  b.uniforms = {0.5, 0.25, 0.0};  // draws 3, 2, then 1 (u = 0: the first positive weight)
  b.drafts = {3, 2};
  CHECK_OK(trillium::spec_verify(b.args()));
  CHECK(b.num_accepted[0] == 2 && (b.out == std::vector<int32_t>{3, 2, 1}));
  b.drafts = {3, 1};  // wrong at position 1: the draw there (2) is the next token
  CHECK_OK(trillium::spec_verify(b.args()));
  CHECK(b.num_accepted[0] == 1 && (b.out == std::vector<int32_t>{3, 2, -1}));
}

void test_draft_probs_cases() {
  Batch b(3, 1, 4);
  b.modes = {kDraftProbs, kDraftProbs, kDraftProbs};
  b.num_draft = {1, 1, 1};
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 2; ++j) {
      b.row(i, j)[0] = 2.f;  // p = [0.5, 0.5, 0, 0] (unnormalized: the kernel divides by the sum)
      b.row(i, j)[1] = 2.f;
    }
  }
  // 0: q(x) = 0 < p(x): accepted whatever the uniform; then the bonus from row 1 at u = 0.75 -> 1.
  b.q(0, 0)[2] = 1.f;
  b.drafts[0] = 1;
  b.uniforms[0] = 0.999;
  b.uniforms[1] = 0.75;
  // 1: p(x) = 0: rejected; residual max(0, p - q) = [0.5, 0.5, 0, 0] at 0.3 -> 0.
  b.q(1, 0)[2] = 1.f;
  b.drafts[1] = 2;
  b.uniforms[2] = 0.0;
  b.residual[1] = 0.3;
  // 2: q = [0.25, 0.75, 0, 0], x = 1: p/q = 2/3, u = 0.7 rejects; residual = [0.25, 0, 0, 0] -> 0.
  b.q(2, 0)[0] = 0.25f;
  b.q(2, 0)[1] = 0.75f;
  b.drafts[2] = 1;
  b.uniforms[4] = 0.7;
  b.residual[2] = 0.9;
  CHECK_OK(trillium::spec_verify(b.args()));
  CHECK((b.num_accepted == std::vector<int32_t>{1, 0, 0}));
  CHECK((b.out == std::vector<int32_t>{1, 1, /* 1 */ 0, -1, /* 2 */ 0, -1}));
  b.uniforms[4] = 0.6;  // now u < 2/3: accepted
  CHECK_OK(trillium::spec_verify(b.args()));
  CHECK(b.num_accepted[2] == 1 && b.out[4] == 1);
}

// Many chunks of the kernel's saved running sums: every draw equals a plain search of the sums.
void test_inverse_cdf_across_chunks() {
  constexpr int64_t kVocab = 5003, kRequests = 64;
  Batch b(kRequests, 0, kVocab);
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::exponential_distribution<float> expo(1.f);
  for (float& x : b.target) x = unit(rng) < 0.3 ? 0.f : expo(rng) * expo(rng) * expo(rng);
  b.modes.assign(kRequests, kPointMass);
  for (double& u : b.uniforms) u = unit(rng);
  b.uniforms[0] = 0.0;
  b.uniforms[1] = 0.9999999999;
  CHECK_OK(trillium::spec_verify(b.args()));
  for (int64_t i = 0; i < kRequests; ++i) {
    const float* w = b.row(i, 0);
    double total = 0.0;
    for (int64_t v = 0; v < kVocab; ++v) total += static_cast<double>(w[v]);
    const double target = b.uniforms[i] * total;
    double s = 0.0;
    int64_t want = -1;
    for (int64_t v = 0; v < kVocab && want < 0; ++v) {
      s += static_cast<double>(w[v]);
      if (s > target) want = v;
    }
    CHECK(b.out[i] == want && b.num_accepted[i] == 0);
  }
}

void test_threads_agree() {
  Batch b(9, 4, 3000);
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (float& x : b.target) x = static_cast<float>(unit(rng));
  for (float& x : b.draft_probs) x = 1.f / 3000.f;
  for (int64_t i = 0; i < b.n; ++i) {
    b.modes[i] = static_cast<int32_t>(i % 3);
    b.num_draft[i] = static_cast<int32_t>(i % 5);
  }
  for (int32_t& d : b.drafts) d = static_cast<int32_t>(rng() % 3000);
  for (double& u : b.uniforms) u = unit(rng);
  SpecVerifyArgs a = b.args();
  a.num_threads = 1;
  CHECK_OK(trillium::spec_verify(a));
  const std::vector<int32_t> one = b.out, one_accepted = b.num_accepted;
  a.num_threads = 2;
  CHECK_OK(trillium::spec_verify(a));
  CHECK(b.out == one && b.num_accepted == one_accepted);
}

void test_bad_values_write_nothing() {
  Batch b(2, 2, 6);
  b.num_draft = {2, 2};
  b.modes = {kGreedy, kPointMass};
  auto untouched = [&b] {
    for (int32_t x : b.out) CHECK(x == -7);
    for (int32_t x : b.num_accepted) CHECK(x == -7);
  };
  b.modes[1] = 3;
  CHECK(!trillium::spec_verify(b.args()).ok());
  b.modes[1] = kPointMass;
  b.drafts[3] = 6;  // request 1, position 1: outside [0, V)
  CHECK(!trillium::spec_verify(b.args()).ok());
  b.drafts[3] = 0;
  b.uniforms[4] = 1.0;
  CHECK(!trillium::spec_verify(b.args()).ok());
  b.uniforms[4] = 0.5;
  b.num_draft[0] = 3;
  CHECK(!trillium::spec_verify(b.args()).ok());
  b.num_draft[0] = 2;
  SpecVerifyArgs a = b.args();
  a.uniforms = nullptr;  // request 1 samples
  CHECK(!trillium::spec_verify(a).ok());
  a = b.args();
  a.max_draft = trillium::kMaxSpecDraftTokens + 1;
  CHECK(!trillium::spec_verify(a).ok());
  a = b.args();
  a.target_stride_position = -1;
  CHECK(!trillium::spec_verify(a).ok());
  untouched();
  b.modes[1] = kDraftProbs;
  a = b.args();
  a.draft_probs = nullptr;
  CHECK(!trillium::spec_verify(a).ok());
  b.num_draft[1] = 0;  // a draft-model request without drafts reads no q
  CHECK_OK(trillium::spec_verify(a));
}

}  // namespace

int main() {
  test_greedy();
  test_point_mass();
  test_draft_probs_cases();
  test_inverse_cdf_across_chunks();
  test_threads_agree();
  test_bad_values_write_nothing();
  return trillium::test::test_exit_code();
}
