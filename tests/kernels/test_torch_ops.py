"""The ``torch.ops.trillium.*`` custom operators (trillium.ops.torch_ops) and the decode forward
built on them (trillium.models.compiled), on fresh random inputs.

Each operator runs the same kernel as its typed wrapper, so results must be identical, and
``torch.library.opcheck`` must accept its schema (declared mutations), fake (shape) rule and
tracing. The decode forward must reproduce the eager model's logits exactly -- uncompiled, and
through ``torch.compile`` with no graph break -- with padding rows in its batch bucket.
"""

from __future__ import annotations

import random

import pytest
import torch

from trillium.models.compiled import CompiledDecoder, DecodeWeights
from trillium.models.config import ModelConfig
from trillium.models.llama import LlamaForCausalLM
from trillium.ops import attention, layer_ops, torch_ops  # noqa: F401  (registers torch.ops.trillium.*)
from trillium.ops.quant_linear import QuantWeight, quant_linear

ops = torch.ops.trillium


def random_quant_weight(n: int, k: int, bits: int) -> QuantWeight:
    if bits == 4:
        codes = torch.randint(0, 16, (n, k), dtype=torch.int8)
    else:
        codes = torch.randint(-128, 128, (n, k)).to(torch.int8)
    scale = torch.rand(n, k // 32) * 0.02 + 1e-3
    mins = (torch.rand(n, k // 32) - 0.5) * 0.1
    return QuantWeight.pack(codes, scale, mins, bits)


def opcheck(op: torch._ops.OpOverloadPacket, args: tuple) -> None:
    """opcheck on copies (the mutating operators run several times)."""
    copies = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    torch.library.opcheck(op, copies)


# ------------------------------------------------------------------------------------- operators
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows,n,k", [(1, 96, 64), (5, 40, 576), (3, 8, 32)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("activations", [0, 1, 2], ids=["exact", "int8", "int16"])
def test_quant_linear(bits, rows, n, k, with_bias, activations):
    weight = random_quant_weight(n, k, bits)
    bias = torch.randn(n) if with_bias else None
    x = torch.randn(rows, k)
    args = (x, weight.codes, weight.scales, weight.mins, bias, n, k, bits, activations)
    expected = quant_linear(x, weight, bias, activations=activations)
    assert torch.equal(ops.quant_linear(*args), expected)
    # The general path: a 3-D, non-contiguous input.
    x3 = torch.randn(2, k, rows).transpose(1, 2)
    expected3 = quant_linear(x3, weight, bias, activations=activations)
    assert torch.equal(ops.quant_linear(x3, *args[1:]), expected3)
    opcheck(ops.quant_linear, args)


def test_quant_linear_rejects_fields_that_do_not_describe_the_weight():
    weight = random_quant_weight(64, 64, 4)
    x = torch.randn(1, 64)
    with pytest.raises(ValueError, match="not a packed 64x96"):
        ops.quant_linear(x, weight.codes, weight.scales, weight.mins, None, 64, 96, 4, False)
    with pytest.raises(ValueError, match="features"):
        ops.quant_linear(torch.randn(1, 32), weight.codes, weight.scales, weight.mins, None, 64, 64, 4, False)


def paged_case(query_lens: list[int], context_lens: list[int], block_size: int = 16, hq: int = 4, hkv: int = 2):
    """Random caches and metadata; each request's blocks scattered through the pool, tables
    padded to a width larger than any request needs."""
    d = 64
    need = [-(-c // block_size) for c in context_lens]
    num_blocks = sum(need) + 3
    ids = random.sample(range(1, num_blocks), sum(need))
    tables, start = [], 0
    for n in need:
        tables.append(ids[start : start + n])
        start += n
    meta = attention.AttentionMetadata.build(query_lens, context_lens, tables, block_size)
    width = max(need) + 2
    padded = torch.zeros(len(tables), width, dtype=torch.int32)
    padded[:, : meta.block_tables.shape[1]] = meta.block_tables
    k_cache = torch.randn(num_blocks, block_size, hkv, d)
    v_cache = torch.randn(num_blocks, block_size, hkv, d)
    num_tokens = sum(query_lens)
    return meta, padded, k_cache, v_cache, torch.randn(num_tokens, hq, d)


@pytest.mark.parametrize(
    "query_lens,context_lens", [([1], [1]), ([1, 1, 1], [300, 17, 64]), ([5, 1, 9], [5, 40, 33])], ids=str
)
def test_store_kv_and_paged_attention(query_lens, context_lens):
    meta, padded_tables, k_cache, v_cache, query = paged_case(query_lens, context_lens)
    num_tokens, hkv, d = query.shape[0], k_cache.shape[2], k_cache.shape[3]
    qkv = torch.randn(num_tokens, 2 * hkv + 1, d)  # key and value as strided views of one tensor
    key, value = qkv[:, :hkv], qkv[:, hkv : 2 * hkv]

    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    attention.store_kv(key, value, k_ref, v_ref, meta.slot_mapping)
    ops.store_kv(key, value, k_cache, v_cache, meta.slot_mapping)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    opcheck(ops.store_kv, (key.contiguous(), value.contiguous(), k_cache, v_cache, meta.slot_mapping))

    expected = attention.paged_attention(query, k_ref, v_ref, meta, 0.125)
    args = (query, k_cache, v_cache, meta.query_start_loc, meta.context_lens, padded_tables, meta.max_query_len, 0.125)
    assert torch.equal(ops.paged_attention(*args), expected)
    opcheck(ops.paged_attention, args)


def test_paged_attention_rejects_bad_metadata():
    meta, tables, k_cache, v_cache, query = paged_case([1, 1], [10, 20])
    with pytest.raises(ValueError, match="context_lens must be a contiguous int32"):
        ops.paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.context_lens.long(), tables, 1, 1.0)
    with pytest.raises(ValueError, match="block_tables"):
        ops.paged_attention(query, k_cache, v_cache, meta.query_start_loc, meta.context_lens, tables[:1], 1, 1.0)


@pytest.mark.parametrize("rows,hidden", [(1, 576), (7, 100)])
def test_rms_norm_and_add_rms_norm(rows, hidden):
    x, weight = torch.randn(rows, hidden), torch.randn(hidden)
    assert torch.equal(ops.rms_norm(x, weight, 1e-5), layer_ops.rms_norm(x, weight, 1e-5))
    opcheck(ops.rms_norm, (x, weight, 1e-5))

    residual = torch.randn(rows, hidden)
    residual_ref = residual.clone()
    expected = layer_ops.rms_norm(x, weight, 1e-5, residual_ref)
    assert torch.equal(ops.add_rms_norm(x, residual, weight, 1e-5), expected)
    assert torch.equal(residual, residual_ref)  # the residual stream updated in place, as the wrapper does
    opcheck(ops.add_rms_norm, (x, residual, weight, 1e-5))
    with pytest.raises(ValueError, match="weight must be a contiguous fp32"):
        ops.rms_norm(x, weight.double(), 1e-5)


def test_silu_and_mul():
    gate_up = torch.randn(5, 2 * 96) * 6
    assert torch.equal(ops.silu_and_mul(gate_up), layer_ops.silu_and_mul(gate_up))
    opcheck(ops.silu_and_mul, (gate_up,))
    with pytest.raises(ValueError, match="gate_up must be a 2-D fp32"):
        ops.silu_and_mul(gate_up.double())


def test_rotary_inplace_on_a_fused_view():
    tokens, hq, hkv, d, max_pos = 6, 4, 2, 32, 512
    heads = torch.randn(tokens, hq + 2 * hkv, d)
    cos, sin = torch.randn(max_pos, d // 2), torch.randn(max_pos, d // 2)
    positions = torch.randint(0, max_pos, (tokens,))
    expected = heads.clone()
    layer_ops.rotary_inplace(expected[:, : hq + hkv], cos, sin, positions)
    ops.rotary_inplace(heads[:, : hq + hkv], cos, sin, positions)
    assert torch.equal(heads, expected)  # Q and K rotated, V untouched
    opcheck(ops.rotary_inplace, (heads[:, :hq].contiguous(), cos, sin, positions))


# ---------------------------------------------------------------------------------- decode forward
BLOCK_SIZE = 16


def tiny_model(quantized: bool, tied: bool) -> LlamaForCausalLM:
    config = ModelConfig(
        architecture="llama",
        name="tiny",
        num_layers=2,
        hidden_size=64,
        intermediate_size=96,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        vocab_size=128,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
    )
    model = LlamaForCausalLM(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    model._use_column_major_weights()
    if quantized:
        shapes = {name: m.weight.shape for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        shapes.setdefault("lm_head", (config.vocab_size, config.hidden_size))
        model.use_quant_weights({name: random_quant_weight(n, k, 4) for name, (n, k) in shapes.items()})
    return model


def prefill(model: LlamaForCausalLM, kv_caches, prompt_lens: list[int]) -> tuple[list[list[int]], list[int]]:
    """Random prompts stored in the caches; returns block tables and each prompt's first token."""
    tables, first = [], []
    for r, n in enumerate(prompt_lens):
        table = [1 + 4 * r + i for i in range(4)]
        ids = torch.randint(0, model.config.vocab_size, (n,))
        meta = attention.AttentionMetadata.build([n], [n], [table], BLOCK_SIZE)
        hidden = model(ids, torch.arange(n), kv_caches, meta)
        tables.append(table)
        first.append(int(model.compute_logits(hidden[-1:]).argmax()))
    return tables, first


def eager_decode(model, kv_caches, tokens, positions, tables) -> torch.Tensor:
    meta = attention.AttentionMetadata.build([1] * len(tokens), [p + 1 for p in positions], tables, BLOCK_SIZE)
    return model.compute_logits(model(torch.tensor(tokens), torch.tensor(positions), kv_caches, meta))


def decode_both(model, decoder: CompiledDecoder, prompt_lens: list[int], steps: int) -> None:
    """Greedy decode from the same KV with the eager model and ``decoder``: equal logits, equal caches."""
    kv_caches = decoder.kv_caches
    with torch.inference_mode():
        tables, first = prefill(model, kv_caches, prompt_lens)
        saved = [(k.clone(), v.clone()) for k, v in kv_caches]
        eager_kv = [(k.clone(), v.clone()) for k, v in kv_caches]
        tokens, positions = first, list(prompt_lens)
        for _ in range(steps):
            expected = eager_decode(model, eager_kv, tokens, positions, tables)
            got = decoder.step(tokens, positions, tables)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            tokens, positions = expected.argmax(-1).tolist(), [p + 1 for p in positions]
        for (k, v), (ek, ev) in zip(kv_caches, eager_kv):
            torch.testing.assert_close(k, ek, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(v, ev, rtol=1e-6, atol=1e-6)
        assert any(not torch.equal(k, k0) for (k, _), (k0, _) in zip(kv_caches, saved))


@pytest.mark.parametrize("quantized,tied", [(True, False), (False, True)], ids=["quantized", "dense-tied"])
def test_decode_forward_matches_the_model(quantized, tied):
    model = tiny_model(quantized, tied)
    kv_caches = model.allocate_kv_caches(16, BLOCK_SIZE, torch.float32)
    decoder = CompiledDecoder(model, kv_caches, BLOCK_SIZE, 8, buckets=(1, 4), compile=False)
    with torch.inference_mode():
        tables, first = prefill(model, kv_caches, [5, 17, 31])
        positions = [5, 17, 31]
        expected = eager_decode(model, [(k.clone(), v.clone()) for k, v in kv_caches], first, positions, tables)
        got = decoder.step(first, positions, tables)  # 3 requests padded to 4
    if quantized:
        assert torch.equal(got, expected)  # the same kernels; rows are computed independently
    else:
        # MKL's sgemm may block 4 rows differently from 3: equal up to summation order.
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_compiled_decode_matches_eager_without_graph_breaks():
    """fullgraph=True: a graph break would raise. Two buckets, the second with a padding row."""
    torch._dynamo.reset()
    model = tiny_model(quantized=True, tied=False)
    kv_caches = model.allocate_kv_caches(16, BLOCK_SIZE, torch.float32)
    decoder = CompiledDecoder(model, kv_caches, BLOCK_SIZE, 8, buckets=(1, 4))
    decode_both(model, decoder, [7], steps=3)
    decode_both(model, decoder, [3, 16, 20], steps=3)


def test_decoder_rejects_what_it_cannot_run():
    model = tiny_model(quantized=False, tied=False)
    kv_caches = model.allocate_kv_caches(16, BLOCK_SIZE, torch.float32)
    decoder = CompiledDecoder(model, kv_caches, BLOCK_SIZE, 2, buckets=(1, 2), compile=False)
    with pytest.raises(ValueError, match="exceed the largest decode bucket 2"):
        decoder.bucket(3)
    with pytest.raises(ValueError, match="cannot hold position 40"):
        decoder.prepare([1], [40], [[1, 2]])
    with pytest.raises(ValueError, match="fp32 CPU model"):
        DecodeWeights.of(LlamaForCausalLM(model.config, dtype=torch.bfloat16))
