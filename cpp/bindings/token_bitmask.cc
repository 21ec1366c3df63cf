// Python binding of the token-bitmask kernel (trillium/kernels/token_bitmask.h). Pointers and
// sizes in (token_bitmask_spec.h); python/trillium/ops/token_bitmask.py checks the tensors. The
// GIL is released around the kernel: the grammar thread fills the next masks meanwhile.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>

#include "bindings.h"
#include "status.h"
#include "token_bitmask_spec.h"

namespace py = pybind11;

namespace trillium::bindings {

void bind_token_bitmask(py::module_& m) {
  m.def(
      "apply_token_bitmask",
      [](const LogitsSpec& logits, const BitmaskSpec& bitmask, std::uintptr_t mask_rows) {
        const TokenBitmaskArgs a = token_bitmask_args(logits, bitmask, mask_rows);
        run_without_gil([&] { return apply_token_bitmask(a); });
      },
      py::arg("logits"), py::arg("bitmask"), py::arg("mask_rows"),
      "Set logits of tokens whose bit is 0 to -inf, in place (see trillium/kernels/token_bitmask.h).\n\n"
      "logits: LogitsSpec(data_ptr, dtype, row_stride, num_rows, vocab_size), dtype 0 float32 / 1 bfloat16; "
      "bitmask: BitmaskSpec(int32 data_ptr, row_stride, num_mask_rows, num_words) -- trillium.ops.kernel_specs; "
      "mask_rows: int32 [num_rows] pointer "
      "(-1 = leave the row unmasked) or 0 for row r -> bitmask row r. Releases the GIL; ValueError "
      "(nothing written) on bad sizes or a mask row out of range.");
}

}  // namespace trillium::bindings
