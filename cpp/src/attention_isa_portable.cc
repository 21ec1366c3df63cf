// Attention inner loops on plain C++ (any CPU): the fallback, and the reference the SIMD paths
// are tested against.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/attention_work.h"

namespace trillium::kernels {
namespace isa_portable {
#include "kernels/simd_portable.h"
#include "kernels/attention_impl.h"
}  // namespace isa_portable

IsaKernels portable_kernels() { return isa_portable::make_kernels(); }

}  // namespace trillium::kernels
