"""Typed wrappers over the compiled kernels: the one place that passes tensors to C++.

``attention`` dispatches CPU tensors to ``trillium._core`` and CUDA tensors to ``trillium._cuda``;
``attention_ref`` is the torch gather + SDPA reference used by tests and benchmarks. The other
families: ``quant_linear``, ``layer_ops``, ``token_bitmask``, ``spec_verify``. ``kernel_specs`` defines the named
argument specs both modules take; ``cpu_isa`` names the instruction set the CPU kernels run on.
"""

from trillium.ops.attention import AttentionMetadata, paged_attention, store_kv

__all__ = ["AttentionMetadata", "paged_attention", "store_kv"]
