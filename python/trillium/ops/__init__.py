"""Typed wrappers over the attention / KV kernels: the one place that passes tensors to C++.

Torch reference implementations live here until the compiled kernels land; callers code against
these signatures only.
"""

from trillium.ops.attention import AttentionMetadata, paged_attention, store_kv

__all__ = ["AttentionMetadata", "paged_attention", "store_kv"]
