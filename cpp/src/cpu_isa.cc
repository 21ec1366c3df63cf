// CPU-feature detection and the process-wide kernel ISA (trillium/cpu_isa.h).
#include "trillium/cpu_isa.h"

#include <atomic>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace trillium {
namespace {

// cpuid + xgetbv directly (not __builtin_cpu_supports, which some toolchains' runtimes leave
// unimplemented): the CPU must have the instructions and the OS must save their register state.
#if defined(__x86_64__)
bool os_saves_state(uint64_t mask) {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((static_cast<uint64_t>(edx) << 32 | eax) & mask) == mask;
}

KernelIsa detect_best_isa() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return KernelIsa::kPortable;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28);
  if (!(osxsave && avx && os_saves_state(0x6))) return KernelIsa::kPortable;  // XMM and YMM state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return KernelIsa::kPortable;
  const bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512bw = b & (1u << 30), avx512vl = b & (1u << 31);
  const bool avx512vnni = c & (1u << 11);
  if (avx2 && fma && avx512f && avx512bw && avx512vl && os_saves_state(0xe6)) {  // + ZMM, k
    return avx512vnni ? KernelIsa::kAvx512Vnni : KernelIsa::kAvx512;
  }
  if (avx2 && fma) return KernelIsa::kAvx2;
  return KernelIsa::kPortable;
}
#else
KernelIsa detect_best_isa() { return KernelIsa::kPortable; }
#endif

// The CPU does not change under a running process: detect once.
KernelIsa best_isa() {
  static const KernelIsa best = detect_best_isa();
  return best;
}

std::atomic<int32_t>& active_isa() {
  static std::atomic<int32_t> isa{static_cast<int32_t>(best_isa())};
  return isa;
}

}  // namespace

KernelIsa kernel_isa() { return static_cast<KernelIsa>(active_isa().load(std::memory_order_relaxed)); }

bool kernel_isa_supported(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kPortable:
    case KernelIsa::kAvx2:
    case KernelIsa::kAvx512:
    case KernelIsa::kAvx512Vnni:
      return static_cast<int32_t>(isa) <= static_cast<int32_t>(best_isa());
  }
  return false;
}

Status set_kernel_isa(KernelIsa isa) {
  if (!kernel_isa_supported(isa)) {
    return Status::InvalidArgument(std::string("kernel ISA ") + kernel_isa_name(isa) + " is not supported here");
  }
  active_isa().store(static_cast<int32_t>(isa), std::memory_order_relaxed);
  return Status::Ok();
}

const char* kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kPortable:
      return "portable";
    case KernelIsa::kAvx2:
      return "avx2";
    case KernelIsa::kAvx512:
      return "avx512";
    case KernelIsa::kAvx512Vnni:
      return "avx512vnni";
  }
  return "?";
}

Status parse_kernel_isa(const char* name, KernelIsa* isa) {
  for (KernelIsa candidate : kAllKernelIsas) {
    if (std::strcmp(name, kernel_isa_name(candidate)) == 0) {
      *isa = candidate;
      return Status::Ok();
    }
  }
  return Status::InvalidArgument(std::string("unknown kernel ISA '") + name + "' (portable, avx2, avx512, avx512vnni)");
}

}  // namespace trillium
