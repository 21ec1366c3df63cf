"""Paged attention and KV store kernels against the torch reference, on fresh random inputs.

Targets: every CPU instruction set ``trillium._core`` can run here (avx512 / avx2 / portable), and
``trillium._cuda`` on a GPU (marked ``gpu``; skipped without one). The reference is
:mod:`trillium.ops.attention_ref` (gather the paged KV, torch SDPA) evaluated in fp32.

Shapes are sampled anew every run from the ranges the kernels must cover -- batch 1-64, context
1-4096, block size 16/32, head_dim 64/128, GQA ratio 1/3/4/8, ragged lengths, contexts that are not
block multiples -- rather than a full cross product, so the file stays well under a minute on two
cores. Every failure message carries its seed; ``TRILLIUM_TEST_SEED=<seed>`` replays it.

Poison: unused and padding blocks of the pool are NaN (a stray read shows up in the output) and
the output buffer starts as NaN (an unwritten element shows up as NaN).
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass

import pytest
import torch

from trillium import _core
from trillium.ops import attention, attention_ref

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}  # max |out - ref| / max |ref|
GQA_RATIOS = [1, 3, 4, 8]
MAX_GATHERED_TOKENS = 48 * 1024  # R x max_context bound: keeps the reference's padded gather small


def _cuda_available() -> bool:
    try:
        from trillium import _cuda
    except ImportError:
        return False
    return torch.cuda.is_available() and _cuda.device_count() > 0


TARGETS = [pytest.param(("cpu", isa), id=f"cpu-{isa}") for isa in _core.supported_kernel_isas()] + [
    pytest.param(
        ("cuda", None),
        id="cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and trillium._cuda"),
        ],
    )
]


@pytest.fixture(params=TARGETS)
def target(request):
    """The device to run on; for CPU targets, the kernel ISA is forced for the test's duration."""
    device, isa = request.param
    if device == "cpu":
        previous = _core.kernel_isa()
        _core.set_kernel_isa(isa)
        yield "cpu"
        _core.set_kernel_isa(previous)
    else:
        yield "cuda"


@pytest.fixture
def threads():
    """Sets torch's (and so the kernels') thread count for one test; restores it after."""
    previous = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(previous)


def _seed() -> int:
    env = os.environ.get("TRILLIUM_TEST_SEED")
    return int(env) if env else random.SystemRandom().randrange(2**32)


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return min(high, max(low, round(math.exp(rng.uniform(math.log(low), math.log(high))))))


@dataclass
class Case:
    """One batch: per request (cached_len, query_len); shapes of the pool."""

    spec: list[tuple[int, int]]
    block_size: int
    head_dim: int
    num_kv_heads: int
    group: int
    strided_query: bool  # query as a view of a fused [T, Hq + 2 Hkv, D] projection
    window: int = 0  # sliding-window attention (0: none)
    softcap: float = 0.0  # score soft-capping (0: none)

    def describe(self) -> str:
        lens = [c + n for c, n in self.spec]
        return (
            f"R={len(self.spec)} ctx=[{min(lens)}..{max(lens)}] qlen_max={max(n for _, n in self.spec)} "
            f"bs={self.block_size} D={self.head_dim} Hkv={self.num_kv_heads} G={self.group} window={self.window} "
            f"softcap={self.softcap}"
        )


def _shape(rng: random.Random, block_size: int | None = None) -> dict:
    group = rng.choice(GQA_RATIOS)
    return {
        "block_size": block_size or rng.choice([16, 32]),
        "head_dim": rng.choice([64, 128]),
        "num_kv_heads": rng.choice([1, 2]) if group > 1 else rng.choice([1, 2, 4]),
        "group": group,
        "strided_query": rng.random() < 0.5,
    }


