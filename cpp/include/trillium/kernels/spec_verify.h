// Speculative decoding's verify step: for every request of a step, how many of its draft tokens
// the target model accepts, and the one token that follows them. One call per step for the batch.
//
// Request i proposed num_draft[i] <= max_draft (k) draft tokens d_0 .. d_{n-1} (n = num_draft[i];
// 0 is a plain decode step), and the target scored the k+1 positions after its last verified token:
// row j of target[i] is the target's distribution for the token at position j given d_0 .. d_{j-1}.
// The output row of request i (k+1 entries):
//
//   output_tokens[i] = [ d_0 .. d_{a-1} | next | -1 ... -1 ]      a = num_accepted[i] in [0, n]
//                        accepted drafts   one token, always
//
// `next` is the correction at the first rejected position a (a < n) or the bonus token drawn from
// row n (a == n). Per request, by modes[i] (SpecVerifyMode):
//
//   kGreedy      target rows are scores; draw_j = argmax of row j (first index of the maximum; a
//                NaN counts as the maximum -- torch.argmax). Accept d_j while d_j == draw_j;
//                next = draw_a.
//   kPointMass   sampled request, proposals without probabilities (n-gram: a point mass). draw_j
//                is the inverse-CDF draw of target row j at uniforms[i, j] (below); accept d_j
//                while d_j == draw_j; next = draw_a. With the uniforms a request would use for
//                those positions without speculation, the tokens are exactly the same.
//   kDraftProbs  sampled request, proposals drawn from draft_probs[i, j] = q_j (normalized).
//                Lossless rejection sampling with p_j = target row j / its sum: accept d_j when
//                uniforms[i, j] * q_j(d_j) < p_j(d_j), i.e. with probability min(1, p/q). A draft
//                token with q_j = 0 is accepted iff p_j > 0 (the test holds for any u): the draft
//                claimed it could not propose it, so there is no ratio to honour, and the target
//                allows it; a token with p_j = 0 is never accepted (nor ever output). On the
//                first rejection, next is the inverse-CDF draw of the residual max(0, p_j - q_j)
//                at residual_uniforms[i]; if the residual is all zero (only possible when
//                d_j had p_j = q_j = 0, or by rounding) the draw is from target row j instead,
//                same uniform. After n acceptances next is the inverse-CDF draw of row n at
//                uniforms[i, n], exactly as kPointMass draws it.
//
// Inverse-CDF draw of weights w[0..V) at uniform u in [0, 1) -- exactly python/trillium/engine/
// sampler.py's _inverse_cdf: the running sums S_v = w_0 + ... + w_v in float64, added in index
// order; total = S_{V-1}; the draw is the first v with S_v > u * total; if there is none the last v
// with w_v > 0, or V - 1 if no weight is positive. (With u < 1, u * total rounds below a finite
// total > 0, so "none" means a row of zeros.) Weights need not be normalized; a weight of 0 is
// never drawn. Weights must be finite and >= 0 (the sampler's probabilities are): otherwise the
// draw is some token in [0, V), unspecified.
//
// Uniforms: uniforms[i, j] is read for sampled requests at j = 0 .. a (acceptance tests and the
// draw of position j); residual_uniforms[i] only by kDraftProbs requests, on a rejection. A
// separate number keeps the residual draw independent of the acceptance test that failed.
//
// Framework-free: raw pointers, sizes and strides in elements. The CPU kernel (parallel over
// requests) and the CUDA launcher (cuda/launchers.h; a block per request) compute the same float64
// sums in the same order, so they return identical tokens for valid inputs.
#pragma once

#include <cstdint>
#include <string>

#include "trillium/status.h"

// The few expressions both kernels evaluate are defined once, here, so they round identically.
#if defined(__CUDACC__)
#define TRILLIUM_HOST_DEVICE __host__ __device__
#else
#define TRILLIUM_HOST_DEVICE
#endif

