// trillium._cuda: CUDA kernels for NVIDIA GPUs. A separate extension with static cudart, so that
// `import trillium` works on machines without it; callers import it under try/except ImportError.
// Tensors cross as integer device pointers (tensor.data_ptr()) plus sizes; streams as integers
// (torch.cuda.current_stream().cuda_stream), 0 meaning the legacy default stream.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "launchers.h"

namespace py = pybind11;

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
  }
}

}  // namespace

#ifndef TRILLIUM_VERSION
#define TRILLIUM_VERSION "0.0.0"
#endif

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "trillium CUDA kernels";
  m.attr("__version__") = TRILLIUM_VERSION;
  m.attr("CUDART_VERSION") = CUDART_VERSION;

  m.def(
      "device_count",
      [] {
        int n = 0;
        const cudaError_t err = cudaGetDeviceCount(&n);
        // No GPU or no (new enough) driver means "no usable device", like torch.cuda.device_count().
        if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
          (void)cudaGetLastError();
          return 0;
        }
        check(err, "cudaGetDeviceCount");
        return n;
      },
      py::call_guard<py::gil_scoped_release>(),
      "Number of usable CUDA devices; 0 when there is no device or no driver.");

  m.def(
      "fill_",
      [](std::uintptr_t ptr, int64_t n, float value, std::uintptr_t stream) {
        if (n < 0) throw std::invalid_argument("fill_: n must be >= 0, got " + std::to_string(n));
        check(trillium::cuda::fill_f32(reinterpret_cast<float*>(ptr), n, value,
                                       reinterpret_cast<cudaStream_t>(stream)),
              "fill_f32 launch");
      },
      py::arg("ptr"), py::arg("n"), py::arg("value"), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>(),
      "Asynchronously set n float32 values at device pointer ptr to value on stream. "
      "RuntimeError carrying the CUDA error name if the launch fails.");
}