def sample_decode(rng: random.Random) -> Case:
    max_ctx = _log_uniform(rng, 1, 4096)
    batch = _log_uniform(rng, 1, min(64, MAX_GATHERED_TOKENS // max_ctx))
    lens = [max_ctx] + [rng.randint(1, max_ctx) for _ in range(batch - 1)]
    rng.shuffle(lens)
    return Case(spec=[(c - 1, 1) for c in lens], **_shape(rng))


def sample_extend(rng: random.Random) -> Case:
    """Prefill, chunked prefill on a cached prefix, and decode rows, mixed in one batch."""
    if rng.random() < 0.25:  # one long prefill chunk, maybe after a cached prefix
        spec = [(rng.choice([0, _log_uniform(rng, 1, 2048)]), _log_uniform(rng, 512, 2048))]
    else:
        spec = []
        for _ in range(_log_uniform(rng, 1, 12)):
            kind = rng.random()
            if kind < 0.3:
                spec.append((_log_uniform(rng, 1, 3000), 1))  # decode row
            elif kind < 0.6:
                spec.append((0, _log_uniform(rng, 1, 300)))  # fresh prefill
            else:
                spec.append((_log_uniform(rng, 1, 2000), _log_uniform(rng, 2, 300)))  # chunk on a prefix
    return Case(spec=spec, **_shape(rng))


def _build(case: Case, dtype: torch.dtype, device: str, rng: random.Random, gen: torch.Generator):
    """Pool with every request's full K/V written (cached prefix by torch indexing, this step's
    tokens by the store_kv kernel), the metadata and the query."""
    bs, hkv, d = case.block_size, case.num_kv_heads, case.head_dim
    context_lens = [c + n for c, n in case.spec]
    query_lens = [n for _, n in case.spec]
    counts = [-(-ctx // bs) for ctx in context_lens]
    num_blocks = sum(counts) + 4
    free = list(range(1, num_blocks))  # block 0 stays poison: the padding target
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(n)] for n in counts]
    meta = attention.AttentionMetadata.build(query_lens, context_lens, tables, bs, device)

    k_cache = torch.full((num_blocks, bs, hkv, d), float("nan"), dtype=dtype, device=device)
    v_cache = torch.full_like(k_cache, float("nan"))
    flat_k, flat_v = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
    for (cached, _), table in zip(case.spec, tables):
        if cached:
            slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(cached)], device=device)
            flat_k[slots] = torch.randn(cached, hkv, d, generator=gen).to(dtype).to(device)
            flat_v[slots] = torch.randn(cached, hkv, d, generator=gen).to(dtype).to(device)
    num_tokens = sum(query_lens)
    hq = hkv * case.group
    fused = torch.randn(num_tokens, hq + 2 * hkv, d, generator=gen).to(dtype).to(device)
    query, key, value = fused.split([hq, hkv, hkv], dim=1)  # strided views, like the model's
    attention.store_kv(key, value, k_cache, v_cache, meta.slot_mapping)
    if not case.strided_query:
        query = query.contiguous()
    return meta, k_cache, v_cache, query


def _check(case: Case, dtype: torch.dtype, device: str, seed: int) -> None:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    meta, k_cache, v_cache, query = _build(case, dtype, device, rng, gen)
    scale = case.head_dim**-0.5
    out = torch.full(query.shape, float("nan"), dtype=dtype, device=device)
    result = attention.paged_attention(
        query, k_cache, v_cache, meta, scale, out=out, window=case.window, softcap=case.softcap
    )
    assert result.data_ptr() == out.data_ptr()
    expected = attention_ref.paged_attention(
        query.float(), k_cache.float(), v_cache.float(), meta, scale, window=case.window, softcap=case.softcap
    )
    context = f"seed {seed}: {case.describe()} {dtype}"
    assert bool(torch.isfinite(out).all()), f"unwritten or NaN output elements ({context})"
    err = ((out.float() - expected).abs().max() / expected.abs().max().clamp_min(1e-6)).item()
    assert err < TOLERANCE[dtype], f"relative error {err:.2e} ({context})"


DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("draw", range(10))
def test_decode_matches_reference(target, dtype, draw, threads) -> None:
    seed = _seed()
    rng = random.Random(seed)
    threads(rng.choice([1, 2, 3]))  # the split-context plan depends on it; results must not
    _check(sample_decode(rng), dtype, target, rng.randrange(2**32))


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and trillium._cuda")
@pytest.mark.parametrize("bound", [1, 3, 40])
@pytest.mark.parametrize("draw", range(4))
def test_cuda_decode_with_a_loose_context_bound(bound, draw) -> None:
    """A captured decode step plans its splits for the longest context it may ever see, not this
    step's: the split-KV kernel must give the same result for any bound at least the real one."""
    seed = _seed()
    rng = random.Random(seed)
    case = sample_decode(rng)
    sub = rng.randrange(2**32)
    meta, k_cache, v_cache, query = _build(
        case, torch.bfloat16, "cuda", random.Random(sub), torch.Generator().manual_seed(sub)
    )
    scale = case.head_dim**-0.5
    exact = attention.paged_attention(query, k_cache, v_cache, meta, scale)
    meta.max_context_len *= bound
    meta._plans.clear()
    loose = attention.paged_attention(query, k_cache, v_cache, meta, scale)
    expected = attention_ref.paged_attention(query.float(), k_cache.float(), v_cache.float(), meta, scale)
    for out in (exact, loose):
        err = ((out.float() - expected).abs().max() / expected.abs().max().clamp_min(1e-6)).item()
        assert err < TOLERANCE[torch.bfloat16], f"seed {seed}: {case.describe()} bound x{bound}: {err:.2e}"


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and trillium._cuda")
@pytest.mark.parametrize("draw", range(6))
def test_cuda_fresh_prefill_through_flash_attention_matches_reference(draw) -> None:
    """A GPU step of prompts without a cached prefix runs flash attention over its own K/V: the
    same result as the paged reference (and nothing where a prefix is cached)."""
    seed = _seed()
    rng = random.Random(seed)
    shape = _shape(rng)
    case = Case(spec=[(0, _log_uniform(rng, 2, 700)) for _ in range(rng.randint(1, 6))], **shape)
    sub = rng.randrange(2**32)
    gen = torch.Generator().manual_seed(sub)
    meta, k_cache, v_cache, query = _build(case, torch.bfloat16, "cuda", random.Random(sub), gen)
    hkv, d = case.num_kv_heads, case.head_dim
    flat_k, flat_v = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
    key, value = flat_k[meta.slot_mapping], flat_v[meta.slot_mapping]  # this step's own K/V
    scale = d**-0.5
    out = attention.fresh_prefill_attention(query, key, value, meta, scale)
    assert out is not None, "flash attention is unavailable on this GPU / torch"
    expected = attention_ref.paged_attention(query.float(), k_cache.float(), v_cache.float(), meta, scale)
    err = ((out.float() - expected).abs().max() / expected.abs().max().clamp_min(1e-6)).item()
    assert err < TOLERANCE[torch.bfloat16], f"seed {seed}: {case.describe()}: {err:.2e}"
    chunked = Case(spec=[(3, 5)], **shape)
    meta2, _, _, q2 = _build(chunked, torch.bfloat16, "cuda", random.Random(sub), gen)
    assert attention.fresh_prefill_attention(q2, q2[:, :hkv], q2[:, :hkv], meta2, scale) is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("draw", range(10))
def test_extend_matches_reference(target, dtype, draw, threads) -> None:
    seed = _seed()
    rng = random.Random(seed)
    threads(rng.choice([1, 2]))
    _check(sample_extend(rng), dtype, target, rng.randrange(2**32))


@pytest.mark.parametrize("block_size", [1, 8, 16, 24, 32])
def test_edges(target, block_size) -> None:
    """Contexts of 1, exact block multiples and one past, block sizes that are not multiples of the
    16-key chunk, the smallest and largest GQA groups, prefill of exactly one block."""
    seed = _seed()
    rng = random.Random(seed)
    lens = [1, block_size, block_size + 1, 2 * block_size, 47]
    for group in (1, 8):
        decode = Case([(c - 1, 1) for c in lens], block_size, 64, 2, group, strided_query=True)
        _check(decode, torch.float32, target, rng.randrange(2**32))
        extend = Case(
            [(0, 1), (0, block_size), (block_size, block_size + 1), (1, 33), (40, 1)],
            block_size,
            128,
            1,
            group,
            strided_query=False,
        )
        _check(extend, torch.float32, target, rng.randrange(2**32))


