"""Speculative decoding's verify step: a typed wrapper over ``_core`` / ``_cuda``.

One call per step for the whole batch. Request i proposed ``n = num_draft[i] <= k`` draft tokens
``d_0 .. d_{n-1}``; the target scored the k+1 positions after its last verified token (row j of
``target[i]`` sees ``d_0 .. d_{j-1}`` as already output). The result says how many drafts the
target accepts and the one token that follows them::

    output_tokens[i] = [ d_0 .. d_{a-1} | next | -1 ... -1 ]     a = num_accepted[i] in [0, n]
                         accepted drafts   always

``next`` is the correction at the first rejected position ``a`` (``a < n``) or the bonus token of
position ``n`` (``a == n``), so every request gains ``a + 1`` tokens. By ``modes[i]``:

* ``GREEDY``: target rows are scores; accept ``d_j`` while it equals ``argmax(target[i, j])``
  (first index of the maximum, as ``torch.argmax``); ``next`` is the argmax at position ``a``.
* ``POINT_MASS`` (sampled, proposals without probabilities: n-gram): target rows are the
  request's processed probabilities (need not sum to 1). The draw of position j is the
  inverse-CDF draw of row j at ``uniforms[i, j]``, computed exactly as
  ``trillium.engine.sampler.inverse_cdf`` does (float64 running sums in index order, first
  index whose sum exceeds ``u * total``; a zero-probability token is never drawn). Accept ``d_j``
  while it equals that draw; ``next`` is the draw at position ``a``. Given the uniforms the request
  would have used for those positions, the tokens are the ones decoding without speculation gives.
* ``DRAFT_PROBS`` (sampled, proposals drawn from ``q_j = draft_probs[i, j]``, normalized):
  lossless rejection sampling with ``p_j = target[i, j] / sum``. Accept ``d_j`` when
  ``uniforms[i, j] * q_j(d_j) < p_j(d_j)`` -- probability ``min(1, p/q)``; a draft token with
  ``q = 0`` is accepted iff ``p > 0``, one with ``p = 0`` never. On the first rejection ``next`` is
  the inverse-CDF draw of ``max(0, p_j - q_j)`` at ``residual_uniforms[i]`` (of ``p_j`` itself if that
  residual is all zero); after ``n`` acceptances it is the draw of row ``n`` at ``uniforms[i, n]``,
  as in ``POINT_MASS``. The output tokens then follow the target distribution exactly, provided
  ``q_j`` is the distribution the draft token was really sampled from.

Uniforms: ``uniforms[i, j]`` (float64 in [0, 1)) is position j's number -- the acceptance test and
the draw of that position; a sampled request reads ``uniforms[i, 0 .. a]``. ``residual_uniforms[i]``
is a separate number for the residual draw, so that it is independent of the test that failed.

CPU tensors go to ``trillium._core`` (parallel over requests, GIL released), CUDA tensors to
``trillium._cuda`` (asynchronous on the current stream; same tokens as the CPU for valid inputs).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

import torch

from trillium import _core
from trillium.ops.attention import host_to_device
from trillium.ops.kernel_specs import VerifySpec


class VerifyMode(enum.IntEnum):
    """How a request's drafts are verified (``trillium::SpecVerifyMode``)."""

    GREEDY = 0
    POINT_MASS = 1  # sampled; n-gram proposals
    DRAFT_PROBS = 2  # sampled; draft-model proposals with their probabilities


MAX_DRAFT_TOKENS = 64  # k, as trillium::kMaxSpecDraftTokens


class VerifyResult(NamedTuple):
    num_accepted: torch.Tensor  # [N] int32 in [0, num_draft[i]] (-1: a bad request, CUDA only)
    output_tokens: torch.Tensor  # [N, k+1] int32: accepted drafts, next token, then -1


