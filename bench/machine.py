"""What a benchmark ran on, for its result file.

The CPU of this project's machine kind changes between sittings (AVX-512 + bf16 Zen 5, AVX2-only
Zen 3, Xeon), and absolute numbers move 3x with it (DESIGN.md section 8): a result can only be
set beside an earlier one measured on the same CPU, so every result file names it. ``describe()``
gives the CPU's model name and the SIMD features that decide which kernels run (a VM often
names only "AMD EPYC"), its cores, the kernel ISA trillium picks on it, whether it multiplies
bf16 natively (which decides vLLM's fair dtype), and the commit measured (``-dirty`` when tracked
files differ from it). No paths: a result file names no machine's directories.

    python bench/machine.py     # prints the record
"""

from __future__ import annotations

import json
import os
import platform
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cpuinfo(*keys: str) -> str | None:
    """The value of the first ``/proc/cpuinfo`` line starting with one of ``keys``; None where
    there is none or the file cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(keys):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "asimd", "sve")


def simd_flags() -> list[str]:
    """Which of SIMD_FLAGS ``/proc/cpuinfo`` lists (x86 "flags", Arm "Features"; empty where it
    cannot be read)."""
    have = set((_cpuinfo("flags", "Features") or "").split())
    return [flag for flag in SIMD_FLAGS if flag in have]


def without_root(text: str) -> str:
    """``text`` (JSON) with the repository's directory taken out of every path in it."""
    return text.replace(json.dumps(ROOT + os.sep)[1:-1], "")


def commit() -> str | None:
    """The checkout's short commit, ``-dirty`` if tracked files changed; None outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if changed else "")


def describe() -> dict:
    """The record (see the module docstring). ``kernel_isa`` and ``native_bf16`` are None where
    trillium is not importable (a client run from another environment)."""
    try:
        from trillium import _core
        from trillium.config import cpu_has_native_bf16

        isa, bf16 = _core.kernel_isa(), cpu_has_native_bf16()
    except ImportError:
        isa, bf16 = None, None
    return {
        "cpu": cpu_name(),
        "arch": platform.machine(),
        "simd": simd_flags(),
        "cores": os.cpu_count(),
        "kernel_isa": isa,
        "native_bf16": bf16,
        "commit": commit(),
    }


if __name__ == "__main__":
    print(json.dumps(describe(), indent=2))
