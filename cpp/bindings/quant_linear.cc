// Python binding of the block-quantized linear kernel (trillium/kernels/quant_linear.h).
//
// As for the other kernels, tensors arrive as data pointers plus sizes and strides; the typed
// wrapper python/trillium/ops/quant_linear.py checks dtypes, shapes and contiguity. The matmul
// releases the GIL.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "bindings.h"
#include "kernel_args.h"
#include "quant_weight.h"
#include "status.h"
#include "trillium/kernels/quant_linear.h"

namespace py = pybind11;

namespace trillium::bindings {

void bind_quant_linear(py::module_& m) {
  m.attr("QUANT_BLOCK") = kQuantBlock;
  m.attr("QUANT_GROUP_COLS") = kQuantGroupCols;
  m.def(
      "quant_linear_sizes",
      [](int64_t out_features, int64_t in_features, int32_t bits) {
        return py::make_tuple(quant_linear_packed_bytes(out_features, in_features, bits),
                              quant_linear_scale_count(out_features, in_features, bits));
      },
      py::arg("out_features"), py::arg("in_features"), py::arg("bits"),
      "(packed code bytes, scale count) of an [out_features, in_features] weight.");
  m.def("quant_linear_super_count", &quant_linear_super_count, py::arg("out_features"), py::arg("in_features"),
        "Floats of two-level super scales (and super mins) of an [out_features, in_features] weight.");
  m.def(
      "quant_linear_pack_two_level",
      [](std::uintptr_t codes, std::uintptr_t super_scale, std::uintptr_t super_min, std::uintptr_t sub_scale,
         std::uintptr_t sub_min, int64_t out_features, int64_t in_features, int32_t bits, std::uintptr_t packed_codes,
         std::uintptr_t packed_super, std::uintptr_t packed_super_min, std::uintptr_t packed_sub,
         std::uintptr_t packed_sub_min) {
        run_without_gil([&] {
          return quant_linear_pack_two_level(
              from_address<const int8_t>(codes), from_address<const float>(super_scale),
              from_address<const float>(super_min), from_address<const int8_t>(sub_scale),
              from_address<const uint8_t>(sub_min), out_features, in_features, bits, from_address<void>(packed_codes),
              from_address<float>(packed_super), from_address<float>(packed_super_min),
              from_address<uint8_t>(packed_sub), from_address<uint8_t>(packed_sub_min));
        });
      },
      py::arg("codes"), py::arg("super_scale"), py::arg("super_min"), py::arg("sub_scale"), py::arg("sub_min"),
      py::arg("out_features"), py::arg("in_features"), py::arg("bits"), py::arg("packed_codes"),
      py::arg("packed_super"), py::arg("packed_super_min"), py::arg("packed_sub"), py::arg("packed_sub_min"),
      "Pack codes [N, K] with two-level scales (K-quants): fp32 super scale/min [N, K/256], int8/uint8 "
      "sub-scale [N, K/S] and uint8 sub-min [N, K/32] (pointers; mins 0 for symmetric codes).");
  m.def(
      "quant_linear_pack",
      [](std::uintptr_t codes, std::uintptr_t scale, std::uintptr_t min, int64_t out_features, int64_t in_features,
         int32_t bits, std::uintptr_t packed_codes, std::uintptr_t packed_scales, std::uintptr_t packed_mins) {
        run_without_gil([&] {
          return quant_linear_pack(from_address<const int8_t>(codes), from_address<const float>(scale),
                                   from_address<const float>(min), out_features, in_features, bits,
                                   from_address<void>(packed_codes), from_address<float>(packed_scales),
                                   from_address<float>(packed_mins));
        });
      },
      py::arg("codes"), py::arg("scale"), py::arg("min"), py::arg("out_features"), py::arg("in_features"),
      py::arg("bits"), py::arg("packed_codes"), py::arg("packed_scales"), py::arg("packed_mins"),
      "Pack row-major int8 codes [N, K] and fp32 scale/min [N, K/S] (pointers; S = 32, or 16 for 6 bits; "
      "min and packed_mins both 0 for the format's symmetric codes) into the kernel layout.");
  m.def(
      "quant_linear_dequantize_rows",
      [](int64_t out_features, int64_t in_features, int32_t bits, std::uintptr_t codes, std::uintptr_t scales,
         std::uintptr_t mins, std::uintptr_t sub_scales, std::uintptr_t rows, int64_t num_rows, std::uintptr_t out,
         int64_t out_stride, int num_threads) {
        const QuantWeightView w = quant_weight_view(out_features, in_features, bits, codes, scales, mins, sub_scales);
        run_without_gil([&] {
          return quant_linear_dequantize_rows(w, from_address<const int64_t>(rows), num_rows, from_address<float>(out),
                                              out_stride, num_threads);
        });
      },
      py::arg("out_features"), py::arg("in_features"), py::arg("bits"), py::arg("codes"), py::arg("scales"),
      py::arg("mins"), py::arg("sub_scales"), py::arg("rows"), py::arg("num_rows"), py::arg("out"), py::arg("out_stride"),
      py::arg("num_threads") = 0,
      "out[i, :] = W[rows[i], :] dequantized (an embedding lookup over a packed weight; pointers).");
  m.def(
      "quant_linear",
      [](std::uintptr_t x, int64_t num_rows, int64_t x_stride, int64_t out_features, int64_t in_features, int32_t bits,
         std::uintptr_t codes, std::uintptr_t scales, std::uintptr_t mins, std::uintptr_t sub_scales, std::uintptr_t bias,
         std::uintptr_t out, int64_t out_stride, int num_threads, int32_t activations) {
        QuantLinearArgs a;
        a.x = from_address<const float>(x);
        a.num_rows = num_rows;
        a.x_stride = x_stride;
        a.weight = quant_weight_view(out_features, in_features, bits, codes, scales, mins, sub_scales);
        a.bias = from_address<const float>(bias);
        a.out = from_address<float>(out);
        a.out_stride = out_stride;
        a.num_threads = num_threads;
        a.activations = static_cast<QuantActivations>(activations);
        run_without_gil([&] { return quant_linear(a); });
      },
      py::arg("x"), py::arg("num_rows"), py::arg("x_stride"), py::arg("out_features"), py::arg("in_features"),
      py::arg("bits"), py::arg("codes"), py::arg("scales"), py::arg("mins"), py::arg("sub_scales"), py::arg("bias"),
      py::arg("out"),
      py::arg("out_stride"), py::arg("num_threads") = 0, py::arg("activations") = 0,
      "out[M, N] = x[M, K] . W^T (+ bias) with a packed block-quantized W; fp32 x and out (pointers). "
      "activations: 0 exact fp32, 1 rounded to int8 per 32-block, 2 rounded to int16 per 32-block "
      "(quant_linear.h).");
}

}  // namespace trillium::bindings
