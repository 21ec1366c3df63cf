"""apply_token_bitmask (``_core`` and ``_cuda``) against a torch reference on fresh random inputs:
float32 and bfloat16 logits, vocabularies that are not multiples of 32, masks narrower than the
vocabulary, rows that take no mask, and the wrapper's argument checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trillium.ops.token_bitmask import apply_token_bitmask, bitmask_words


def _cuda_available() -> bool:
    try:
        from trillium import _cuda
    except ImportError:
        return False
    return torch.cuda.is_available() and _cuda.device_count() > 0


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and trillium._cuda"),
        ],
    ),
]


def reference(logits: torch.Tensor, bitmask: torch.Tensor, mask_rows: list[int]) -> torch.Tensor:
    """Unpack the bits with torch and mask with -inf; tokens past the mask's words are disallowed."""
    out = logits.clone()
    vocab = logits.shape[1]
    bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1  # [M, W, 32]
    allowed = bits.reshape(bitmask.shape[0], -1).bool()  # [M, 32 W]
    for r, m in enumerate(mask_rows):
        if m < 0:
            continue
        row_allowed = torch.zeros(vocab, dtype=torch.bool)
        n = min(vocab, allowed.shape[1])
        row_allowed[:n] = allowed[m, :n]
        out[r, ~row_allowed] = float("-inf")
    return out


def random_bitmask(rng: np.random.Generator, rows: int, words: int) -> torch.Tensor:
    kind = rng.integers(0, 4, size=(rows, words))  # all ones, all zeros, sparse, random
    rand = rng.integers(-(2**31), 2**31, size=(rows, words), dtype=np.int64)
    sparse = np.left_shift(1, rng.integers(0, 31, size=(rows, words)))
    values = np.where(kind == 0, -1, np.where(kind == 1, 0, np.where(kind == 2, sparse, rand)))
    return torch.from_numpy(values.astype(np.int32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(device, dtype):
    rng = np.random.default_rng()
    seed = int(rng.integers(1 << 30))
    rng = np.random.default_rng(seed)
    for _ in range(5):
        rows = int(rng.integers(1, 40))
        vocab = int(rng.integers(1, 3000))
        mask_row_count = int(rng.integers(1, 40))
        words = bitmask_words(vocab) - int(rng.integers(0, 2) if vocab > 64 else 0)  # sometimes narrower
        bitmask = random_bitmask(rng, mask_row_count, words)
        mask_rows = [int(x) for x in rng.integers(-1, mask_row_count, size=rows)]
        logits = torch.from_numpy(rng.standard_normal((rows, vocab)).astype(np.float32)).to(dtype)
        expected = reference(logits.float(), bitmask, mask_rows)
        got = logits.to(device)
        apply_token_bitmask(got, bitmask.to(device), torch.tensor(mask_rows, dtype=torch.int32, device=device))
        torch.testing.assert_close(
            got.cpu().float(), expected.to(dtype).float(), rtol=0, atol=0, msg=lambda m: f"seed {seed}: {m}"
        )


@pytest.mark.parametrize("device", DEVICES)
def test_row_r_takes_mask_row_r_and_strided_logits(device):
    vocab = 100
    full = torch.randn(3, 128)
    logits = full[:, :vocab]  # row stride 128: a view of a wider buffer
    bitmask = torch.zeros(3, bitmask_words(vocab), dtype=torch.int32)
    bitmask[0, 0] = 1  # token 0 only
    bitmask[1, 3] = 1 << 3  # token 99 only
    bitmask[2] = -1  # everything
    expected = reference(logits.clone(), bitmask, [0, 1, 2])
    target = full.to(device)
    apply_token_bitmask(target[:, :vocab], bitmask.to(device))
    torch.testing.assert_close(target[:, :vocab].cpu(), expected, rtol=0, atol=0)
    torch.testing.assert_close(target[:, vocab:].cpu(), full[:, vocab:], rtol=0, atol=0)  # never touched
    assert torch.isfinite(target[0, :vocab]).sum() == 1 and torch.isfinite(target[1, :vocab]).sum() == 1


def test_bad_arguments_raise_and_write_nothing():
    logits = torch.randn(2, 64)
    before = logits.clone()
    bitmask = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="mask_rows"):
        apply_token_bitmask(logits, bitmask, torch.tensor([0, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="int32"):
        apply_token_bitmask(logits, bitmask.long())
    with pytest.raises(ValueError, match="float32"):
        apply_token_bitmask(logits.double(), bitmask)
    with pytest.raises(ValueError, match="a row per logits row"):
        apply_token_bitmask(torch.randn(3, 64), bitmask)
    assert torch.equal(logits, before)
