// Integer arguments -> TokenBitmaskArgs, shared by the CPU (token_bitmask.cc) and CUDA
// (cuda/bindings.cc) bindings so that both modules take the same Python-side arguments:
//
//   logits: (data_ptr, dtype, row_stride, num_rows, vocab_size)
//   bitmask: (data_ptr, row_stride, num_mask_rows, num_words)      int32 words
//   mask_rows: data_ptr of int32 [num_rows], or 0 (row r takes bitmask row r)
//
// dtype codes are trillium::DType (0 float32, 1 bfloat16); strides count elements. Throws
// std::invalid_argument (ValueError) for an unknown dtype.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>

#include "trillium/kernels/token_bitmask.h"

namespace trillium::bindings {

using LogitsSpec = std::tuple<std::uintptr_t, int32_t, int64_t, int64_t, int64_t>;
using BitmaskSpec = std::tuple<std::uintptr_t, int64_t, int64_t, int64_t>;

inline TokenBitmaskArgs token_bitmask_args(const LogitsSpec& logits, const BitmaskSpec& bitmask,
                                           std::uintptr_t mask_rows) {
  TokenBitmaskArgs a;
  a.logits = reinterpret_cast<void*>(std::get<0>(logits));
  const auto dtype = static_cast<DType>(std::get<1>(logits));
  if (!valid_dtype(dtype)) throw std::invalid_argument("unknown dtype code " + std::to_string(std::get<1>(logits)));
  a.logits_dtype = dtype;
  a.logits_stride = std::get<2>(logits);
  a.num_rows = std::get<3>(logits);
  a.vocab_size = std::get<4>(logits);
  a.bitmask = reinterpret_cast<const int32_t*>(std::get<0>(bitmask));
  a.bitmask_stride = std::get<1>(bitmask);
  a.num_mask_rows = std::get<2>(bitmask);
  a.num_words = std::get<3>(bitmask);
  a.mask_rows = reinterpret_cast<const int32_t*>(mask_rows);
  return a;
}

}  // namespace trillium::bindings
