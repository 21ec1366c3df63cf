"""Giving the heap memory freed during start-up back to the operating system.

Loading a GGUF file reads and repacks every tensor through temporary buffers. glibc's allocator
keeps what they freed in its arenas for reuse, so the server's resident memory stayed ~90 MB above
what it holds (Qwen2.5-Coder-0.5B and Gemma 3 270M, measured on 2 cores: 1,536 -> 1,447 MiB and
1,066 -> 977 MiB after one ``malloc_trim``). Issue 46 bounds a served GGUF's resident memory at
its file + the KV pool + 400 MB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


def return_freed_memory() -> bool:
    """``malloc_trim(0)``: glibc releases the free memory at the top of every arena and the free
    whole pages inside them. True if it released any; False where there is no glibc (or nothing
    was free)."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))
