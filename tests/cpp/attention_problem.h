// Test support for the attention / KV-store ctest executables: a random paged problem (pool,
// block tables, queries) and a naive double-precision reference. Header-only, no framework.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "trillium/kernels/dtype.h"
#include "trillium/kernels/paged_attention.h"

namespace trillium::test {

// Stores values of the given dtype; `at` reads them back as float.
struct Buffer {
  DType dtype = DType::kF32;
  std::vector<float> f32;
  std::vector<bf16_t> bf16;

  Buffer(DType t, size_t n, float fill) : dtype(t) {
    if (t == DType::kF32) f32.assign(n, fill);
    else bf16.assign(n, f32_to_bf16(fill));
  }
  void set(size_t i, float x) {
    if (dtype == DType::kF32) f32[i] = x;
    else bf16[i] = f32_to_bf16(x);
  }
  float at(size_t i) const { return dtype == DType::kF32 ? f32[i] : bf16_to_f32(bf16[i]); }
  void* data() { return dtype == DType::kF32 ? static_cast<void*>(f32.data()) : static_cast<void*>(bf16.data()); }
  size_t size() const { return dtype == DType::kF32 ? f32.size() : bf16.size(); }
};

// R requests with (context_len, query_len); K/V pool with random, disjoint, shuffled block tables.
// Block 0 and unused blocks hold NaN (a stray read shows up); the output starts as NaN.
struct Problem {
  int32_t num_kv_heads, group, head_dim, block_size, num_blocks = 0;
  std::vector<int32_t> context_lens, query_start_loc, block_tables;
  int64_t table_stride = 0;
  Buffer k, v, query, out;

  Problem(std::mt19937& rng, const std::vector<std::pair<int32_t, int32_t>>& lens, int32_t kv_heads, int32_t g,
          int32_t d, int32_t bs, DType dtype)
      : num_kv_heads(kv_heads), group(g), head_dim(d), block_size(bs), k(dtype, 0, 0), v(dtype, 0, 0),
        query(dtype, 0, 0), out(dtype, 0, 0) {
    std::vector<int32_t> counts;
    query_start_loc.push_back(0);
    for (auto [ctx, qlen] : lens) {
      context_lens.push_back(ctx);
      query_start_loc.push_back(query_start_loc.back() + qlen);
      counts.push_back((ctx + bs - 1) / bs);
      table_stride = std::max<int64_t>(table_stride, counts.back());
    }
    int32_t total = 0;
    for (int32_t c : counts) total += c;
    num_blocks = total + 2;
    std::vector<int32_t> ids;
    for (int32_t b = 1; b < num_blocks; ++b) ids.push_back(b);
    std::shuffle(ids.begin(), ids.end(), rng);
    block_tables.assign(lens.size() * static_cast<size_t>(std::max<int64_t>(table_stride, 1)), 0);
    for (size_t r = 0, next = 0; r < lens.size(); ++r)
      for (int32_t b = 0; b < counts[r]; ++b) block_tables[r * table_stride + b] = ids[next++];

    const float nan = std::numeric_limits<float>::quiet_NaN();
    const size_t pool = static_cast<size_t>(num_blocks) * bs * kv_heads * d;
    k = Buffer(dtype, pool, nan);
    v = Buffer(dtype, pool, nan);
    std::normal_distribution<float> normal;
    for (size_t r = 0; r < lens.size(); ++r) {
      for (int32_t p = 0; p < context_lens[r]; ++p) {
        for (int32_t i = 0; i < kv_heads * d; ++i) {
          const size_t at = slot(r, p) * kv_heads * d + i;
          k.set(at, normal(rng));
          v.set(at, normal(rng));
        }
      }
    }
    const size_t q_elems = static_cast<size_t>(num_tokens()) * num_q_heads() * d;
    query = Buffer(dtype, q_elems, 0.0f);
    for (size_t i = 0; i < q_elems; ++i) query.set(i, normal(rng));
    out = Buffer(dtype, q_elems, nan);
  }

  int32_t num_q_heads() const { return num_kv_heads * group; }
  int64_t num_tokens() const { return query_start_loc.back(); }
  size_t slot(size_t r, int32_t p) const {
    return static_cast<size_t>(block_tables[r * table_stride + p / block_size]) * block_size + p % block_size;
  }

  PagedAttentionArgs args(float scale) {
    PagedAttentionArgs a;
    a.query = query.data();
    a.query_stride_token = static_cast<int64_t>(num_q_heads()) * head_dim;
    a.query_stride_head = head_dim;
    a.query_dtype = query.dtype;
    a.out = out.data();
    a.out_stride_token = a.query_stride_token;
    a.out_stride_head = head_dim;
    a.out_dtype = out.dtype;
    a.k_cache = k.data();
    a.v_cache = v.data();
    a.kv_dtype = k.dtype;
    a.num_blocks = num_blocks;
    a.block_size = block_size;
    a.num_kv_heads = num_kv_heads;
    a.head_dim = head_dim;
    a.num_q_heads = num_q_heads();
    a.num_requests = static_cast<int32_t>(context_lens.size());
    a.num_tokens = num_tokens();
    a.query_start_loc = query_start_loc.data();
    a.context_lens = context_lens.data();
    a.block_tables = block_tables.data();
    a.block_table_stride = table_stride;
    a.scale = scale;
    return a;
  }

  // Naive causal attention in double: [T, Hq, D].
  std::vector<double> reference(float scale) const {
    const int32_t hq = num_q_heads(), d = head_dim;
    std::vector<double> ref(static_cast<size_t>(num_tokens()) * hq * d, 0.0);
    for (size_t r = 0; r < context_lens.size(); ++r) {
      const int32_t qlen = query_start_loc[r + 1] - query_start_loc[r], ctx = context_lens[r];
      for (int32_t i = 0; i < qlen; ++i) {
        const int64_t t = query_start_loc[r] + i;
        const int32_t visible = ctx - qlen + i + 1;
        for (int32_t qh = 0; qh < hq; ++qh) {
          const int32_t kh = qh / group;
          std::vector<double> s(visible);
          double mx = -INFINITY;
          for (int32_t p = 0; p < visible; ++p) {
            double dot = 0;
            for (int32_t e = 0; e < d; ++e) {
              dot += static_cast<double>(query.at((t * hq + qh) * d + e)) * k.at((slot(r, p) * num_kv_heads + kh) * d + e);
            }
            s[p] = dot * scale;
            mx = std::max(mx, s[p]);
          }
          double sum = 0;
          for (double& x : s) sum += (x = std::exp(x - mx));
          for (int32_t p = 0; p < visible; ++p)
            for (int32_t e = 0; e < d; ++e)
              ref[(t * hq + qh) * d + e] += s[p] / sum * v.at((slot(r, p) * num_kv_heads + kh) * d + e);
        }
      }
    }
    return ref;
  }

  // max |out - ref| / max |ref|; +inf when an output element is NaN (unwritten) or inf.
  double relative_error(const std::vector<double>& ref) const {
    double err = 0, scale = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double o = out.at(i);
      if (!std::isfinite(o)) return INFINITY;
      err = std::max(err, std::abs(o - ref[i]));
      scale = std::max(scale, std::abs(ref[i]));
    }
    return err / std::max(scale, 1e-12);
  }
};

}  // namespace trillium::test
