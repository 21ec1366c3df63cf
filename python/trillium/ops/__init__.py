"""Typed wrappers over the attention / KV kernels: the one place that passes tensors to C++.

``attention`` dispatches CPU tensors to ``trillium._core`` and CUDA tensors to ``trillium._cuda``;
``attention_ref`` is the torch gather + SDPA reference used by tests and benchmarks.
"""

from trillium.ops.attention import AttentionMetadata, paged_attention, store_kv

__all__ = ["AttentionMetadata", "paged_attention", "store_kv"]
