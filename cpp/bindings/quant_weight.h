// A packed quantized weight as the _core bindings receive it: sizes, bits and the addresses of the
// tensors of python/trillium/ops/quant_linear.QuantWeight (0 for an absent one).
#pragma once

#include <cstdint>

#include "kernel_args.h"
#include "trillium/kernels/quant_linear.h"

namespace trillium::bindings {

inline QuantWeightView quant_weight_view(int64_t out_features, int64_t in_features, int32_t bits, std::uintptr_t codes,
                                         std::uintptr_t scales, std::uintptr_t mins, std::uintptr_t sub_scales) {
  QuantWeightView v;
  v.out_features = out_features;
  v.in_features = in_features;
  v.bits = bits;
  v.codes = from_address<const void>(codes);
  v.scales = from_address<const float>(scales);
  v.mins = from_address<const float>(mins);
  v.sub_scales = from_address<const uint8_t>(sub_scales);
  return v;
}

}  // namespace trillium::bindings
