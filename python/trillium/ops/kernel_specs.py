"""The named argument specs the compiled kernels take: one definition for ``_core`` and ``_cuda``.

Tensors cross into C++ as integers -- addresses (``tensor.data_ptr()``), sizes, strides counted
in elements, and dtype codes (:data:`DTYPE_CODES`). The kernels read these specs BY FIELD NAME
(cpp/bindings/kernel_specs.h, token_bitmask_spec.h, spec_verify_spec.h: each C++ member is named
like the field here), so a plain tuple is refused with a TypeError rather than misread. Only the
typed wrappers of this package build them, after checking the tensors.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}  # as trillium::DType


class RowsSpec(NamedTuple):
    """Rows of a [T, num_heads, head_dim] tensor with a contiguous last dimension (query, out,
    key, value); token and head strides are free, so views of a fused QKV projection work."""

    data_ptr: int
    num_heads: int
    stride_token: int
    stride_head: int
    dtype: int


class CacheSpec(NamedTuple):
    """One layer's KV pool: k and v, each a contiguous [num_blocks, block_size, num_kv_heads, head_dim]."""

    k_ptr: int
    v_ptr: int
    dtype: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int


class BatchSpec(NamedTuple):
    """One step's metadata (int32 tensors): query_start_loc [R+1] (extend only), context_lens [R],
    block_tables [R, block_table_stride]."""

    num_requests: int
    num_tokens: int
    query_start_loc_ptr: int
    context_lens_ptr: int
    block_tables_ptr: int
    block_table_stride: int


class LogitsSpec(NamedTuple):
    """Logits [num_rows, vocab_size] with contiguous rows, masked in place."""

    data_ptr: int
    dtype: int
    row_stride: int
    num_rows: int
    vocab_size: int


class BitmaskSpec(NamedTuple):
    """A bitmask [num_mask_rows, num_words] of int32 words, one bit per token."""

    data_ptr: int
    row_stride: int
    num_mask_rows: int
    num_words: int


class VerifySpec(NamedTuple):
    """One speculative-decoding verify step (cpp/include/trillium/kernels/spec_verify.h) over
    num_requests requests, max_draft draft slots each, a vocab_size vocabulary. Addresses of
    tensors whose last dimension is contiguous (0 = absent); shapes in the trailing comments."""

    num_requests: int
    max_draft: int
    vocab_size: int
    target_ptr: int  # float32 [N, k+1, V]
    target_stride_request: int
    target_stride_position: int
    draft_tokens_ptr: int  # int32 or int64 [N, k], contiguous
    draft_tokens_int64: bool
    num_draft_ptr: int  # int32 [N]
    modes_ptr: int  # int32 [N]
    draft_probs_ptr: int  # float32 [N, k, V] or 0
    draft_probs_stride_request: int
    draft_probs_stride_position: int
    uniforms_ptr: int  # float64 [N, k+1], contiguous, or 0
    residual_uniforms_ptr: int  # float64 [N] or 0
    num_accepted_ptr: int  # int32 [N], written
    output_tokens_ptr: int  # int32 [N, k+1], contiguous, written
