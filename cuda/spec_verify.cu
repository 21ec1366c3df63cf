// Speculative-decoding verify on the GPU (contract: cpp/include/trillium/kernels/spec_verify.h).
//
// A block of kWarps warps per request; a warp per target position (round robin when k+1 > kWarps).
// Greedy and point-mass requests draw every position 0..n at once (the warps run side by side),
// then thread 0 walks the drafts against the draws. Draft-model requests sum rows 0..n-1 at once,
// thread 0 runs the acceptance tests, and warp 0 makes the one draw (residual or bonus).
//
// The inverse CDF must give the CPU's (and torch.cumsum's) float64 running sums bit for bit, so
// the sum is one sequential chain in index order: each lane loads one token of 32 (coalesced), and
// the warp adds the 32 in order with every lane holding the same running sum. A tree or
// Kahan-style sum would round differently and move draws. The chain costs about V float64 add
// latencies per row (~0.5-1 ms at V = 152k) -- the price of token-identical draws; it runs in
// parallel across positions and requests. Like the CPU, the chain saves its running sum every
// chunk (at most kCheckpoints chunks, in shared memory), so finding the draw rescans one chunk.
// Argmax is a parallel reduction (its order cannot change the result).
//
// Where CPU and GPU can differ: only on weights that are negative or NaN (the header leaves
// those draws unspecified). Per-request values live on the device, so the launcher cannot check
// them: a request that fails the CPU's checks (spec_request_error) gets num_accepted = -1 and an
// all -1 output row, and nothing it names is read.
#include <cstdint>

#include "launchers.h"

namespace trillium::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kCheckpoints = 256;  // saved running sums per warp: 2 KB of shared memory
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

struct RowWeights {
  const float* t;
  __device__ double operator()(int64_t v) const { return static_cast<double>(t[v]); }
};

struct ResidualWeights {
  const float* t;
  const float* q;
  double t_total;
  __device__ double operator()(int64_t v) const { return spec_residual(t[v], t_total, q[v]); }
};

// Tokens per saved running sum: a multiple of 32, at most kCheckpoints chunks.
__device__ int64_t chunk_len(int64_t vocab) {
  const int64_t per = (vocab + kCheckpoints - 1) / kCheckpoints;
  return (per + 31) / 32 * 32;
}

// sum of w over [0, vocab) in index order (see the top). With checkpoints, lane 0 saves the running
// sum before each chunk of `chunk` tokens. Every lane returns the same value.
template <class W>
__device__ double warp_sum(const W& w, int64_t vocab, int64_t chunk, double* checkpoints) {
  const int lane = threadIdx.x & 31;
  double s = 0.0;
  for (int64_t c0 = 0; c0 < vocab; c0 += chunk) {
    if (checkpoints != nullptr && lane == 0) checkpoints[c0 / chunk] = s;
    const int64_t c1 = min64(c0 + chunk, vocab);
    double x = c0 + lane < c1 ? w(c0 + lane) : 0.0;
    for (int64_t b = c0; b < c1; b += 32) {
      const double next = b + 32 + lane < c1 ? w(b + 32 + lane) : 0.0;  // in flight while we add
#pragma unroll
      for (int l = 0; l < 32; ++l) s += __shfl_sync(kFullMask, x, l);  // + 0.0 past c1: s unchanged
      x = next;
    }
  }
  __syncwarp();
  return s;
}

// The first v in [c0, c1) whose running sum (s before c0) exceeds target, or -1.
template <class W>
__device__ int64_t warp_search(const W& w, int64_t c0, int64_t c1, double s, double target) {
  const int lane = threadIdx.x & 31;
  for (int64_t b = c0; b < c1; b += 32) {
    const double x = b + lane < c1 ? w(b + lane) : 0.0;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      s += __shfl_sync(kFullMask, x, l);
      if (s > target) return b + l < c1 ? b + l : -1;  // the same s in every lane: a uniform branch
    }
  }
  return -1;
}

// The last v with w(v) > 0, or -1.
template <class W>
__device__ int64_t warp_last_positive(const W& w, int64_t vocab) {
  long long best = -1;
  for (int64_t v = threadIdx.x & 31; v < vocab; v += 32) {
    if (w(v) > 0.0) best = v;
  }
  for (int off = 16; off > 0; off >>= 1) {
    const long long other = __shfl_xor_sync(kFullMask, best, off);
    best = other > best ? other : best;
  }
  return best;
}

struct Draw {
  int32_t token;
  double total;  // the weights' sum
};

// The header's inverse-CDF draw. checkpoints: this warp's kCheckpoints.
template <class W>
__device__ Draw warp_inverse_cdf(const W& w, int64_t vocab, double u, double* checkpoints) {
  const int lane = threadIdx.x & 31;
  __syncwarp();  // the previous draw's reads of checkpoints are done
  const int64_t chunk = chunk_len(vocab);
  const double s = warp_sum(w, vocab, chunk, checkpoints);
  const double target = u * s;
  const int num_chunks = static_cast<int>((vocab + chunk - 1) / chunk);
  for (int base = 0; base < num_chunks; base += 32) {
    const int c = base + lane;
    const bool crosses = c < num_chunks && (c + 1 < num_chunks ? checkpoints[c + 1] : s) > target;
    const unsigned hits = __ballot_sync(kFullMask, crosses);
    if (hits == 0) continue;
    const int first = base + __ffs(static_cast<int>(hits)) - 1;
    const int64_t v = warp_search(w, first * chunk, min64(vocab, (first + 1) * chunk), checkpoints[first], target);
    if (v >= 0) return {static_cast<int32_t>(v), s};
    break;  // only with weights that are negative or NaN
  }
  const int64_t v = warp_last_positive(w, vocab);  // no sum exceeds u * total: a row of zeros
  return {static_cast<int32_t>(v >= 0 ? v : vocab - 1), s};
}

