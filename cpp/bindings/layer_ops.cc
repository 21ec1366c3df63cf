// Python binding of the fused decoder-layer operations (trillium/kernels/layer_ops.h). Pointers,
// sizes and strides in; the typed wrappers in python/trillium/ops/layer_ops.py check tensors.
// The operations are short, so the GIL is released only around the work itself.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "bindings.h"
#include "kernel_args.h"
#include "status.h"
#include "trillium/kernels/layer_ops.h"

namespace py = pybind11;

namespace trillium::bindings {

void bind_layer_ops(py::module_& m) {
  m.def(
      "rms_norm",
      [](std::uintptr_t x, int64_t x_stride, std::uintptr_t residual, int64_t residual_stride, std::uintptr_t weight,
         std::uintptr_t out, int64_t out_stride, int64_t rows, int64_t hidden, float eps) {
        RmsNormArgs a;
        a.x = from_address<const float>(x);
        a.x_stride = x_stride;
        a.residual = from_address<float>(residual);
        a.residual_stride = residual_stride;
        a.weight = from_address<const float>(weight);
        a.out = from_address<float>(out);
        a.out_stride = out_stride;
        a.rows = rows;
        a.hidden = hidden;
        a.eps = eps;
        run_without_gil([&] { return rms_norm(a); });
      },
      py::arg("x"), py::arg("x_stride"), py::arg("residual"), py::arg("residual_stride"), py::arg("weight"),
      py::arg("out"), py::arg("out_stride"), py::arg("rows"), py::arg("hidden"), py::arg("eps"),
      "RMSNorm of fp32 rows (pointers), with the residual add folded in when residual != 0.");
  m.def(
      "silu_and_mul",
      [](std::uintptr_t gate_up, int64_t gate_up_stride, std::uintptr_t out, int64_t out_stride, int64_t rows,
         int64_t inter, int32_t activation) {
        SiluMulArgs a;
        a.activation = to_activation(activation);
        a.gate_up = from_address<const float>(gate_up);
        a.gate_up_stride = gate_up_stride;
        a.out = from_address<float>(out);
        a.out_stride = out_stride;
        a.rows = rows;
        a.inter = inter;
        run_without_gil([&] { return silu_and_mul(a); });
      },
      py::arg("gate_up"), py::arg("gate_up_stride"), py::arg("out"), py::arg("out_stride"), py::arg("rows"),
      py::arg("inter"), py::arg("activation") = 0,
      "out = act(gate) * up over fp32 rows [gate | up] (pointers); activation 0 SiLU, 1 GELU-tanh.");
  m.def(
      "rotary_inplace",
      [](std::uintptr_t x, int64_t stride_token, int64_t stride_head, int64_t tokens, int64_t heads, int64_t head_dim,
         std::uintptr_t cos, std::uintptr_t sin, int64_t max_positions, std::uintptr_t positions) {
        RotaryArgs a;
        a.x = from_address<float>(x);
        a.stride_token = stride_token;
        a.stride_head = stride_head;
        a.tokens = tokens;
        a.heads = heads;
        a.head_dim = head_dim;
        a.cos = from_address<const float>(cos);
        a.sin = from_address<const float>(sin);
        a.max_positions = max_positions;
        a.positions = from_address<const int64_t>(positions);
        run_without_gil([&] { return rotary_inplace(a); });
      },
      py::arg("x"), py::arg("stride_token"), py::arg("stride_head"), py::arg("tokens"), py::arg("heads"),
      py::arg("head_dim"), py::arg("cos"), py::arg("sin"), py::arg("max_positions"), py::arg("positions"),
      "Rotate-half RoPE in place on fp32 [tokens, heads, head_dim] (pointers), from cos/sin tables.");
}

}  // namespace trillium::bindings
