"""The named kernel specs (``trillium.ops.kernel_specs``) at the C++ boundary: ``_core`` reads them
by field name, refuses positional tuples with a TypeError, and maps bad values to ValueError."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trillium import _core
from trillium.ops.kernel_specs import DTYPE_CODES, BitmaskSpec, CacheSpec, LogitsSpec, RowsSpec


def _pool(num_blocks: int = 2, block_size: int = 4, heads: int = 1, head_dim: int = 16):
    k_cache = torch.zeros(num_blocks, block_size, heads, head_dim)
    v_cache = torch.zeros_like(k_cache)
    spec = CacheSpec(
        k_ptr=k_cache.data_ptr(),
        v_ptr=v_cache.data_ptr(),
        dtype=DTYPE_CODES[torch.float32],
        num_blocks=num_blocks,
        block_size=block_size,
        num_kv_heads=heads,
        head_dim=head_dim,
    )
    return k_cache, v_cache, spec


def _rows(x: torch.Tensor) -> RowsSpec:
    return RowsSpec(
        data_ptr=x.data_ptr(),
        num_heads=x.shape[1],
        stride_token=x.stride(0),
        stride_head=x.stride(1),
        dtype=DTYPE_CODES[x.dtype],
    )


def test_specs_are_read_by_field_name() -> None:
    """Any object with the named attributes works, whatever its field order: the names are the contract."""
    k_cache, v_cache, cache = _pool()
    key = torch.arange(16, dtype=torch.float32).view(1, 1, 16)
    slots = torch.tensor([5], dtype=torch.int64)
    rows = _rows(key)
    reordered = SimpleNamespace(**dict(reversed(list(rows._asdict().items()))))
    _core.store_kv(reordered, rows, cache, slots.data_ptr(), 1, 1)
    assert torch.equal(k_cache.view(-1, 16)[5], key[0, 0]) and torch.equal(v_cache.view(-1, 16)[5], key[0, 0])


def test_positional_tuples_are_refused() -> None:
    _k_cache, _v_cache, cache = _pool()  # the tensors stay alive: cache holds their addresses
    key = torch.zeros(1, 1, 16)
    slots = torch.tensor([0], dtype=torch.int64)
    with pytest.raises(TypeError, match="RowsSpec"):
        _core.store_kv(tuple(_rows(key)), _rows(key), cache, slots.data_ptr(), 1, 1)
    with pytest.raises(TypeError, match="CacheSpec"):
        _core.store_kv(_rows(key), _rows(key), tuple(cache), slots.data_ptr(), 1, 1)
    logits = torch.zeros(1, 32)
    bitmask = torch.zeros(1, 1, dtype=torch.int32)
    logits_spec = LogitsSpec(data_ptr=logits.data_ptr(), dtype=0, row_stride=32, num_rows=1, vocab_size=32)
    bitmask_spec = BitmaskSpec(data_ptr=bitmask.data_ptr(), row_stride=1, num_mask_rows=1, num_words=1)
    with pytest.raises(TypeError, match="LogitsSpec"):
        _core.apply_token_bitmask(tuple(logits_spec), bitmask_spec, 0)
    _core.apply_token_bitmask(logits_spec, bitmask_spec, 0)
    assert bool(torch.isinf(logits).all())  # every bit 0: every token masked


def test_bad_values_are_value_errors() -> None:
    k_cache, _v_cache, cache = _pool()
    key = torch.zeros(1, 1, 16)
    slots = torch.tensor([0], dtype=torch.int64)
    with pytest.raises(ValueError, match="unknown dtype code 7"):
        _core.store_kv(_rows(key)._replace(dtype=7), _rows(key), cache, slots.data_ptr(), 1, 1)
    with pytest.raises(ValueError, match="head counts"):
        _core.store_kv(_rows(key), _rows(key), cache._replace(num_kv_heads=2), slots.data_ptr(), 1, 1)
    out_of_pool = torch.tensor([99], dtype=torch.int64)
    with pytest.raises(ValueError):
        _core.store_kv(_rows(key), _rows(key), cache, out_of_pool.data_ptr(), 1, 1)
    assert not bool(k_cache.any())
