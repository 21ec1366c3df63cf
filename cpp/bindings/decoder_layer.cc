// Python binding of the one-call decoder layer (trillium/kernels/decoder_layer.h): DecoderStack
// holds every layer's weight and KV-pool addresses, bound once, and runs all layers of a step in
// one call with the GIL released. The typed wrapper is python/trillium/ops/decoder_stack.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "kernel_args.h"
#include "quant_weight.h"
#include "status.h"
#include "trillium/kernels/decoder_layer.h"

namespace py = pybind11;

namespace trillium::bindings {

namespace {

// (out_features, in_features, bits, codes, scales, mins, sub_scales) addresses of a packed weight.
using WeightTuple =
    std::tuple<int64_t, int64_t, int32_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t>;

QuantWeightView to_view(const WeightTuple& t) {
  return quant_weight_view(std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t), std::get<4>(t),
                           std::get<5>(t), std::get<6>(t));
}

// A fused projection's parts (quant_linear.h): one to kMaxQuantParts weights.
QuantWeightParts to_parts(const std::vector<WeightTuple>& parts) {
  if (parts.empty() || parts.size() > static_cast<size_t>(kMaxQuantParts)) {
    throw std::invalid_argument("a projection has 1 to 3 parts");
  }
  QuantWeightParts p;
  p.count = static_cast<int32_t>(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) p.part[i] = to_view(parts[i]);
  return p;
}

class DecoderStack {
 public:
  void add_layer(int64_t hidden, int64_t intermediate, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                 float rms_eps, std::uintptr_t input_norm, std::uintptr_t post_attention_norm, std::uintptr_t q_norm,
                 std::uintptr_t k_norm, const std::vector<WeightTuple>& qkv,
                 std::uintptr_t qkv_bias, const WeightTuple& o, const std::vector<WeightTuple>& gate_up,
                 const WeightTuple& down,
                 std::uintptr_t k_cache, std::uintptr_t v_cache, int32_t kv_dtype, int32_t num_blocks,
                 int32_t block_size, int32_t window, std::uintptr_t pre_feedforward_norm,
                 std::uintptr_t post_feedforward_norm, int32_t activation, std::uintptr_t rope_cos,
                 std::uintptr_t rope_sin, int64_t rope_max_positions, float attn_softcap) {
    DecoderLayerWeights w;
    w.hidden = hidden;
    w.intermediate = intermediate;
    w.num_q_heads = num_q_heads;
    w.num_kv_heads = num_kv_heads;
    w.head_dim = head_dim;
    w.rms_eps = rms_eps;
    w.input_norm = from_address<const float>(input_norm);
    w.post_attention_norm = from_address<const float>(post_attention_norm);
    w.q_norm = from_address<const float>(q_norm);
    w.k_norm = from_address<const float>(k_norm);
    w.qkv = to_parts(qkv);
    w.qkv_bias = from_address<const float>(qkv_bias);
    w.o = to_view(o);
    w.gate_up = to_parts(gate_up);
    w.down = to_view(down);
    w.k_cache = from_address<void>(k_cache);
    w.v_cache = from_address<void>(v_cache);
    w.kv_dtype = to_dtype(kv_dtype);
    w.num_blocks = num_blocks;
    w.block_size = block_size;
    w.window = window;
    w.pre_feedforward_norm = from_address<const float>(pre_feedforward_norm);
    w.post_feedforward_norm = from_address<const float>(post_feedforward_norm);
    w.activation = to_activation(activation);
    w.rope_cos = from_address<const float>(rope_cos);
    w.rope_sin = from_address<const float>(rope_sin);
    w.rope_max_positions = rope_max_positions;
    w.attn_softcap = attn_softcap;
    layers_.push_back(w);
  }

  size_t num_layers() const { return layers_.size(); }

