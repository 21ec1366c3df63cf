"""Fused decoder-layer ops (``_core.rms_norm``, ``silu_and_mul`` with SiLU or GELU-tanh, ``rotary_inplace``) against the
torch formulas they replace, on fresh random inputs, every ISA this CPU runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trillium import _core
from trillium.models.layers import apply_rotary
from trillium.ops.layer_ops import GELU_TANH, rms_norm, rotary_inplace, silu_and_mul

ISAS = _core.supported_kernel_isas()


@pytest.fixture(autouse=True)
def isa_restored():
    before = _core.kernel_isa()
    yield
    _core.set_kernel_isa(before)


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(int(np.random.randint(1 << 30)))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows,hidden", [(1, 576), (7, 100), (300, 64)])
def test_rms_norm_with_and_without_residual(isa, rows, hidden):
    _core.set_kernel_isa(isa)
    g = gen()
    x, res = torch.randn(rows, hidden, generator=g), torch.randn(rows, hidden, generator=g) * 3
    weight = torch.randn(hidden, generator=g)

    def ref(v):
        return weight * (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-5))

    torch.testing.assert_close(rms_norm(x, weight, 1e-5), ref(x), rtol=1e-5, atol=1e-5)
    expected_sum = x + res
    out = rms_norm(x, weight, 1e-5, residual=res)
    torch.testing.assert_close(res, expected_sum, rtol=0, atol=0)  # residual now holds x + residual
    torch.testing.assert_close(out, ref(expected_sum), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows,inter", [(1, 1536), (5, 20), (64, 1536)])
def test_silu_and_mul(isa, rows, inter):
    _core.set_kernel_isa(isa)
    gate_up = torch.randn(rows, 2 * inter, generator=gen()) * 6  # well into both tails of silu
    gate, up = gate_up.split(inter, dim=-1)
    torch.testing.assert_close(silu_and_mul(gate_up), F.silu(gate) * up, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows,inter", [(1, 2048), (5, 20), (33, 640)])
def test_gelu_tanh_and_mul(isa, rows, inter):
    """Gemma's gate: GELU with the tanh approximation, computed as g * sigmoid(2u)."""
    _core.set_kernel_isa(isa)
    gate_up = torch.randn(rows, 2 * inter, generator=gen()) * 6
    gate_up[0, :4] = torch.tensor([0.0, -30.0, 30.0, 1e20])  # the tails and a cube that overflows
    gate, up = gate_up.split(inter, dim=-1)
    # In fp64: torch's fp32 0.5 g (1 + tanh(u)) cancels in the negative tail (1 + tanh(u) of
    # u < -8 rounds to a few ulps of 1 or to 0), where g * sigmoid(2u) keeps its precision.
    expected = (F.gelu(gate.double(), approximate="tanh") * up.double()).float()
    torch.testing.assert_close(silu_and_mul(gate_up, GELU_TANH), expected, rtol=4e-6, atol=1e-6)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("head_dim", [64, 128, 24])
def test_rotary_inplace_on_a_fused_view(isa, head_dim):
    _core.set_kernel_isa(isa)
    g = gen()
    tokens, hq, hkv, max_pos = 9, 6, 2, 4096
    qkv = torch.randn(tokens, (hq + 2 * hkv) * head_dim, generator=g)
    heads = qkv.view(tokens, hq + 2 * hkv, head_dim)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    cos, sin = freqs.cos(), freqs.sin()
    positions = torch.randint(0, max_pos, (tokens,), generator=g)
    before = heads.clone()
    expected = apply_rotary(before[:, : hq + hkv], cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))
    rotary_inplace(heads[:, : hq + hkv], cos, sin, positions)
    torch.testing.assert_close(heads[:, : hq + hkv], expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(heads[:, hq + hkv :], before[:, hq + hkv :])  # V untouched


def test_rotary_rejects_positions_outside_the_table():
    x = torch.randn(2, 1, 64)
    table = torch.randn(10, 32)
    with pytest.raises(ValueError, match="outside the table"):
        rotary_inplace(x, table, table, torch.tensor([3, 10]))
