// The instruction set every CPU kernel family (paged attention, KV store, quantized linear, layer
// ops) runs on: detected once from the running CPU, overridable for tests and benchmarks. The one
// owner of CPU-feature detection; kernels ask kernel_isa() and never probe the CPU themselves.
//
// Detection reads cpuid and xgetbv: a level counts only if the CPU has the instructions AND the OS
// saves their register state (an AVX-512 CPU under an OS that does not save ZMM runs AVX2).
// Families that have no loops for a level use the best level below it (e.g. layer ops run their
// AVX2 loops when kernel_isa() is kAvx512).
#pragma once

#include <cstdint>

#include "trillium/status.h"

namespace trillium {

// Ordered worst to best: a level implies every level below it.
// kAvx512Vnni: AVX-512 with VNNI (vpdpwssd: the int16 dot product and its add in one instruction;
// Ice Lake, Sapphire Rapids, Zen 4 and later).
enum class KernelIsa : int32_t { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Vnni = 3 };

// Every level, worst first (for listing and for parsing names).
inline constexpr KernelIsa kAllKernelIsas[] = {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512,
                                               KernelIsa::kAvx512Vnni};

// The level the kernels use now: the best supported one, unless set_kernel_isa() forced another.
KernelIsa kernel_isa();

// Whether this CPU (and build: non-x86-64 builds have only kPortable) can run `isa`.
bool kernel_isa_supported(KernelIsa isa);

// Forces the kernels onto `isa`, process-wide. kInvalidArgument (and no change) if unsupported.
// Not meant to be called while kernels run on other threads.
Status set_kernel_isa(KernelIsa isa);

// "portable", "avx2", "avx512" or "avx512vnni".
const char* kernel_isa_name(KernelIsa isa);

// The level named `name` (as kernel_isa_name spells it) into *isa; kInvalidArgument naming the
// accepted names otherwise.
Status parse_kernel_isa(const char* name, KernelIsa* isa);

}  // namespace trillium
