// store_kv: one row copy (with dtype conversion) per (token, KV head), parallel over tokens when
// the step is large enough to pay for waking the OpenMP threads.
#include "trillium/kernels/kv_store.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace trillium {
namespace {

constexpr int64_t kParallelMinElems = 1 << 16;  // below this one thread copies faster than two

template <class Src, class Dst>
void copy_row(const Src* src, Dst* dst, int32_t n) {
  if constexpr (std::is_same_v<Src, Dst>) {
    std::memcpy(dst, src, sizeof(Src) * static_cast<size_t>(n));
  } else if constexpr (std::is_same_v<Dst, bf16_t>) {
    for (int32_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
  } else {
    for (int32_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
  }
}

template <class Src, class Dst>
void store_typed(const KVStoreArgs& a, int threads) {
  const int64_t row = static_cast<int64_t>(a.num_kv_heads) * a.head_dim;  // elements per slot
  [[maybe_unused]] const bool parallel = threads > 1 && a.num_tokens * row * 2 >= kParallelMinElems;
#pragma omp parallel for schedule(static) num_threads(threads) if (parallel)
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const int64_t slot = a.slot_mapping[t];
    if (slot < 0) continue;
    const Src* k = static_cast<const Src*>(a.key) + t * a.key_stride_token;
    const Src* v = static_cast<const Src*>(a.value) + t * a.value_stride_token;
    Dst* kc = static_cast<Dst*>(a.k_cache) + slot * row;
    Dst* vc = static_cast<Dst*>(a.v_cache) + slot * row;
    for (int32_t h = 0; h < a.num_kv_heads; ++h) {
      copy_row(k + h * a.key_stride_head, kc + h * a.head_dim, a.head_dim);
      copy_row(v + h * a.value_stride_head, vc + h * a.head_dim, a.head_dim);
    }
  }
}

}  // namespace

Status store_kv(const KVStoreArgs& a) {
  auto bad = [](const std::string& m) { return Status::InvalidArgument("store_kv: " + m); };
  if (!valid_dtype(a.src_dtype) || !valid_dtype(a.cache_dtype)) return bad("dtypes must be float32 or bfloat16");
  if (a.num_blocks < 0 || a.block_size <= 0 || a.num_kv_heads <= 0 || a.head_dim <= 0 || a.num_tokens < 0) {
    return bad("need num_blocks >= 0, block_size, num_kv_heads, head_dim > 0 and num_tokens >= 0");
  }
  if (a.num_tokens == 0) return Status::Ok();
  if (a.key == nullptr || a.value == nullptr || a.k_cache == nullptr || a.v_cache == nullptr ||
      a.slot_mapping == nullptr) {
    return bad("null pointer");
  }
  const int64_t num_slots = static_cast<int64_t>(a.num_blocks) * a.block_size;
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    if (a.slot_mapping[t] >= num_slots) {
      return bad("token " + std::to_string(t) + ": slot " + std::to_string(a.slot_mapping[t]) + " outside [0, " +
                 std::to_string(num_slots) + ")");
    }
  }
#ifdef _OPENMP
  const int threads = a.num_threads > 0 ? a.num_threads : omp_get_max_threads();
#else
  const int threads = 1;
#endif
  const bool src_f32 = a.src_dtype == DType::kF32, dst_f32 = a.cache_dtype == DType::kF32;
  if (src_f32 && dst_f32) store_typed<float, float>(a, threads);
  if (src_f32 && !dst_f32) store_typed<float, bf16_t>(a, threads);
  if (!src_f32 && dst_f32) store_typed<bf16_t, float>(a, threads);
  if (!src_f32 && !dst_f32) store_typed<bf16_t, bf16_t>(a, threads);
  return Status::Ok();
}

}  // namespace trillium
