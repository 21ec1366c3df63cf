// Python binding of the speculative-decoding verify kernel (trillium/kernels/spec_verify.h).
// Pointers and sizes in (spec_verify_spec.h); python/trillium/ops/spec_verify.py checks the
// tensors. The GIL is released around the kernel.
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "spec_verify_spec.h"
#include "status.h"

namespace py = pybind11;

namespace trillium::bindings {

void bind_spec_verify(py::module_& m) {
  m.def(
      "spec_verify",
      [](const VerifySpec& spec, int num_threads) {
        SpecVerifyArgs a = spec_verify_args(spec);
        a.num_threads = num_threads;
        run_without_gil([&] { return spec_verify(a); });
      },
      py::arg("spec"), py::arg("num_threads"),
      "Verify one step's draft tokens (see trillium/kernels/spec_verify.h): writes num_accepted and "
      "output_tokens. spec: VerifySpec of trillium.ops.kernel_specs (host addresses). num_threads: 0 = "
      "OpenMP's default. Releases the GIL; ValueError (nothing written) on a bad size, mode, draft count, "
      "token id or uniform, naming the request.");
}

}  // namespace trillium::bindings