def test_results_do_not_depend_on_thread_count(threads) -> None:
    """Split-context decode (many threads) gives the same bits as one pass (one thread): a decode
    row's key ranges depend on its context length alone."""
    seed = _seed()
    rng = random.Random(seed)
    case = Case([(3000, 1), (700, 1), (5, 1)], 16, 64, 3, 3, strided_query=False)
    meta, k_cache, v_cache, query = _build(case, torch.float32, "cpu", rng, torch.Generator().manual_seed(seed))
    outs = []
    for n in (1, 2, 7):
        threads(n)
        outs.append(attention.paged_attention(query, k_cache, v_cache, meta, 0.125))
    assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0]), f"seed {seed}"


@pytest.mark.parametrize("kind", ["decode", "extend"])
@pytest.mark.parametrize("draw", range(6))
def test_sliding_window_matches_reference(kind, draw, threads) -> None:
    """Sliding-window attention (Mistral, Gemma's local layers): each token sees the last
    ``window`` positions only, in decode rows, verify-sized runs and long prefill tiles; windows
    shorter and longer than the contexts, inside and across blocks and 64-key chunks."""
    seed = _seed()
    rng = random.Random(seed)
    threads(rng.choice([1, 2, 3]))
    case = sample_decode(rng) if kind == "decode" else sample_extend(rng)
    case.window = rng.choice([1, 2, 15, 16, 17, 63, 64, 65, _log_uniform(rng, 1, 3000)])
    _check(case, torch.float32, "cpu", rng.randrange(2**32))


