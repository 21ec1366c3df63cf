"""Token bitmask application (structured output): a typed wrapper over ``_core`` / ``_cuda``.

A bitmask row has one bit per vocabulary token packed little-endian into int32 words (token t
is allowed iff bit ``t % 32`` of word ``t // 32`` is 1: llguidance's and vLLM's layout).
:func:`apply_token_bitmask` sets every disallowed logit to -inf in place; allowed logits keep
their values, so a softmax afterwards is the model's distribution renormalized over the
allowed tokens. CPU tensors go to ``trillium._core``, CUDA tensors to ``trillium._cuda``.
"""

from __future__ import annotations

import torch

from trillium import _core
from trillium.ops.kernel_specs import DTYPE_CODES, BitmaskSpec, LogitsSpec


def bitmask_words(vocab_size: int) -> int:
    """int32 words one mask row needs for ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


def apply_token_bitmask(
    logits: torch.Tensor,  # [N, V] float32 or bfloat16, rows contiguous; modified in place
    bitmask: torch.Tensor,  # [M, W] int32, contiguous, on the same device
    mask_rows: torch.Tensor | None = None,  # [N] int32: bitmask row of each logits row, -1 = none
) -> None:
    """Mask ``logits`` in place. Without ``mask_rows``, row r takes bitmask row r (M >= N).

    Raises ValueError on a dtype, device or shape the kernels do not take, or a mask row
    outside ``[-1, M)`` (checked on CPU; CUDA leaves such a row unmasked).
    """
    if logits.dim() != 2 or logits.dtype not in DTYPE_CODES or logits.stride(1) != 1:
        raise ValueError(
            f"logits must be [N, V] float32/bfloat16 with contiguous rows, got {tuple(logits.shape)} {logits.dtype}"
        )
    if bitmask.dim() != 2 or bitmask.dtype != torch.int32 or not bitmask.is_contiguous():
        raise ValueError(
            f"bitmask must be a contiguous [M, W] int32 tensor, got {tuple(bitmask.shape)} {bitmask.dtype}"
        )
    if bitmask.device != logits.device:
        raise ValueError(f"bitmask is on {bitmask.device} but logits are on {logits.device}")
    rows_ptr = 0
    if mask_rows is not None:
        if mask_rows.dtype != torch.int32 or mask_rows.shape != (logits.shape[0],) or not mask_rows.is_contiguous():
            raise ValueError(f"mask_rows must be a contiguous int32 [{logits.shape[0]}] tensor")
        if mask_rows.device != logits.device:
            raise ValueError("mask_rows must be on the logits' device")
        rows_ptr = mask_rows.data_ptr()
    num_rows, vocab = logits.shape
    logits_spec = LogitsSpec(
        data_ptr=logits.data_ptr(),
        dtype=DTYPE_CODES[logits.dtype],
        row_stride=logits.stride(0),
        num_rows=num_rows,
        vocab_size=vocab,
    )
    bitmask_spec = BitmaskSpec(
        data_ptr=bitmask.data_ptr(),
        row_stride=bitmask.stride(0),
        num_mask_rows=bitmask.shape[0],
        num_words=bitmask.shape[1],
    )
    if logits.device.type == "cuda":
        from trillium import _cuda

        _cuda.apply_token_bitmask(
            logits_spec, bitmask_spec, rows_ptr, torch.cuda.current_stream(logits.device).cuda_stream
        )
    else:
        _core.apply_token_bitmask(logits_spec, bitmask_spec, rows_ptr)