__device__ int32_t warp_argmax(const float* t, int64_t vocab) {
  float best = __int_as_float(static_cast<int>(0xff800000u));  // -inf at index vocab: any token beats it
  long long best_v = vocab;
  for (int64_t v = threadIdx.x & 31; v < vocab; v += 32) {
    if (spec_argmax_better(best, best_v, t[v], v)) {
      best = t[v];
      best_v = v;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {  // a total order: every lane ends with the same pair
    const float other = __shfl_xor_sync(kFullMask, best, off);
    const long long other_v = __shfl_xor_sync(kFullMask, best_v, off);
    if (spec_argmax_better(best, best_v, other, other_v)) {
      best = other;
      best_v = other_v;
    }
  }
  return static_cast<int32_t>(best_v);
}

__global__ void __launch_bounds__(kThreads) spec_verify_kernel(const SpecVerifyArgs a) {
  __shared__ double checkpoints[kWarps][kCheckpoints];
  __shared__ double row_totals[kMaxSpecDraftTokens];
  __shared__ int32_t draws[kMaxSpecDraftTokens + 1];
  __shared__ int32_t shared_accepted;
  __shared__ bool valid;
  const int64_t i = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    int64_t at = 0;
    valid = spec_request_error(a, i, &at) == SpecRequestError::kNone;
  }
  __syncthreads();
  if (!valid) {
    if (threadIdx.x == 0) {
      int32_t* out = a.output_tokens + i * (a.max_draft + 1);
      for (int64_t j = 0; j <= a.max_draft; ++j) out[j] = -1;
      a.num_accepted[i] = -1;
    }
    return;
  }
  const auto mode = static_cast<SpecVerifyMode>(a.modes[i]);
  const int32_t n = a.num_draft[i];
  const int64_t vocab = a.vocab_size;
  const float* target = a.target + i * a.target_stride_request;
  const double* u = a.uniforms == nullptr ? nullptr : a.uniforms + i * (a.max_draft + 1);

  if (mode != SpecVerifyMode::kDraftProbs) {
    for (int j = warp; j <= n; j += kWarps) {
      const float* row = target + j * a.target_stride_position;
      const int32_t draw = mode == SpecVerifyMode::kGreedy
                               ? warp_argmax(row, vocab)
                               : warp_inverse_cdf(RowWeights{row}, vocab, u[j], checkpoints[warp]).token;
      if (lane == 0) draws[j] = draw;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int32_t accepted = 0;
      while (accepted < n && spec_draft_token(a, i, accepted) == draws[accepted]) ++accepted;
      spec_write_row(a, i, accepted, draws[accepted]);
    }
    return;
  }

  const float* q = a.draft_probs + i * a.draft_probs_stride_request;
  for (int j = warp; j < n; j += kWarps) {
    const double s = warp_sum(RowWeights{target + j * a.target_stride_position}, vocab, vocab, nullptr);
    if (lane == 0) row_totals[j] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t accepted = 0;
    for (; accepted < n; ++accepted) {
      const int64_t x = spec_draft_token(a, i, accepted);
      const float t = target[accepted * a.target_stride_position + x];
      if (!spec_accepts(u[accepted], t, row_totals[accepted], q[accepted * a.draft_probs_stride_position + x])) break;
    }
    shared_accepted = accepted;
  }
  __syncthreads();
  if (warp != 0) return;
  const int32_t accepted = shared_accepted;
  int32_t next;
  if (accepted < n) {
    const float* row = target + accepted * a.target_stride_position;
    const float* q_row = q + accepted * a.draft_probs_stride_position;
    const double ur = a.residual_uniforms[i];
    const Draw residual = warp_inverse_cdf(ResidualWeights{row, q_row, row_totals[accepted]}, vocab, ur, checkpoints[0]);
    next = residual.total > 0.0 ? residual.token : warp_inverse_cdf(RowWeights{row}, vocab, ur, checkpoints[0]).token;
  } else {
    next = warp_inverse_cdf(RowWeights{target + n * a.target_stride_position}, vocab, u[n], checkpoints[0]).token;
  }
  if (lane == 0) spec_write_row(a, i, accepted, next);
}

}  // namespace

cudaError_t spec_verify(const SpecVerifyArgs& a, cudaStream_t stream) {
  if (!check_spec_verify_args(a).ok()) return cudaErrorInvalidValue;
  if (a.num_requests == 0) return cudaSuccess;
  if (a.num_requests > 0x7fffffff) return cudaErrorInvalidValue;  // grid.x limit
  spec_verify_kernel<<<static_cast<unsigned>(a.num_requests), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace trillium::cuda