@pytest.mark.parametrize("kind", ["decode", "extend"])
@pytest.mark.parametrize("draw", range(6))
def test_soft_capped_scores_match_reference(target, kind, draw, threads) -> None:
    """Gemma 2's logit soft-capping (scores become cap * tanh(score / cap)) on every ISA, with and
    without a sliding window; caps small enough to change the softmax a lot."""
    if target == "cuda":
        pytest.skip("soft-capping runs on the CPU kernels only")
    seed = _seed()
    rng = random.Random(seed)
    threads(rng.choice([1, 2, 3]))
    case = sample_decode(rng) if kind == "decode" else sample_extend(rng)
    case.softcap = rng.choice([0.5, 2.0, 50.0])
    case.window = rng.choice([0, 0, _log_uniform(rng, 1, 3000)])
    _check(case, torch.float32, "cpu", rng.randrange(2**32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trial", range(4))
def test_a_token_gets_the_same_bits_in_every_kind_of_step(dtype, trial, threads) -> None:
    """Speculation's lossless guarantee rests on this: a request's few new tokens in an extend
    call (a verify step, next to a prefill chunk and another request's decode) get exactly what
    decoding them one at a time gives, whatever the batch and thread count."""
    seed = _seed()
    rng = random.Random(seed)
    threads(rng.choice([1, 2, 3]))
    # 250 and 4090: the tokens' contexts straddle a split boundary (256 keys) or a change of split
    # length (4096), so the tokens of one verify step have different key ranges.
    cached, qlen = rng.choice([3, 40, 250, 300, 1500, 4090]), rng.randint(2, 32)
    window = rng.choice([0, 0, rng.randint(1, 600)])  # sliding windows too
    case = Case([(cached, qlen), (0, 100), (rng.randint(1, 900), 1)], 16, 64, 3, 3, strided_query=True)
    meta, k_cache, v_cache, query = _build(case, dtype, "cpu", rng, torch.Generator().manual_seed(seed))
    extended = attention.paged_attention(query, k_cache, v_cache, meta, 0.125, window=window)
    table = meta.block_tables[0].tolist()
    for i in range(qlen):
        # Token i alone as a decode step (its context: the cached prefix and tokens 0..i), in a
        # batch with another row.
        one = attention.AttentionMetadata.build([1, 1], [cached + i + 1, 1], [table, table], 16)
        decoded = attention.paged_attention(
            query[i : i + 1].repeat(2, 1, 1), k_cache, v_cache, one, 0.125, window=window
        )
        assert torch.equal(decoded[0], extended[i]), (
            f"seed {seed}: token {i} of {qlen} after {cached} (window {window})"
        )


# ------------------------------------------------------------------------------------- store_kv
@pytest.mark.parametrize("src_dtype", DTYPES)
@pytest.mark.parametrize("cache_dtype", DTYPES)
def test_store_kv_matches_reference(target, src_dtype, cache_dtype) -> None:
    """Exactly the named slots change, to exactly torch's cast of the (strided) source rows;
    negative slots are skipped."""
    seed = _seed()
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    bs, hkv, d = rng.choice([16, 32]), rng.choice([1, 3, 8]), rng.choice([64, 128])
    num_blocks = rng.randint(2, 40)
    num_tokens = rng.randint(1, min(300, num_blocks * bs))
    slots = rng.sample(range(num_blocks * bs), num_tokens)
    skipped = {i for i in range(num_tokens) if rng.random() < 0.1}
    slot_mapping = torch.tensor([-1 if i in skipped else s for i, s in enumerate(slots)], device=target)
    fused = torch.randn(num_tokens, 3 * hkv, d, generator=gen).to(src_dtype).to(target)
    key, value = fused[:, hkv : 2 * hkv], fused[:, 2 * hkv :]  # token stride 3 * hkv * d
    k_cache = torch.randn(num_blocks, bs, hkv, d, generator=gen).to(cache_dtype).to(target)
    v_cache = torch.randn(num_blocks, bs, hkv, d, generator=gen).to(cache_dtype).to(target)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    keep = torch.tensor([i not in skipped for i in range(num_tokens)], device=target)
    attention_ref.store_kv(key[keep], value[keep], k_expected, v_expected, slot_mapping[keep])

    attention.store_kv(key, value, k_cache, v_cache, slot_mapping)
    assert torch.equal(k_cache, k_expected), f"seed {seed}"
    assert torch.equal(v_cache, v_expected), f"seed {seed}"


def test_store_kv_rejects_bad_slots_and_writes_nothing() -> None:
    """CPU contract (the CUDA kernel cannot raise without a device sync; it skips such slots)."""
    k_cache = torch.zeros(4, 16, 2, 64)
    v_cache = torch.zeros_like(k_cache)
    key = torch.ones(3, 2, 64)
    with pytest.raises(ValueError, match="slot 64"):
        attention.store_kv(key, key, k_cache, v_cache, torch.tensor([0, 5, 64]))
    assert not bool(k_cache.any()) and not bool(v_cache.any())
    with pytest.raises(ValueError, match="int64"):
        attention.store_kv(key, key, k_cache, v_cache, torch.tensor([0, 1, 2], dtype=torch.int32))


# ----------------------------------------------------------------------------------- validation
def test_paged_attention_rejects_bad_input() -> None:
    meta = attention.AttentionMetadata.build([1], [20], [[1, 2]], 16)
    k_cache = torch.zeros(3, 16, 2, 64)
    query = torch.zeros(1, 6, 64)
    bad = attention.AttentionMetadata.build([1], [20], [[1, 3]], 16)  # block 3 of 3
    with pytest.raises(ValueError, match="block id 3"):
        attention.paged_attention(query, k_cache, k_cache, bad, 0.125)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        attention.paged_attention(torch.zeros(1, 5, 64), k_cache, k_cache, meta, 0.125)
    with pytest.raises(ValueError, match="dtype"):
        attention.paged_attention(query.half(), k_cache.half(), k_cache.half(), meta, 0.125)
    with pytest.raises(ValueError, match="multiple of 16"):
        attention.paged_attention(
            torch.zeros(1, 6, 24), torch.zeros(3, 16, 2, 24), torch.zeros(3, 16, 2, 24), meta, 0.1
        )
    with pytest.raises(ValueError, match="pools"):
        attention.paged_attention(query, k_cache, k_cache.transpose(2, 3), meta, 0.125)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        attention.paged_attention(torch.zeros(1, 64, 6).transpose(1, 2), k_cache, k_cache, meta, 0.125)
    out = attention.paged_attention(query, k_cache, k_cache, meta, 0.125)
    assert out.shape == (1, 6, 64) and out.dtype == torch.float32