def spec_verify(
    target: torch.Tensor,  # [N, k+1, V] float32, last dimension contiguous
    draft_tokens: torch.Tensor,  # [N, k] int32 or int64; entries past num_draft[i] are not read
    num_draft: torch.Tensor | Sequence[int],  # [N] in [0, k]
    modes: torch.Tensor | Sequence[int],  # [N] VerifyMode values
    uniforms: torch.Tensor | None = None,  # [N, k+1] float64 in [0, 1); may be None if all GREEDY
    residual_uniforms: torch.Tensor | None = None,  # [N] float64 in [0, 1); for DRAFT_PROBS
    draft_probs: torch.Tensor | None = None,  # [N, k, V] float32, last dimension contiguous; for DRAFT_PROBS
) -> VerifyResult:
    """Verify one step's drafts (module docstring); returns new tensors on ``target``'s device.

    Nothing is modified. ValueError on a dtype, shape or device the kernels do not take; on the
    CPU also on a bad per-request value (a mode, ``num_draft[i]``, a draft token outside [0, V), a
    uniform it reads outside [0, 1), a DRAFT_PROBS request with drafts but no ``draft_probs`` or
    ``residual_uniforms``), naming the request. On CUDA those values stay on the device: such a
    request gets ``num_accepted = -1`` and an all -1 row instead. Probability rows must be finite
    and >= 0; otherwise the draws are some token in [0, V), unspecified.
    """
    if target.dim() != 3 or target.dtype != torch.float32 or target.shape[1] < 1 or target.shape[2] < 1:
        raise ValueError(f"target must be a [N, k+1, V] float32 tensor, got {tuple(target.shape)} {target.dtype}")
    num_requests, positions, vocab = target.shape
    k = positions - 1
    if k > MAX_DRAFT_TOKENS:
        raise ValueError(f"at most {MAX_DRAFT_TOKENS} draft tokens per request, target has k = {k}")
    device = target.device
    target = _rows_contiguous(target, "target")
    if draft_tokens.dtype not in (torch.int32, torch.int64) or draft_tokens.shape != (num_requests, k):
        raise ValueError(
            f"draft_tokens must be an int32/int64 [{num_requests}, {k}] tensor, "
            f"got {tuple(draft_tokens.shape)} {draft_tokens.dtype}"
        )
    draft_tokens = _on(draft_tokens, device, "draft_tokens").contiguous()
    num_draft_t = _int32_vector(num_draft, num_requests, device, "num_draft")
    modes_t = _int32_vector(modes, num_requests, device, "modes")
    uniforms_ptr = residual_ptr = probs_ptr = probs_stride_request = probs_stride_position = 0
    if uniforms is not None:
        if uniforms.dtype != torch.float64 or uniforms.shape != (num_requests, positions):
            raise ValueError(
                f"uniforms must be a float64 [{num_requests}, {positions}] tensor, "
                f"got {tuple(uniforms.shape)} {uniforms.dtype}"
            )
        uniforms = _on(uniforms, device, "uniforms").contiguous()
        uniforms_ptr = uniforms.data_ptr()
    if residual_uniforms is not None:
        if residual_uniforms.dtype != torch.float64 or residual_uniforms.shape != (num_requests,):
            raise ValueError(
                f"residual_uniforms must be a float64 [{num_requests}] tensor, "
                f"got {tuple(residual_uniforms.shape)} {residual_uniforms.dtype}"
            )
        residual_uniforms = _on(residual_uniforms, device, "residual_uniforms").contiguous()
        residual_ptr = residual_uniforms.data_ptr()
    if draft_probs is not None:
        if draft_probs.dtype != torch.float32 or draft_probs.shape != (num_requests, k, vocab):
            raise ValueError(
                f"draft_probs must be a float32 [{num_requests}, {k}, {vocab}] tensor, "
                f"got {tuple(draft_probs.shape)} {draft_probs.dtype}"
            )
        draft_probs = _rows_contiguous(_on(draft_probs, device, "draft_probs"), "draft_probs")
        probs_ptr = draft_probs.data_ptr()
        probs_stride_request, probs_stride_position = draft_probs.stride(0), draft_probs.stride(1)

    num_accepted = torch.empty(num_requests, dtype=torch.int32, device=device)
    output_tokens = torch.empty(num_requests, positions, dtype=torch.int32, device=device)
    spec = VerifySpec(
        num_requests=num_requests,
        max_draft=k,
        vocab_size=vocab,
        target_ptr=target.data_ptr(),
        target_stride_request=target.stride(0),
        target_stride_position=target.stride(1),
        draft_tokens_ptr=draft_tokens.data_ptr(),
        draft_tokens_int64=draft_tokens.dtype == torch.int64,
        num_draft_ptr=num_draft_t.data_ptr(),
        modes_ptr=modes_t.data_ptr(),
        draft_probs_ptr=probs_ptr,
        draft_probs_stride_request=probs_stride_request,
        draft_probs_stride_position=probs_stride_position,
        uniforms_ptr=uniforms_ptr,
        residual_uniforms_ptr=residual_ptr,
        num_accepted_ptr=num_accepted.data_ptr(),
        output_tokens_ptr=output_tokens.data_ptr(),
    )
    if device.type == "cuda":
        from trillium import _cuda

        _cuda.spec_verify(spec, torch.cuda.current_stream(device).cuda_stream)
    else:
        _core.spec_verify(spec, torch.get_num_threads())
    return VerifyResult(num_accepted, output_tokens)


def _on(x: torch.Tensor, device: torch.device, name: str) -> torch.Tensor:
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but target is on {device}")
    return x


def _rows_contiguous(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` itself when its last dimension is contiguous (rows are read in place; the other
    strides are free, 0 included); ValueError otherwise -- a copy of [N, k+1, V] is not small."""
    if x.shape[2] > 1 and x.stride(2) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension, got strides {x.stride()}")
    return x


def _int32_vector(x: torch.Tensor | Sequence[int], length: int, device: torch.device, name: str) -> torch.Tensor:
    """``x`` as a contiguous int32 [length] tensor on ``device``. Wider integers are clamped to the
    int32 range first, so a huge value stays invalid (and named) instead of wrapping into range."""
    if not isinstance(x, torch.Tensor):
        x = host_to_device(torch.tensor(list(x), dtype=torch.int64), device)  # no host wait on a GPU
    if x.shape != (length,) or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer [{length}] tensor or sequence, got {tuple(x.shape)} {x.dtype}")
    x = _on(x, device, name)
    if x.dtype != torch.int32:
        x = x.clamp(-(2**31), 2**31 - 1).to(torch.int32)
    return x.contiguous()