  void forward(std::uintptr_t hidden, std::uintptr_t residual, const DecoderStepArgs& step) {
    if (layers_.empty()) throw std::invalid_argument("DecoderStack has no layers");
    const auto need = static_cast<size_t>(decoder_layer_scratch_floats(layers_.front(), step.num_tokens));
    if (scratch_.size() < need) scratch_.resize(need);
    float* h = from_address<float>(hidden);
    float* r = from_address<float>(residual);
    run_without_gil([&] {
      for (size_t i = 0; i < layers_.size(); ++i) {
        Status s = decoder_layer(layers_[i], step, h, r, i == 0, scratch_.data());
        if (!s.ok()) return s;
      }
      return Status::Ok();
    });
  }

 private:
  std::vector<DecoderLayerWeights> layers_;
  std::vector<float> scratch_;  // reused across steps; grows to the largest step seen
};

}  // namespace

void bind_decoder_layer(py::module_& m) {
  py::class_<DecoderStack>(m, "DecoderStack",
                           "Every decoder layer of a model, bound once; forward runs a step through all of them.")
      .def(py::init<>())
      .def("add_layer", &DecoderStack::add_layer, py::arg("hidden"), py::arg("intermediate"), py::arg("num_q_heads"),
           py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("rms_eps"), py::arg("input_norm"),
           py::arg("post_attention_norm"), py::arg("q_norm"), py::arg("k_norm"), py::arg("qkv"), py::arg("qkv_bias"), py::arg("o"), py::arg("gate_up"),
           py::arg("down"), py::arg("k_cache"), py::arg("v_cache"), py::arg("kv_dtype"), py::arg("num_blocks"),
           py::arg("block_size"), py::arg("window") = 0, py::arg("pre_feedforward_norm") = 0,
           py::arg("post_feedforward_norm") = 0, py::arg("activation") = 0, py::arg("rope_cos") = 0,
           py::arg("rope_sin") = 0, py::arg("rope_max_positions") = 0, py::arg("attn_softcap") = 0.0f,
           "Append a layer (addresses; weights as (N, K, bits, codes, scales, mins, sub_scales)); the "
           "arguments after window describe Gemma's layer (decoder_layer.h), activation 0 SiLU, 1 GELU-tanh.")
      .def_property_readonly("num_layers", &DecoderStack::num_layers)
      .def(
          "forward",
          [](DecoderStack& self, std::uintptr_t hidden, std::uintptr_t residual, int64_t num_tokens,
             int32_t num_requests, bool decode, std::uintptr_t query_start_loc, std::uintptr_t context_lens,
             std::uintptr_t block_tables, int64_t block_table_stride, std::uintptr_t slot_mapping,
             std::uintptr_t positions, std::uintptr_t rope_cos, std::uintptr_t rope_sin, int64_t rope_max_positions,
             float attn_scale, int32_t activations, int num_threads) {
            DecoderStepArgs s;
            s.num_tokens = num_tokens;
            s.num_requests = num_requests;
            s.decode = decode;
            s.query_start_loc = from_address<const int32_t>(query_start_loc);
            s.context_lens = from_address<const int32_t>(context_lens);
            s.block_tables = from_address<const int32_t>(block_tables);
            s.block_table_stride = block_table_stride;
            s.slot_mapping = from_address<const int64_t>(slot_mapping);
            s.positions = from_address<const int64_t>(positions);
            s.rope_cos = from_address<const float>(rope_cos);
            s.rope_sin = from_address<const float>(rope_sin);
            s.rope_max_positions = rope_max_positions;
            s.attn_scale = attn_scale;
            s.activations = static_cast<QuantActivations>(activations);
            s.num_threads = num_threads;
            self.forward(hidden, residual, s);
          },
          py::arg("hidden"), py::arg("residual"), py::arg("num_tokens"), py::arg("num_requests"), py::arg("decode"),
          py::arg("query_start_loc"), py::arg("context_lens"), py::arg("block_tables"),
          py::arg("block_table_stride"), py::arg("slot_mapping"), py::arg("positions"), py::arg("rope_cos"),
          py::arg("rope_sin"), py::arg("rope_max_positions"), py::arg("attn_scale"), py::arg("activations"),
          py::arg("num_threads"),
          "Run every layer on hidden [T, H] (in: embeddings; out: the last layer's MLP output) and "
          "residual [T, H] (out: the residual stream before it). Releases the GIL; ValueError on bad sizes.");
}

}  // namespace trillium::bindings
