// The verify kernel's Python-side argument, shared by the CPU (spec_verify.cc) and CUDA
// (cuda/module.cc) bindings so both modules take the same object: the NamedTuple VerifySpec of
// python/trillium/ops/kernel_specs.py, read by field name (kernel_args.h). *_ptr fields are
// addresses (host for _core, device for _cuda), 0 for an absent tensor; strides count elements.
// Shapes and meanings: trillium/kernels/spec_verify.h.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "kernel_args.h"
#include "trillium/kernels/spec_verify.h"

namespace trillium::bindings {

struct VerifySpec {
  static constexpr char kPyName[] = "VerifySpec";
  int64_t num_requests = 0;
  int64_t max_draft = 0;
  int64_t vocab_size = 0;
  std::uintptr_t target_ptr = 0;
  int64_t target_stride_request = 0;
  int64_t target_stride_position = 0;
  std::uintptr_t draft_tokens_ptr = 0;
  bool draft_tokens_int64 = false;
  std::uintptr_t num_draft_ptr = 0;
  std::uintptr_t modes_ptr = 0;
  std::uintptr_t draft_probs_ptr = 0;
  int64_t draft_probs_stride_request = 0;
  int64_t draft_probs_stride_position = 0;
  std::uintptr_t uniforms_ptr = 0;
  std::uintptr_t residual_uniforms_ptr = 0;
  std::uintptr_t num_accepted_ptr = 0;
  std::uintptr_t output_tokens_ptr = 0;

  static bool load(pybind11::handle src, bool convert, VerifySpec* s) {
    return TRILLIUM_LOAD_FIELD(src, convert, *s, num_requests) && TRILLIUM_LOAD_FIELD(src, convert, *s, max_draft) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, vocab_size) && TRILLIUM_LOAD_FIELD(src, convert, *s, target_ptr) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, target_stride_request) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, target_stride_position) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, draft_tokens_ptr) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, draft_tokens_int64) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, num_draft_ptr) && TRILLIUM_LOAD_FIELD(src, convert, *s, modes_ptr) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, draft_probs_ptr) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, draft_probs_stride_request) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, draft_probs_stride_position) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, uniforms_ptr) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, residual_uniforms_ptr) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, num_accepted_ptr) &&
           TRILLIUM_LOAD_FIELD(src, convert, *s, output_tokens_ptr);
  }
};

inline SpecVerifyArgs spec_verify_args(const VerifySpec& s) {
  SpecVerifyArgs a;
  a.num_requests = s.num_requests;
  a.max_draft = s.max_draft;
  a.vocab_size = s.vocab_size;
  a.target = from_address<const float>(s.target_ptr);
  a.target_stride_request = s.target_stride_request;
  a.target_stride_position = s.target_stride_position;
  a.draft_tokens = from_address<const void>(s.draft_tokens_ptr);
  a.draft_tokens_int64 = s.draft_tokens_int64;
  a.num_draft = from_address<const int32_t>(s.num_draft_ptr);
  a.modes = from_address<const int32_t>(s.modes_ptr);
  a.draft_probs = from_address<const float>(s.draft_probs_ptr);
  a.draft_probs_stride_request = s.draft_probs_stride_request;
  a.draft_probs_stride_position = s.draft_probs_stride_position;
  a.uniforms = from_address<const double>(s.uniforms_ptr);
  a.residual_uniforms = from_address<const double>(s.residual_uniforms_ptr);
  a.num_accepted = from_address<int32_t>(s.num_accepted_ptr);
  a.output_tokens = from_address<int32_t>(s.output_tokens_ptr);
  return a;
}

}  // namespace trillium::bindings

TRILLIUM_SPEC_CASTER(trillium::bindings::VerifySpec)
