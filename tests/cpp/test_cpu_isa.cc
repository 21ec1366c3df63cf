// Unit tests for the kernel ISA selection (trillium/cpu_isa.h): the portable level always runs,
// supported levels are a prefix of kAllKernelIsas (a level implies those below it), forcing a level
// sticks until the next call and an unsupported one changes nothing, names round-trip.
// Plain ctest executable, see check.h.
#include "trillium/cpu_isa.h"

#include <cstring>
#include <string>

#include "check.h"

using trillium::KernelIsa;

namespace {

void test_supported_levels_are_a_prefix() {
  CHECK(trillium::kernel_isa_supported(KernelIsa::kPortable));
  bool below_supported = true;
  for (KernelIsa isa : trillium::kAllKernelIsas) {
    const bool supported = trillium::kernel_isa_supported(isa);
    CHECK(!supported || below_supported);
    below_supported = supported;
  }
#if !defined(__x86_64__)
  CHECK(!trillium::kernel_isa_supported(KernelIsa::kAvx2));
#endif
}

void test_default_is_the_best_supported() {
  KernelIsa best = KernelIsa::kPortable;
  for (KernelIsa isa : trillium::kAllKernelIsas) {
    if (trillium::kernel_isa_supported(isa)) best = isa;
  }
  CHECK(trillium::kernel_isa() == best);
}

void test_force_and_restore() {
  const KernelIsa before = trillium::kernel_isa();
  for (KernelIsa isa : trillium::kAllKernelIsas) {
    if (trillium::kernel_isa_supported(isa)) {
      CHECK_OK(trillium::set_kernel_isa(isa));
      CHECK(trillium::kernel_isa() == isa);
    } else {
      CHECK_OK(trillium::set_kernel_isa(KernelIsa::kPortable));
      CHECK(trillium::set_kernel_isa(isa).code() == trillium::StatusCode::kInvalidArgument);
      CHECK(trillium::kernel_isa() == KernelIsa::kPortable);  // unchanged by the refused call
    }
  }
  CHECK_OK(trillium::set_kernel_isa(before));
}

void test_names_round_trip() {
  for (KernelIsa isa : trillium::kAllKernelIsas) {
    KernelIsa parsed = KernelIsa::kPortable;
    CHECK_OK(trillium::parse_kernel_isa(trillium::kernel_isa_name(isa), &parsed));
    CHECK(parsed == isa);
  }
  CHECK(std::strcmp(trillium::kernel_isa_name(KernelIsa::kAvx512), "avx512") == 0);
  KernelIsa parsed = KernelIsa::kAvx2;
  const trillium::Status st = trillium::parse_kernel_isa("sse4", &parsed);
  CHECK(st.code() == trillium::StatusCode::kInvalidArgument);
  CHECK(st.message().find("sse4") != std::string::npos);
  CHECK(parsed == KernelIsa::kAvx2);  // untouched on failure
}

}  // namespace

int main() {
  test_supported_levels_are_a_prefix();
  test_default_is_the_best_supported();
  test_force_and_restore();
  test_names_round_trip();
  return trillium::test::test_exit_code();
}
