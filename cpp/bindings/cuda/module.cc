// trillium._cuda: the binding of the CUDA launchers (cuda/launchers.h). A separate extension with
// static cudart, so that `import trillium` works on machines without it; callers import it under
// try/except ImportError. Tensors cross as integer device pointers (tensor.data_ptr()) plus sizes;
// streams as integers (torch.cuda.current_stream().cuda_stream), 0 meaning the legacy default
// stream. The attention, KV-store, bitmask and verify entry points take the same named specs as
// trillium._core's (../kernel_specs.h, ../token_bitmask_spec.h, ../spec_verify_spec.h).
//
// Error mapping (cudaError_t, not trillium::Status: launchers are CUDA code):
//   cudaErrorInvalidValue from a launcher (arguments it rejects on the host) -> ValueError
//   any other CUDA error                                                      -> RuntimeError
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernel_specs.h"
#include "launchers.h"
#include "spec_verify_spec.h"
#include "token_bitmask_spec.h"

namespace py = pybind11;
using trillium::bindings::BatchSpec;
using trillium::bindings::BitmaskSpec;
using trillium::bindings::CacheSpec;
using trillium::bindings::LogitsSpec;
using trillium::bindings::RowsSpec;
using trillium::bindings::VerifySpec;

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
  }
}

// cudaErrorInvalidValue from a launcher means arguments it rejects on the host: ValueError.
void check_args(cudaError_t err, const char* what) {
  if (err == cudaErrorInvalidValue) {
    (void)cudaGetLastError();
    throw std::invalid_argument(std::string(what) + ": unsupported or inconsistent arguments (" +
                                cudaGetErrorString(err) + ")");
  }
  check(err, what);
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

  m.def(
      "store_kv",
      [](const RowsSpec& key, const RowsSpec& value, const CacheSpec& cache, std::uintptr_t slot_mapping,
         int64_t num_tokens, std::uintptr_t stream) {
        const trillium::KVStoreArgs a = trillium::bindings::store_args(key, value, cache, slot_mapping, num_tokens);
        check_args(trillium::cuda::store_kv(a, reinterpret_cast<cudaStream_t>(stream)), "store_kv");
      },
      py::arg("key"), py::arg("value"), py::arg("cache"), py::arg("slot_mapping"), py::arg("num_tokens"),
      py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>(),
      "Asynchronously write key/value rows into their slots (int64 device slot_mapping; negative or "
      "out-of-pool slots are skipped). Specs as trillium._core.store_kv.");

  m.def(
      "paged_attention",
      [](const RowsSpec& query, const RowsSpec& out, const CacheSpec& cache, const BatchSpec& batch, float scale,
         bool decode, int32_t max_query_len, std::uintptr_t stream) {
        (void)decode;  // one kernel serves both; the grid comes from max_query_len
        const trillium::PagedAttentionArgs a = trillium::bindings::attention_args(query, out, cache, batch, scale);
        check_args(trillium::cuda::paged_attention(a, max_query_len, reinterpret_cast<cudaStream_t>(stream)),
                   "paged_attention");
      },
      py::arg("query"), py::arg("out"), py::arg("cache"), py::arg("batch"), py::arg("scale"), py::arg("decode"),
      py::arg("max_query_len"), py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>(),
      "Asynchronous paged attention (decode or extend) on stream; specs as trillium._core.paged_attention, "
      "device pointers. head_dim 64, 128 or 256. ValueError on arguments the launcher rejects.");

  m.def(
      "plan_paged_attention_decode",
      [](const RowsSpec& query, const RowsSpec& out, const CacheSpec& cache, const BatchSpec& batch,
         int32_t max_context_len, int32_t num_sms) {
        const trillium::PagedAttentionArgs a = trillium::bindings::attention_args(query, out, cache, batch, 1.0f);
        const trillium::cuda::DecodePlan p = trillium::cuda::plan_paged_attention_decode(a, max_context_len, num_sms);
        return py::make_tuple(p.supported, p.split, p.splits, p.workspace_bytes);
      },
      py::arg("query"), py::arg("out"), py::arg("cache"), py::arg("batch"), py::arg("max_context_len"),
      py::arg("num_sms"),
      "(supported, split, splits, workspace_bytes) of the split-KV decode kernel for these sizes: "
      "supported is False where it does not apply (use paged_attention).");

  m.def(
      "paged_attention_decode",
      [](const RowsSpec& query, const RowsSpec& out, const CacheSpec& cache, const BatchSpec& batch, float scale,
         int32_t split, int32_t splits, std::uintptr_t workspace, std::size_t workspace_bytes, std::uintptr_t stream) {
        const trillium::PagedAttentionArgs a = trillium::bindings::attention_args(query, out, cache, batch, scale);
        trillium::cuda::DecodePlan p = trillium::cuda::plan_paged_attention_decode(a, split * splits, 0);
        p.split = split;  // the caller's plan (sizes re-checked above, the split taken as planned)
        p.splits = splits;
        p.workspace_bytes = splits > 1 ? sizeof(float) * static_cast<std::size_t>(a.num_requests) * a.num_q_heads *
                                             splits * (static_cast<std::size_t>(a.head_dim) + 2)
                                       : 0;
        check_args(trillium::cuda::paged_attention_decode(a, p, reinterpret_cast<void*>(workspace), workspace_bytes,
                                                          reinterpret_cast<cudaStream_t>(stream)),
                   "paged_attention_decode");
      },
      py::arg("query"), py::arg("out"), py::arg("cache"), py::arg("batch"), py::arg("scale"), py::arg("split"),
      py::arg("splits"), py::arg("workspace"), py::arg("workspace_bytes"), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>(),
      "Asynchronous split-KV decode attention over a bf16 pool with a plan from plan_paged_attention_decode; "
      "ValueError on arguments the launcher rejects.");

  m.def(
      "apply_token_bitmask",
      [](const LogitsSpec& logits, const BitmaskSpec& bitmask, std::uintptr_t mask_rows, std::uintptr_t stream) {
        const trillium::TokenBitmaskArgs a = trillium::bindings::token_bitmask_args(logits, bitmask, mask_rows);
        check_args(trillium::cuda::apply_token_bitmask(a, reinterpret_cast<cudaStream_t>(stream)),
                   "apply_token_bitmask");
      },
      py::arg("logits"), py::arg("bitmask"), py::arg("mask_rows"), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>(),
      "Asynchronous apply_token_bitmask on stream; arguments as trillium._core.apply_token_bitmask, "
      "device pointers. ValueError on sizes the launcher rejects.");

  m.def(
      "spec_verify",
      [](const VerifySpec& spec, std::uintptr_t stream) {
        const trillium::SpecVerifyArgs a = trillium::bindings::spec_verify_args(spec);
        check_args(trillium::cuda::spec_verify(a, reinterpret_cast<cudaStream_t>(stream)), "spec_verify");
      },
      py::arg("spec"), py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>(),
      "Asynchronous spec_verify on stream (spec as trillium._core.spec_verify, device addresses). ValueError "
      "on sizes the launcher rejects; a request with a bad device-resident value (mode, num_draft, token "
      "id, uniform) gets num_accepted -1 and an all -1 output row.");
}