namespace trillium {

enum class SpecVerifyMode : int32_t {
  kGreedy = 0,
  kPointMass = 1,
  kDraftProbs = 2,
};

constexpr int64_t kMaxSpecDraftTokens = 64;  // k; useful values are <= ~10

//   target        [N, k+1, V] float32, strides target_stride_request / _position (any >= 0),
//                 rows contiguous
//   draft_tokens  [N, k] int32 (or int64 when draft_tokens_int64), contiguous; entries past
//                 num_draft[i] are not read
//   num_draft     [N] int32 in [0, k];  modes [N] int32 (SpecVerifyMode)
//   draft_probs   [N, k, V] float32, strides as target's; read for kDraftProbs requests with drafts
//   uniforms      [N, k+1] float64 in [0, 1), contiguous; null when every request is kGreedy
//   residual_uniforms [N] float64 in [0, 1); read for kDraftProbs requests with drafts
//   num_accepted  [N] int32, written;  output_tokens [N, k+1] int32, contiguous, written
struct SpecVerifyArgs {
  int64_t num_requests = 0;
  int64_t max_draft = 0;
  int64_t vocab_size = 0;
  const float* target = nullptr;
  int64_t target_stride_request = 0;
  int64_t target_stride_position = 0;
  const void* draft_tokens = nullptr;
  bool draft_tokens_int64 = false;
  const int32_t* num_draft = nullptr;
  const int32_t* modes = nullptr;
  const float* draft_probs = nullptr;
  int64_t draft_probs_stride_request = 0;
  int64_t draft_probs_stride_position = 0;
  const double* uniforms = nullptr;
  const double* residual_uniforms = nullptr;
  int32_t* num_accepted = nullptr;
  int32_t* output_tokens = nullptr;
  int num_threads = 0;  // CPU: 0 = OpenMP's default
};

// Checks sizes and pointers, then every per-request value the kernel will read (mode, num_draft,
// the first num_draft draft tokens in [0, V), the uniforms it reads in [0, 1), the pointers its
// mode needs), before writing anything: InvalidArgument naming the request on a bad value.
Status spec_verify(const SpecVerifyArgs& args);

// Host-side checks of sizes, strides and pointers (not of device-resident values), shared by the
// CPU kernel and the CUDA launcher; inline so that the CUDA module needs no link to the core.
inline Status check_spec_verify_args(const SpecVerifyArgs& a) {
  auto bad = [](const std::string& m) { return Status::InvalidArgument("spec_verify: " + m); };
  if (a.num_requests < 0) return bad("num_requests must be >= 0, got " + std::to_string(a.num_requests));
  if (a.max_draft < 0 || a.max_draft > kMaxSpecDraftTokens) {
    return bad("max_draft must be in [0, " + std::to_string(kMaxSpecDraftTokens) + "], got " +
               std::to_string(a.max_draft));
  }
  if (a.vocab_size <= 0 || a.vocab_size > INT32_MAX) {
    return bad("vocab_size must be in [1, 2^31), got " + std::to_string(a.vocab_size));
  }
  if (a.num_requests == 0) return Status::Ok();
  if (a.target == nullptr || a.num_draft == nullptr || a.modes == nullptr || a.num_accepted == nullptr ||
      a.output_tokens == nullptr || (a.draft_tokens == nullptr && a.max_draft > 0)) {
    return bad("null target, draft_tokens, num_draft, modes or output pointer");
  }
  // Inputs are only read, so any strides >= 0 work (0 broadcasts one row to every request/position).
  if (a.target_stride_request < 0 || a.target_stride_position < 0 || a.draft_probs_stride_request < 0 ||
      a.draft_probs_stride_position < 0) {
    return bad("strides must be >= 0");
  }
  return Status::Ok();
}

// ---- Shared by the CPU kernel and the CUDA kernel, so that both read and round alike.

// Draft token j of request i (either index width).
TRILLIUM_HOST_DEVICE inline int64_t spec_draft_token(const SpecVerifyArgs& a, int64_t i, int64_t j) {
  const int64_t at = i * a.max_draft + j;
  return a.draft_tokens_int64 ? static_cast<const int64_t*>(a.draft_tokens)[at]
                              : static_cast<const int32_t*>(a.draft_tokens)[at];
}

// The first bad value request i's verification would read (none: kNone). *at is the draft token
// or uniform position for kDraftToken / kUniform.
enum class SpecRequestError : int32_t {
  kNone = 0,
  kMode,             // modes[i] is not a SpecVerifyMode
  kNumDraft,         // num_draft[i] outside [0, k]
  kDraftToken,       // a draft token outside [0, V)
  kNoUniforms,       // a sampled mode without uniforms
  kUniform,          // uniforms[i, j] (j <= num_draft[i]) outside [0, 1)
  kNoDraftProbs,     // kDraftProbs with drafts, without draft_probs or residual_uniforms
  kResidualUniform,  // residual_uniforms[i] (read when num_draft[i] > 0) outside [0, 1)
};

TRILLIUM_HOST_DEVICE inline SpecRequestError spec_request_error(const SpecVerifyArgs& a, int64_t i, int64_t* at) {
  const int32_t mode = a.modes[i];
  if (mode < 0 || mode > static_cast<int32_t>(SpecVerifyMode::kDraftProbs)) return SpecRequestError::kMode;
  const int32_t n = a.num_draft[i];
  if (n < 0 || n > a.max_draft) return SpecRequestError::kNumDraft;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t token = spec_draft_token(a, i, j);
    *at = j;
    if (token < 0 || token >= a.vocab_size) return SpecRequestError::kDraftToken;
  }
  if (mode == static_cast<int32_t>(SpecVerifyMode::kGreedy)) return SpecRequestError::kNone;
  if (a.uniforms == nullptr) return SpecRequestError::kNoUniforms;
  for (int64_t j = 0; j <= n; ++j) {
    const double u = a.uniforms[i * (a.max_draft + 1) + j];
    *at = j;
    if (!(u >= 0.0 && u < 1.0)) return SpecRequestError::kUniform;
  }
  if (mode != static_cast<int32_t>(SpecVerifyMode::kDraftProbs) || n == 0) return SpecRequestError::kNone;
  if (a.draft_probs == nullptr || a.residual_uniforms == nullptr) return SpecRequestError::kNoDraftProbs;
  const double ur = a.residual_uniforms[i];
  return ur >= 0.0 && ur < 1.0 ? SpecRequestError::kNone : SpecRequestError::kResidualUniform;
}

