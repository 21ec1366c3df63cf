// One Llama-family decoder layer as a single call: fp32 activations, block-quantized projections.
//
// The layer, in the order Hugging Face's LlamaDecoderLayer computes it:
//
//   residual += hidden (first layer: residual = hidden);  x = rms_norm(residual) * input_norm
//   qkv = x @ W_qkv^T (+ bias);  [Qwen3: RMS-norm each q and k head];  rotate q and k
//   (rotate-half RoPE at each token's position)
//   store k, v in the paged KV pool;  a = paged_attention(q, pool);  o = a @ W_o^T
//   residual += o;  x = rms_norm(residual) * post_attention_norm
//   hidden = (silu(x @ W_gate^T) * (x @ W_up^T)) @ W_down^T
//
// so `hidden` leaves as this layer's MLP output and `residual` as the stream before it (the next
// layer, or the model's final norm, adds them). Gemma 2/3's layer differs where its fields are set:
// sandwich norms (pre_feedforward_norm given: o is normed on its own by post_attention_norm, then
// added to the residual and normed by pre_feedforward_norm; the MLP output is normed by
// post_feedforward_norm), GELU-tanh for SiLU (activation), its own RoPE table on local layers
// (rope_cos / rope_sin) and soft-capped attention scores (attn_softcap, Gemma 2).
//
// Each step runs every layer through the same kernels the per-operation API exposes (layer_ops.h,
// quant_linear.h, kv_store.h, paged_attention.h), with identical arithmetic: a host may mix both
// paths and get the same numbers. What it saves is the host's per-operation dispatch, ~10 calls per
// layer.
#pragma once

#include <cstdint>

#include "trillium/kernels/dtype.h"
#include "trillium/kernels/layer_ops.h"
#include "trillium/kernels/quant_linear.h"
#include "trillium/status.h"

namespace trillium {

// Everything about one layer that does not change between steps.
struct DecoderLayerWeights {
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  int32_t num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  float rms_eps = 1e-6f;
  const float* input_norm = nullptr;           // [H]
  const float* post_attention_norm = nullptr;  // [H]
  const float* q_norm = nullptr;               // [D]: every q head RMS-normed before RoPE (Qwen3), or null
  const float* k_norm = nullptr;               // [D]: the same for k heads; set with q_norm
  QuantWeightParts qkv;                        // [(Hq + 2 Hkv) * D, H]: q, then k, then v rows
  const float* qkv_bias = nullptr;             // [(Hq + 2 Hkv) * D] or null
  QuantWeightView o;                           // [H, Hq * D]
  QuantWeightParts gate_up;                    // [2 I, H]: gate rows, then up rows
  QuantWeightView down;                        // [H, I]
  void* k_cache = nullptr;                     // [num_blocks, block_size, Hkv, D] each
  void* v_cache = nullptr;
  DType kv_dtype = DType::kF32;
  int32_t num_blocks = 0, block_size = 0;
  int32_t window = 0;  // > 0: this layer's sliding-window attention (paged_attention.h), e.g. Mistral
  // Gemma (see the top of this file); the defaults are Llama's layer.
  const float* pre_feedforward_norm = nullptr;   // [H], or null: no sandwich norms
  const float* post_feedforward_norm = nullptr;  // [H]; given with pre_feedforward_norm
  GatedActivation activation = GatedActivation::kSilu;
  const float* rope_cos = nullptr;  // [rope_max_positions, D/2]: this layer's own table, or null: the step's
  const float* rope_sin = nullptr;
  int64_t rope_max_positions = 0;
  float attn_softcap = 0.0f;  // > 0: scores soft-capped (paged_attention.h)
};

// One step's batch (shared by every layer): T new tokens of R requests, flattened request-major,
// as in paged_attention.h.
struct DecoderStepArgs {
  int64_t num_tokens = 0;  // T
  int32_t num_requests = 0;
  bool decode = false;                       // every request brings exactly one token
  const int32_t* query_start_loc = nullptr;  // [R+1]
  const int32_t* context_lens = nullptr;     // [R]
  const int32_t* block_tables = nullptr;     // [R, block_table_stride]
  int64_t block_table_stride = 0;
  const int64_t* slot_mapping = nullptr;  // [T]
  const int64_t* positions = nullptr;     // [T]
  const float* rope_cos = nullptr;        // [rope_max_positions, D/2]
  const float* rope_sin = nullptr;
  int64_t rope_max_positions = 0;
  float attn_scale = 1.0f;
  QuantActivations activations = QuantActivations::kExact;  // quant_linear's mode (see quant_linear.h)
  int num_threads = 0;            // 0: the OpenMP default
};

// Floats of scratch decoder_layer needs for `num_tokens` tokens.
int64_t decoder_layer_scratch_floats(const DecoderLayerWeights& w, int64_t num_tokens);

// Runs the layer (see the top of this file). hidden, residual: [T, H] contiguous fp32; with
// `first_layer` residual is only written. scratch: decoder_layer_scratch_floats floats. Returns the
// first failing kernel's status (InvalidArgument on bad sizes); hidden and residual are then
// unspecified, and the KV pool may hold this step's K/V for some layers.
Status decoder_layer(const DecoderLayerWeights& w, const DecoderStepArgs& step, float* hidden, float* residual,
                     bool first_layer, float* scratch);

}  // namespace trillium
