// The token-bitmask kernel's Python-side arguments, shared by the CPU (token_bitmask.cc) and CUDA
// (cuda/module.cc) bindings so both modules take the same objects: the NamedTuples LogitsSpec and
// BitmaskSpec of python/trillium/ops/kernel_specs.py, read by field name (kernel_args.h), plus
//
//   mask_rows: address of int32 [num_rows] (-1 = leave the row unmasked), or 0 (row r takes
//              bitmask row r)
//
// dtype codes are trillium::DType (0 float32, 1 bfloat16); strides count elements.
// token_bitmask_args throws std::invalid_argument (ValueError) for an unknown dtype.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "kernel_args.h"
#include "trillium/kernels/token_bitmask.h"

namespace trillium::bindings {

// Logits [num_rows, vocab_size], rows contiguous; modified in place.
struct LogitsSpec {
  static constexpr char kPyName[] = "LogitsSpec";
  std::uintptr_t data_ptr = 0;
  int32_t dtype = 0;
  int64_t row_stride = 0;
  int64_t num_rows = 0;
  int64_t vocab_size = 0;

  static bool load(pybind11::handle src, bool convert, LogitsSpec* s) {
    return TRILLIUM_LOAD_FIELD(src, convert, *s, data_ptr) && TRILLIUM_LOAD_FIELD(src, convert, *s, dtype) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, row_stride) && TRILLIUM_LOAD_FIELD(src, convert, *s, num_rows) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, vocab_size);
  }
};

// Bitmask [num_mask_rows, num_words] of int32 words, one bit per token.
struct BitmaskSpec {
  static constexpr char kPyName[] = "BitmaskSpec";
  std::uintptr_t data_ptr = 0;
  int64_t row_stride = 0;
  int64_t num_mask_rows = 0;
  int64_t num_words = 0;

  static bool load(pybind11::handle src, bool convert, BitmaskSpec* s) {
    return TRILLIUM_LOAD_FIELD(src, convert, *s, data_ptr) && TRILLIUM_LOAD_FIELD(src, convert, *s, row_stride) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, num_mask_rows) && TRILLIUM_LOAD_FIELD(src, convert, *s, num_words);
  }
};

inline TokenBitmaskArgs token_bitmask_args(const LogitsSpec& logits, const BitmaskSpec& bitmask,
                                           std::uintptr_t mask_rows) {
  TokenBitmaskArgs a;
  a.logits = from_address<void>(logits.data_ptr);
  a.logits_dtype = to_dtype(logits.dtype);
  a.logits_stride = logits.row_stride;
  a.num_rows = logits.num_rows;
  a.vocab_size = logits.vocab_size;
  a.bitmask = from_address<const int32_t>(bitmask.data_ptr);
  a.bitmask_stride = bitmask.row_stride;
  a.num_mask_rows = bitmask.num_mask_rows;
  a.num_words = bitmask.num_words;
  a.mask_rows = from_address<const int32_t>(mask_rows);
  return a;
}

}  // namespace trillium::bindings

TRILLIUM_SPEC_CASTER(trillium::bindings::LogitsSpec)
TRILLIUM_SPEC_CASTER(trillium::bindings::BitmaskSpec)