// kDraftProbs acceptance of a draft token: u * q < p with p = t / t_total (false when t_total is 0).
TRILLIUM_HOST_DEVICE inline bool spec_accepts(double u, float t, double t_total, float q) {
  return u * static_cast<double>(q) < static_cast<double>(t) / t_total;
}

// kDraftProbs residual weight max(0, p - q), p = t / t_total (0 when that is NaN).
TRILLIUM_HOST_DEVICE inline double spec_residual(float t, double t_total, float q) {
  const double d = static_cast<double>(t) / t_total - static_cast<double>(q);
  return d > 0.0 ? d : 0.0;
}

// The greedy order: is score b at index ib a better argmax than a at ia? NaN beats numbers, then
// the larger value, then the smaller index (torch.argmax: the first index of the maximum).
TRILLIUM_HOST_DEVICE inline bool spec_argmax_better(float a, int64_t ia, float b, int64_t ib) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan != b_nan) return b_nan;
  if (b > a) return true;
  if (a > b) return false;
  return ib < ia;
}

// Writes request i's output row (accepted drafts, next, then -1) and its accepted count.
TRILLIUM_HOST_DEVICE inline void spec_write_row(const SpecVerifyArgs& a, int64_t i, int32_t accepted, int32_t next) {
  int32_t* out = a.output_tokens + i * (a.max_draft + 1);
  for (int64_t j = 0; j < accepted; ++j) out[j] = static_cast<int32_t>(spec_draft_token(a, i, j));
  out[accepted] = next;
  for (int64_t j = accepted + 1; j <= a.max_draft; ++j) out[j] = -1;
  a.num_accepted[i] = accepted;
}

}  // namespace trillium
