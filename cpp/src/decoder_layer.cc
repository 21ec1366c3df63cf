// One decoder layer as a single call over the core's kernels (see decoder_layer.h).
#include "trillium/kernels/decoder_layer.h"

#include <cstring>

#include "trillium/kernels/kv_store.h"
#include "trillium/kernels/layer_ops.h"
#include "trillium/kernels/paged_attention.h"

namespace trillium {

namespace {

#define TRILLIUM_RETURN_IF_ERROR(expr) \
  do {                                 \
    Status status_ = (expr);           \
    if (!status_.ok()) return status_; \
  } while (0)

int64_t q_width(const DecoderLayerWeights& w) { return int64_t{w.num_q_heads} * w.head_dim; }
int64_t kv_width(const DecoderLayerWeights& w) { return int64_t{w.num_kv_heads} * w.head_dim; }
int64_t qkv_width(const DecoderLayerWeights& w) { return q_width(w) + 2 * kv_width(w); }

Status linear(const DecoderStepArgs& s, const float* x, int64_t x_stride, const QuantWeightParts& weight,
              const float* bias, float* out) {
  QuantLinearArgs a;
  a.x = x;
  a.num_rows = s.num_tokens;
  a.x_stride = x_stride;
  a.bias = bias;
  a.out = out;
  a.out_stride = weight.out_features();
  a.num_threads = s.num_threads;
  a.activations = s.activations;
  return quant_linear_parts(a, weight);
}

Status linear(const DecoderStepArgs& s, const float* x, int64_t x_stride, const QuantWeightView& weight,
              const float* bias, float* out) {
  QuantWeightParts one;
  one.part[0] = weight;
  return linear(s, x, x_stride, one, bias, out);
}

Status norm(const DecoderLayerWeights& w, const DecoderStepArgs& s, const float* x, float* residual,
            const float* weight, float* out) {
  RmsNormArgs a;
  a.x = x;
  a.x_stride = w.hidden;
  a.residual = residual;
  a.residual_stride = residual ? w.hidden : 0;
  a.weight = weight;
  a.out = out;
  a.out_stride = w.hidden;
  a.rows = s.num_tokens;
  a.hidden = w.hidden;
  a.eps = w.rms_eps;
  return rms_norm(a);
}

// qkv [T, qkv_width]: rotate q and k in place, store k and v, attend with q into attn [T, q_width].
Status attention(const DecoderLayerWeights& w, const DecoderStepArgs& s, float* qkv, float* attn) {
  const int64_t width = qkv_width(w);
  if ((w.q_norm == nullptr) != (w.k_norm == nullptr)) {
    return Status::InvalidArgument("decoder_layer: q_norm and k_norm are given together or not at all");
  }
  if (w.q_norm) {
    // Per-head norms, in place: a token's q heads (then its k heads) are rows of D floats.
    for (int64_t t = 0; t < s.num_tokens; ++t) {
      for (int which = 0; which < 2; ++which) {
        RmsNormArgs n;
        n.x = n.out = qkv + t * width + (which == 0 ? 0 : q_width(w));
        n.x_stride = n.out_stride = w.head_dim;
        n.weight = which == 0 ? w.q_norm : w.k_norm;
        n.rows = which == 0 ? w.num_q_heads : w.num_kv_heads;
        n.hidden = w.head_dim;
        n.eps = w.rms_eps;
        TRILLIUM_RETURN_IF_ERROR(rms_norm(n));
      }
    }
  }
  RotaryArgs r;
  r.x = qkv;  // q heads then k heads are adjacent: one pass rotates both
  r.stride_token = width;
  r.stride_head = w.head_dim;
  r.tokens = s.num_tokens;
  r.heads = w.num_q_heads + w.num_kv_heads;
  r.head_dim = w.head_dim;
  const bool own_rope = w.rope_cos != nullptr;  // Gemma 3's local layers
  r.cos = own_rope ? w.rope_cos : s.rope_cos;
  r.sin = own_rope ? w.rope_sin : s.rope_sin;
  r.max_positions = own_rope ? w.rope_max_positions : s.rope_max_positions;
  r.positions = s.positions;
  TRILLIUM_RETURN_IF_ERROR(rotary_inplace(r));

  KVStoreArgs kv;
  kv.key = qkv + q_width(w);
  kv.value = qkv + q_width(w) + kv_width(w);
  kv.key_stride_token = kv.value_stride_token = width;
  kv.key_stride_head = kv.value_stride_head = w.head_dim;
  kv.src_dtype = DType::kF32;
  kv.k_cache = w.k_cache;
  kv.v_cache = w.v_cache;
  kv.cache_dtype = w.kv_dtype;
  kv.num_blocks = w.num_blocks;
  kv.block_size = w.block_size;
  kv.num_kv_heads = w.num_kv_heads;
  kv.head_dim = w.head_dim;
  kv.slot_mapping = s.slot_mapping;
  kv.num_tokens = s.num_tokens;
  kv.num_threads = s.num_threads;
  TRILLIUM_RETURN_IF_ERROR(store_kv(kv));

  PagedAttentionArgs a;
  a.query = qkv;
  a.query_stride_token = width;
  a.query_stride_head = w.head_dim;
  a.query_dtype = DType::kF32;
  a.out = attn;
  a.out_stride_token = q_width(w);
  a.out_stride_head = w.head_dim;
  a.out_dtype = DType::kF32;
  a.k_cache = w.k_cache;
  a.v_cache = w.v_cache;
  a.kv_dtype = w.kv_dtype;
  a.num_blocks = w.num_blocks;
  a.block_size = w.block_size;
  a.num_kv_heads = w.num_kv_heads;
  a.head_dim = w.head_dim;
  a.num_q_heads = w.num_q_heads;
  a.num_requests = s.num_requests;
  a.num_tokens = s.num_tokens;
  a.query_start_loc = s.query_start_loc;
  a.context_lens = s.context_lens;
  a.block_tables = s.block_tables;
  a.block_table_stride = s.block_table_stride;
  a.scale = s.attn_scale;
  a.window = w.window;
  a.softcap = w.attn_softcap;
  a.num_threads = s.num_threads;
  return s.decode ? paged_attention_decode(a) : paged_attention_extend(a);
}

}  // namespace

int64_t decoder_layer_scratch_floats(const DecoderLayerWeights& w, int64_t num_tokens) {
  // x [T, H], qkv [T, qkv_width], attn [T, q_width], gate_up [T, 2 I], act [T, I]
  return num_tokens * (w.hidden + qkv_width(w) + q_width(w) + 3 * w.intermediate);
}

Status decoder_layer(const DecoderLayerWeights& w, const DecoderStepArgs& s, float* hidden, float* residual,
                     bool first_layer, float* scratch) {
  if (s.num_tokens < 0 || !hidden || !residual || !scratch) {
    return Status::InvalidArgument("decoder_layer: need num_tokens >= 0 and non-null hidden, residual, scratch");
  }
  if (w.qkv.out_features() != qkv_width(w) || w.qkv.in_features() != w.hidden || w.o.out_features != w.hidden ||
      w.o.in_features != q_width(w) || w.gate_up.out_features() != 2 * w.intermediate ||
      w.gate_up.in_features() != w.hidden || w.down.out_features != w.hidden || w.down.in_features != w.intermediate) {
    return Status::InvalidArgument("decoder_layer: projection shapes do not match the layer's sizes");
  }
  if ((w.pre_feedforward_norm == nullptr) != (w.post_feedforward_norm == nullptr) ||
      (w.rope_cos == nullptr) != (w.rope_sin == nullptr)) {
    return Status::InvalidArgument("decoder_layer: pre/post_feedforward_norm, and rope_cos/rope_sin, come in pairs");
  }
  if (s.num_tokens == 0) return Status::Ok();
  const int64_t T = s.num_tokens;
  float* x = scratch;
  float* qkv = x + T * w.hidden;
  float* attn = qkv + T * qkv_width(w);
  float* gate_up = attn + T * q_width(w);
  float* act = gate_up + T * 2 * w.intermediate;

  if (first_layer) {
    std::memcpy(residual, hidden, static_cast<size_t>(T * w.hidden) * sizeof(float));
    TRILLIUM_RETURN_IF_ERROR(norm(w, s, hidden, nullptr, w.input_norm, x));
  } else {
    TRILLIUM_RETURN_IF_ERROR(norm(w, s, hidden, residual, w.input_norm, x));  // residual += hidden
  }
  TRILLIUM_RETURN_IF_ERROR(linear(s, x, w.hidden, w.qkv, w.qkv_bias, qkv));
  TRILLIUM_RETURN_IF_ERROR(attention(w, s, qkv, attn));
  TRILLIUM_RETURN_IF_ERROR(linear(s, attn, q_width(w), w.o, nullptr, hidden));
  const bool sandwich = w.pre_feedforward_norm != nullptr;  // Gemma
  if (sandwich) {
    TRILLIUM_RETURN_IF_ERROR(norm(w, s, hidden, nullptr, w.post_attention_norm, hidden));
    TRILLIUM_RETURN_IF_ERROR(norm(w, s, hidden, residual, w.pre_feedforward_norm, x));  // residual += o
  } else {
    TRILLIUM_RETURN_IF_ERROR(norm(w, s, hidden, residual, w.post_attention_norm, x));  // residual += o
  }
  TRILLIUM_RETURN_IF_ERROR(linear(s, x, w.hidden, w.gate_up, nullptr, gate_up));
  SiluMulArgs m;
  m.gate_up = gate_up;
  m.gate_up_stride = 2 * w.intermediate;
  m.out = act;
  m.out_stride = w.intermediate;
  m.rows = T;
  m.inter = w.intermediate;
  m.activation = w.activation;
  TRILLIUM_RETURN_IF_ERROR(silu_and_mul(m));
  TRILLIUM_RETURN_IF_ERROR(linear(s, act, w.intermediate, w.down, nullptr, hidden));
  return sandwich ? norm(w, s, hidden, nullptr, w.post_feedforward_norm, hidden) : Status::Ok();
}

#undef TRILLIUM_RETURN_IF_ERROR

}  // namespace trillium
