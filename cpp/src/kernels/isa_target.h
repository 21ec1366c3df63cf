// Function-level target regions: the one place that spells the compiler pragmas which compile a
// stretch of code for one instruction set while the rest of the library stays portable x86-64
// (the wheel must run on any x86-64, so there is no -mavx2 / -march anywhere).
//
//   TRILLIUM_TARGET_AVX2_BEGIN      ... functions compiled for AVX2 + FMA ...     TRILLIUM_TARGET_END
//   TRILLIUM_TARGET_AVX512_BEGIN    ... for AVX-512F/BW/VL (+ AVX2, FMA) ...      TRILLIUM_TARGET_END
//   TRILLIUM_TARGET_AVX512VNNI_BEGIN ... the same + AVX512-VNNI ...                TRILLIUM_TARGET_END
//
// Rules for a region, so that no SIMD code leaks into functions the portable path shares:
//   - include every header (std, <immintrin.h>, our own) BEFORE the region: an inline function
//     first defined inside it would be compiled for the target and could be picked by the linker
//     for every caller;
//   - call the region's functions only when kernel_isa() (trillium/cpu_isa.h) is at least its level.
// GCC gets `#pragma GCC push_options` + `#pragma GCC target(...)` ... `pop_options`; clang gets
// `#pragma clang attribute push(__attribute__((target(...))), apply_to = function)` ... `pop`.
#pragma once

#if defined(__x86_64__)

#if defined(__clang__)
#define TRILLIUM_TARGET_BEGIN_(features) \
  _Pragma(TRILLIUM_TARGET_STR_(clang attribute push(__attribute__((target(features))), apply_to = function)))
#define TRILLIUM_TARGET_END _Pragma("clang attribute pop")
#else
#define TRILLIUM_TARGET_BEGIN_(features) _Pragma("GCC push_options") _Pragma(TRILLIUM_TARGET_STR_(GCC target(features)))
#define TRILLIUM_TARGET_END _Pragma("GCC pop_options")
#endif
#define TRILLIUM_TARGET_STR_(...) #__VA_ARGS__

#define TRILLIUM_TARGET_AVX2_BEGIN TRILLIUM_TARGET_BEGIN_("avx2,fma")
#define TRILLIUM_TARGET_AVX512_BEGIN TRILLIUM_TARGET_BEGIN_("avx512f,avx512bw,avx512vl,avx2,fma")
#define TRILLIUM_TARGET_AVX512VNNI_BEGIN TRILLIUM_TARGET_BEGIN_("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")

#endif  // x86-64
