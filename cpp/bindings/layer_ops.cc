// Python binding of the fused decoder-layer operations (trillium/kernels/layer_ops.h). Pointers,
// sizes and strides in; the typed wrappers in python/trillium/ops/layer_ops.py check tensors.
// The operations are short, so the GIL is released only around the work itself.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>

#include "bindings.h"
#include "trillium/kernels/layer_ops.h"

namespace py = pybind11;

namespace trillium::bindings {
namespace {

template <typename T>
T* ptr(std::uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

template <typename Args, typename Fn>
void run(const Args& a, Fn fn) {
  Status st;
  {
    py::gil_scoped_release release;
    st = fn(a);
  }
  if (!st.ok()) throw std::invalid_argument(st.message());
}

}  // namespace

void bind_layer_ops(py::module_& m) {
  m.def(
      "rms_norm",
      [](std::uintptr_t x, int64_t x_stride, std::uintptr_t residual, int64_t residual_stride, std::uintptr_t weight,
         std::uintptr_t out, int64_t out_stride, int64_t rows, int64_t hidden, float eps) {
        RmsNormArgs a;
        a.x = ptr<const float>(x);
        a.x_stride = x_stride;
        a.residual = ptr<float>(residual);
        a.residual_stride = residual_stride;
        a.weight = ptr<const float>(weight);
        a.out = ptr<float>(out);
        a.out_stride = out_stride;
        a.rows = rows;
        a.hidden = hidden;
        a.eps = eps;
        run(a, rms_norm);
      },
      py::arg("x"), py::arg("x_stride"), py::arg("residual"), py::arg("residual_stride"), py::arg("weight"),
      py::arg("out"), py::arg("out_stride"), py::arg("rows"), py::arg("hidden"), py::arg("eps"),
      "RMSNorm of fp32 rows (pointers), with the residual add folded in when residual != 0.");
  m.def(
      "silu_and_mul",
      [](std::uintptr_t gate_up, int64_t gate_up_stride, std::uintptr_t out, int64_t out_stride, int64_t rows,
         int64_t inter) {
        SiluMulArgs a;
        a.gate_up = ptr<const float>(gate_up);
        a.gate_up_stride = gate_up_stride;
        a.out = ptr<float>(out);
        a.out_stride = out_stride;
        a.rows = rows;
        a.inter = inter;
        run(a, silu_and_mul);
      },
      py::arg("gate_up"), py::arg("gate_up_stride"), py::arg("out"), py::arg("out_stride"), py::arg("rows"),
      py::arg("inter"), "out = silu(gate) * up over fp32 rows [gate | up] (pointers).");
  m.def(
      "rotary_inplace",
      [](std::uintptr_t x, int64_t stride_token, int64_t stride_head, int64_t tokens, int64_t heads, int64_t head_dim,
         std::uintptr_t cos, std::uintptr_t sin, int64_t max_positions, std::uintptr_t positions) {
        RotaryArgs a;
        a.x = ptr<float>(x);
        a.stride_token = stride_token;
        a.stride_head = stride_head;
        a.tokens = tokens;
        a.heads = heads;
        a.head_dim = head_dim;
        a.cos = ptr<const float>(cos);
        a.sin = ptr<const float>(sin);
        a.max_positions = max_positions;
        a.positions = ptr<const int64_t>(positions);
        run(a, rotary_inplace);
      },
      py::arg("x"), py::arg("stride_token"), py::arg("stride_head"), py::arg("tokens"), py::arg("heads"),
      py::arg("head_dim"), py::arg("cos"), py::arg("sin"), py::arg("max_positions"), py::arg("positions"),
      "Rotate-half RoPE in place on fp32 [tokens, heads, head_dim] (pointers), from cos/sin tables.");
}

}  // namespace trillium::bindings
