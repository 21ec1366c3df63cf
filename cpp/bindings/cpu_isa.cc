// Python binding of the kernel ISA selection (trillium/cpu_isa.h): which instruction set every CPU
// kernel family runs on, by name ('portable', 'avx2', 'avx512'); and the calling thread's OpenMP
// worker team, which a host that runs kernels on one dedicated thread releases elsewhere.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "bindings.h"
#include "status.h"
#include "trillium/cpu_isa.h"

namespace py = pybind11;

namespace trillium::bindings {

void bind_cpu_isa(py::module_& m) {
  m.def(
      "kernel_isa", [] { return std::string(kernel_isa_name(kernel_isa())); },
      "Instruction set the CPU kernels use now: 'avx512vnni', 'avx512', 'avx2' or 'portable'.");
  m.def(
      "supported_kernel_isas",
      [] {
        std::vector<std::string> out;
        for (KernelIsa isa : kAllKernelIsas) {
          if (kernel_isa_supported(isa)) out.emplace_back(kernel_isa_name(isa));
        }
        return out;
      },
      "Instruction sets this CPU and build can run, worst first.");
  m.def(
      "set_kernel_isa",
      [](const std::string& name) {
        KernelIsa isa = KernelIsa::kPortable;
        raise_if_error(parse_kernel_isa(name.c_str(), &isa));
        raise_if_error(set_kernel_isa(isa));
      },
      py::arg("name"),
      "Force the CPU kernels onto one instruction set (tests, benchmarks). ValueError if unknown or "
      "unsupported here. Process-wide; do not call while kernels run on other threads.");
  m.def(
      "release_openmp_threads",
      [] {
#if defined(_OPENMP)
        // libgomp frees the calling thread's worker pool (omp_pause_resource_all pauses the host).
        return omp_pause_resource_all(omp_pause_soft) == 0;
#else
        return false;
#endif
      },
      "End the OpenMP worker threads this thread started (they are re-created if it runs a parallel "
      "region again). With one team per calling thread, a second idle team makes libgomp cut its "
      "spin-wait for every team: call it on threads that no longer run kernels. True if released.");
}

}  // namespace trillium::bindings
