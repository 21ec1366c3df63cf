"""The block-quantized linear kernel (``_core.quant_linear``) against its float64 oracle.

Fresh random codes, scales, mins and activations every run, every ISA this CPU runs, every format
(4-, 5-, 6- and 8-bit codes; GGUF's Q4_0 ... Q6_K). The exact path (fp32 activations) equals a
float64 matmul over the dequantized weights up to fp32 summation order. In int8 mode (4 and 8 bits)
the kernel quantizes activations to int8 per 32-block, in int16 mode (every format) to int16;
``reference_quant_linear`` does the same in torch and float64, so the two agree to fp32 rounding
(tests/cpp/test_quant_linear.cc checks int16 mode bit for bit against a rounding-exact oracle). GGUF blocks decode to exactly what the
``gguf`` package's dequantization returns, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize

from trillium import _core
from trillium.models.gguf_quant import SUPPORTED, TWO_LEVEL, Blocks, block_codes_from_raw, blocks_from_raw, pack_fused
from trillium.ops.quant_linear import (
    Activations,
    BoundQuantLinear,
    QuantWeight,
    dequantize_blocks,
    quant_linear,
    reference_quant_linear,
    scale_block,
    symmetric_offset,
)

ISAS = _core.supported_kernel_isas()
EXACT, INT8, INT16 = Activations.EXACT, Activations.INT8, Activations.INT16
MODES = [EXACT, INT8, INT16]


@pytest.fixture(autouse=True)
def restore_isa():
    before = _core.kernel_isa()
    yield
    _core.set_kernel_isa(before)


def random_weight(n: int, k: int, bits: int, gen: torch.Generator, symmetric: bool = False):
    """Codes, scale and min of a random [n, k] weight (``symmetric``: the format's no-mins codes)."""
    if bits == 8:
        codes = torch.randint(-128, 128, (n, k), generator=gen).to(torch.int8)
    else:
        codes = torch.randint(0, 1 << bits, (n, k), dtype=torch.int8, generator=gen)
    blocks = k // scale_block(bits)
    scale = torch.rand(n, blocks, generator=gen) * 0.02 + 1e-3
    mins = (torch.rand(n, blocks, generator=gen) - 0.5) * 0.1
    if symmetric:
        mins = scale * -float(symmetric_offset(bits))
    return codes, scale, mins


ALL_BITS = [4, 5, 6, 8]


SHAPES = [(1, 8, 32), (1, 13, 64), (3, 576, 576), (4, 20, 96), (7, 960, 576), (33, 100, 1536), (70, 24, 64)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(isa, bits, shape):
    m, n, k = shape
    gen = torch.Generator().manual_seed(hash((isa, bits, shape)) % 2**31 + np.random.randint(1 << 20))
    codes, scale, mins = random_weight(n, k, bits, gen)
    weight = QuantWeight.pack(codes, scale, mins, bits)
    x = torch.randn(m, k, generator=gen) * 3
    x[0, :5] = 0.0  # a partly zero block
    if k >= 64:
        x[-1, 32:64] = 0.0  # an all-zero block: scale 0, no division by zero
    bias = torch.randn(n, generator=gen)
    _core.set_kernel_isa(isa)
    out = quant_linear(x, weight, bias, activations=INT8)
    ref = reference_quant_linear(x, codes, scale, mins, bias)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    dense = x.double() @ dequantize_blocks(codes, scale, mins).double().T + bias.double()
    assert ((out.double() - dense).abs().max() / dense.abs().max()).item() < 3e-2


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bits", ALL_BITS)
@pytest.mark.parametrize("symmetric", [False, True], ids=["mins", "no-mins"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_int16_mode_matches_its_reference(isa, bits, symmetric, shape):
    """int16 activations, every format: the kernel's activation rounding and exact integer dots
    agree with the float64 oracle to fp32 rounding, and stay within 2e-4 of the exact product (a
    wrong code order or scale would be off by the size of the output)."""
    m, n, k = shape
    gen = torch.Generator().manual_seed(np.random.randint(1 << 30))
    codes, scale, mins = random_weight(n, k, bits, gen, symmetric)
    weight = QuantWeight.pack(codes, scale, mins, bits)
    x = torch.randn(m, k, generator=gen) * 3
    x[0, :5] = 0.0
    if k >= 64:
        x[-1, 32:64] = 0.0  # an all-zero block: scale 0
    bias = torch.randn(n, generator=gen)
    _core.set_kernel_isa(isa)
    out = quant_linear(x, weight, bias, activations=INT16).double()
    ref = reference_quant_linear(x, codes, scale, mins, bias, activations=INT16)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    dense = x.double() @ dequantize_blocks(codes, scale, mins).double().T + bias.double()
    assert ((out - dense).abs().max() / dense.abs().max()).item() < 2e-4


@pytest.mark.parametrize("mode", [EXACT, INT16], ids=lambda m: m.name)
@pytest.mark.parametrize("bits", ALL_BITS)
def test_rows_do_not_depend_on_the_batch_in_either_fast_or_exact_mode(bits, mode):
    """Every row count (the one-row tiles, the few-row tiles, the panel beyond) gives a row the
    same bits as the row alone, on every ISA: speculation's verify rows equal the decode rows
    they replace, and a seeded sample does not depend on what else is in the step."""
    gen = torch.Generator().manual_seed(np.random.randint(1 << 30))
    codes, scale, mins = random_weight(100, 128, bits, gen)
    weight = QuantWeight.pack(codes, scale, mins, bits)
    x = torch.randn(33, 128, generator=gen)
    _core.set_kernel_isa("portable")
    expected = torch.cat([quant_linear(x[r : r + 1], weight, activations=mode) for r in range(x.shape[0])])
    for isa in ISAS:
        _core.set_kernel_isa(isa)
        for rows in [*range(1, 10), 13, 25, 33]:
            assert torch.equal(quant_linear(x[:rows], weight, activations=mode), expected[:rows]), (isa, rows)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bits", ALL_BITS)
@pytest.mark.parametrize("symmetric", [False, True], ids=["mins", "no-mins"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_exact_path_matches_dense_matmul(isa, bits, symmetric, shape):
    """fp32 activations (the default): equal to a matmul over the dequantized weights up to fp32
    summation order, with mins and with the format's symmetric codes (no mins packed)."""
    m, n, k = shape
    gen = torch.Generator().manual_seed(np.random.randint(1 << 30))
    codes, scale, mins = random_weight(n, k, bits, gen, symmetric)
    weight = QuantWeight.pack(codes, scale, mins, bits)
    assert (weight.mins.numel() == 0) == (symmetric or (bits == 8 and not mins.any()))
    x = torch.randn(m, k, generator=gen) * 3
    bias = torch.randn(n, generator=gen)
    _core.set_kernel_isa(isa)
    out = quant_linear(x, weight, bias)
    dense = x.double() @ dequantize_blocks(codes, scale, mins).double().T + bias.double()
    scale_of = (x.double().abs() @ dequantize_blocks(codes, scale, mins).double().abs().T).max().item()
    assert (out.double() - dense).abs().max().item() <= 1e-6 * scale_of * k**0.5


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("bits", ALL_BITS)
def test_every_isa_gives_identical_bits(bits, mode):
    if mode == INT8 and bits not in (4, 8):
        pytest.skip("int8 activations take 4- and 8-bit weights")
    gen = torch.Generator().manual_seed(np.random.randint(1 << 30))
    codes, scale, mins = random_weight(40, 256, bits, gen)
    weight = QuantWeight.pack(codes, scale, mins, bits)
    x = torch.randn(9, 256, generator=gen)
    results = []
    for isa in ISAS:
        _core.set_kernel_isa(isa)
        results.append(quant_linear(x, weight, activations=mode))
    for other in results[1:]:
        assert torch.equal(results[0], other)


@pytest.mark.parametrize("bits", ALL_BITS)
@pytest.mark.parametrize("n", [40, 100])
def test_exact_rows_do_not_depend_on_row_count_or_isa(bits, n):
    """The exact path's register tiles differ by row count (1 row, 2-8 rows, a dequantized panel
    beyond) and by ISA (256- or 512-bit lanes), but every row gets the same bits: a speculative
    verify step's rows must equal the decode steps they replace (n = 100: a partial last tile)."""
    gen = torch.Generator().manual_seed(np.random.randint(1 << 30))
    codes, scale, mins = random_weight(n, 128, bits, gen)
    weight = QuantWeight.pack(codes, scale, mins, bits)
    x = torch.randn(33, 128, generator=gen)
    bias = torch.randn(n, generator=gen)
    _core.set_kernel_isa("portable")
    expected = torch.cat([quant_linear(x[r : r + 1], weight, bias) for r in range(x.shape[0])])
    for isa in ISAS:
        _core.set_kernel_isa(isa)
        for rows in [*range(1, 14), 16, 20, 25, 33]:
            assert torch.equal(quant_linear(x[:rows], weight, bias), expected[:rows]), (isa, rows)


def test_strided_rows_out_buffer_and_leading_dims():
    gen = torch.Generator().manual_seed(np.random.randint(1 << 30))
    codes, scale, mins = random_weight(24, 64, 4, gen)
    weight = QuantWeight.pack(codes, scale, mins, 4)
    wide = torch.randn(6, 100, generator=gen)
    x = wide[:, 10:74]  # row stride 100, not contiguous
    out = torch.full((6, 24), float("nan"))
    quant_linear(x, weight, out=out, activations=INT8)
    torch.testing.assert_close(
        out.double(), reference_quant_linear(x.contiguous(), codes, scale, mins), rtol=1e-5, atol=1e-4
    )
    batched = quant_linear(x.reshape(2, 3, 64), weight, activations=INT8)
    assert batched.shape == (2, 3, 24)
    torch.testing.assert_close(batched.reshape(6, 24), out)
    assert quant_linear(torch.empty(0, 64), weight).shape == (0, 24)


def test_bad_input_is_rejected():
    codes = torch.zeros(8, 32, dtype=torch.int8)
    scale = torch.ones(8, 1)
    with pytest.raises(ValueError, match="bits"):
        QuantWeight.pack(codes, scale, scale, 7)
    with pytest.raises(ValueError, match="multiple of 32"):
        QuantWeight.pack(torch.zeros(8, 48, dtype=torch.int8), torch.ones(8, 1), torch.ones(8, 1), 4)
    with pytest.raises(ValueError, match=r"\[8, 2\]"):  # 6 bits: a scale per 16 weights
        QuantWeight.pack(codes, scale, scale, 6)
    bad = codes.clone()
    bad[3, 7] = 16
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        QuantWeight.pack(bad, scale, scale, 4)
    bad[3, 7] = 32
    with pytest.raises(ValueError, match=r"\[0, 31\]"):
        QuantWeight.pack(bad, scale, scale, 5)
    weight = QuantWeight.pack(codes, scale, scale, 4)
    with pytest.raises(ValueError, match="features"):
        quant_linear(torch.randn(2, 64), weight)
    with pytest.raises(ValueError, match="fp32"):
        quant_linear(torch.randn(2, 32, dtype=torch.bfloat16), weight)
    five = QuantWeight.pack(codes, scale, scale, 5)
    with pytest.raises(ValueError, match="int8 activations take 4- and 8-bit"):
        quant_linear(torch.randn(2, 32), five, activations=INT8)


def test_parts_write_their_columns():
    """A fused projection stored in parts of different formats (a Q4_K_M file's q, k in Q4_K and v
    in Q6_K) gives the bits of one weight per part, concatenated, bias slices included."""
    gen = torch.Generator().manual_seed(np.random.randint(1 << 30))
    pieces = [random_weight(40, 128, 4, gen), random_weight(16, 128, 4, gen), random_weight(24, 128, 6, gen, True)]
    bits = [4, 4, 6]
    packed = pack_fused([Blocks(c.numpy(), s.numpy(), m.numpy(), b) for (c, s, m), b in zip(pieces, bits, strict=True)])
    assert isinstance(packed, tuple) and [p.bits for p in packed] == [4, 6]
    assert [p.out_features for p in packed] == [56, 24]
    op = BoundQuantLinear(packed, bias := torch.randn(80, generator=gen))
    x = torch.randn(5, 128, generator=gen)
    singles = [QuantWeight.pack(c, s, m, b) for (c, s, m), b in zip(pieces, bits, strict=True)]
    expected = torch.cat([quant_linear(x, w, bias[o : o + w.out_features]) for w, o in zip(singles, (0, 40, 56))], 1)
    assert torch.equal(op(x), expected)
    assert op(x.view(5, 1, 128)).shape == (5, 1, 80)
    with pytest.raises(ValueError, match="same in_features"):
        BoundQuantLinear([singles[0], QuantWeight.pack(*random_weight(8, 64, 4, gen), 4)])


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_bound_op_equals_the_function(mode):
    """BoundQuantLinear (arguments resolved once) gives quant_linear's exact bits, on its short path
    (contiguous [T, K]) and on the checked one (strided rows, leading dims); checks stay in place."""
    gen = torch.Generator().manual_seed(np.random.randint(1 << 30))
    codes, scale, mins = random_weight(24, 64, 4, gen)
    weight = QuantWeight.pack(codes, scale, mins, 4)
    bias = torch.randn(24, generator=gen)
    op = BoundQuantLinear(weight, bias, activations=mode)
    x = torch.randn(5, 64, generator=gen)
    assert torch.equal(op(x), quant_linear(x, weight, bias, activations=mode))
    strided = torch.randn(5, 100, generator=gen)[:, 3:67]
    assert torch.equal(op(strided), quant_linear(strided.contiguous(), weight, bias, activations=mode))
    assert op(x.view(5, 1, 64)).shape == (5, 1, 24)
    with pytest.raises(ValueError, match="features"):
        op(torch.randn(2, 32))
    with pytest.raises(ValueError, match="fp32"):
        op(x.to(torch.bfloat16))
    with pytest.raises(ValueError, match="bias"):
        BoundQuantLinear(weight, torch.zeros(23))


# Byte offsets of a block's fp16 scales (d, and dmin or m where the type has one).
_F16_AT = {QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q8_0: (0,), QT.Q4_K: (0, 2),
           QT.Q5_K: (0, 2), QT.Q6_K: (208,)}  # fmt: skip


def random_blocks(qtype: QT, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Raw bytes of an [n, k] tensor of ``qtype``: every bit random except the fp16 scales, which
    are finite (random bits there would be NaN or inf now and then)."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n * k // block, size), dtype=np.uint8)
    for at in _F16_AT[qtype]:
        d = (rng.uniform(1e-3, 5e-2, raw.shape[0]) * rng.choice([-1, 1], raw.shape[0])).astype(np.float16)
        raw[:, at : at + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw


@pytest.mark.parametrize("qtype", list(SUPPORTED), ids=lambda t: QT(t).name)
def test_gguf_blocks_decode_exactly(qtype):
    """Fresh random GGUF blocks of every kernel type, packed, stand for exactly what the gguf
    package's dequantization returns: the kernel's row lookup gives its values bit for bit, and
    the exact matmul agrees with a float64 matmul over them to fp32 summation order."""
    rng = np.random.default_rng()
    n, k = 40, 512
    raw = random_blocks(QT(qtype), n, k, rng)
    codes, scale, mins, bits = block_codes_from_raw(raw, qtype, n, k)
    weight = QuantWeight.pack(torch.from_numpy(codes), torch.from_numpy(scale), torch.from_numpy(mins), bits)
    theirs = torch.from_numpy(dequantize(raw, qtype).reshape(n, k).astype(np.float32))
    assert torch.equal(weight.dequantize_rows(torch.arange(n)), theirs)
    assert torch.equal(
        dequantize_blocks(torch.from_numpy(codes), torch.from_numpy(scale), torch.from_numpy(mins)), theirs
    )
    x = torch.randn(3, k)
    out = quant_linear(x, weight).double()
    ref = x.double() @ theirs.double().T
    bound = (x.double().abs() @ theirs.double().abs().T).max().item() * 1e-6 * k**0.5
    assert (out - ref).abs().max().item() <= bound
    # Symmetric types keep no mins: they are -offset * scale, derived in the kernel.
    assert (weight.mins.numel() == 0) == (QT(qtype) in (QT.Q4_0, QT.Q5_0, QT.Q6_K, QT.Q8_0))
    # As served: the K-quants with their two-level scales (super fp32 x integer sub-scales), the
    # same values and, on every ISA, the same bits as the per-block fp32 scales.
    served = blocks_from_raw(raw, qtype, n, k).pack()
    assert served.two_level == (QT(qtype) in TWO_LEVEL)
    assert served.nbytes <= weight.nbytes
    assert torch.equal(served.dequantize_rows(torch.arange(n)), theirs)
    for isa in ISAS:
        _core.set_kernel_isa(isa)
        for rows in (1, 3, 11):  # one row, the register tiles, the panel path
            for mode in (EXACT, INT16):
                xs = x[:1].repeat(rows, 1)
                assert torch.equal(
                    quant_linear(xs, served, activations=mode), quant_linear(xs, weight, activations=mode)
                )


def test_row_lookup_rejects_rows_outside_the_table():
    gen = torch.Generator().manual_seed(np.random.randint(1 << 30))
    weight = QuantWeight.pack(*random_weight(10, 64, 5, gen), 5)
    assert weight.dequantize_rows(torch.tensor([[9, 0]])).shape == (1, 2, 64)
    with pytest.raises(ValueError, match="outside"):
        weight.dequantize_rows(torch.tensor([10]))


@pytest.mark.parametrize("bits", ALL_BITS)
def test_exact_rows_do_not_depend_on_the_batch(bits):
    """A request's logits must not change with what else is in the step (seeded sampling relies on
    it): each row alone, in small batches (register path) and in large ones (panel path) is bit-equal."""
    gen = torch.Generator().manual_seed(np.random.randint(1 << 30))
    codes, scale, mins = random_weight(40, 192, bits, gen)
    weight = QuantWeight.pack(codes, scale, mins, bits)
    x = torch.randn(70, 192, generator=gen)
    full = quant_linear(x, weight)
    for rows in (slice(0, 1), slice(5, 7), slice(10, 13), slice(64, 70), slice(3, 9)):
        assert torch.equal(quant_linear(x[rows], weight), full[rows])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("rows", [1, 2, 5])
def test_zero_mins_are_not_packed_and_change_nothing(isa, mode, rows):
    """Symmetric codes (Q8_0: every min 0) pack no mins, and the kernels that then read none give
    the same bits as with an explicit all-zero mins buffer (the one-row, few-row and panel paths)."""
    gen = torch.Generator().manual_seed(np.random.randint(1 << 30))
    codes, scale, _ = random_weight(44, 192, 8, gen)
    lean = QuantWeight.pack(codes, scale, torch.zeros_like(scale), 8)
    assert lean.mins.numel() == 0
    full = QuantWeight(
        lean.out_features, lean.in_features, 8, lean.codes, lean.scales, torch.zeros(lean.scales.numel())
    )
    x = torch.randn(rows, 192, generator=gen)
    _core.set_kernel_isa(isa)
    lean_out = quant_linear(x, lean, activations=mode)
    assert torch.equal(lean_out, quant_linear(x, full, activations=mode))
    zero = torch.zeros_like(scale)
    if mode != EXACT:
        ref = reference_quant_linear(x, codes, scale, zero, activations=mode)
    else:
        ref = x.double() @ dequantize_blocks(codes, scale, zero).double().T
    torch.testing.assert_close(lean_out.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
