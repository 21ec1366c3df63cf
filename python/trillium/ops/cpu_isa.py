"""The instruction set the CPU kernels run on (cpp/include/trillium/cpu_isa.h), by name.

One level -- ``'portable'``, ``'avx2'``, ``'avx512'`` or ``'avx512vnni'`` -- is detected once from the running CPU
and used by every kernel family; forcing another is for tests and benchmarks.
"""

from __future__ import annotations

from trillium import _core


def kernel_isa() -> str:
    """The level the CPU kernels use now."""
    return _core.kernel_isa()


def supported_kernel_isas() -> list[str]:
    """Levels this CPU and build can run, worst first."""
    return _core.supported_kernel_isas()


def set_kernel_isa(name: str) -> None:
    """Force every CPU kernel family onto ``name``, process-wide. ValueError if unknown or unsupported
    here. Do not call while kernels run on other threads."""
    _core.set_kernel_isa(name)
