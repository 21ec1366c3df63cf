"""Type stub for the compiled core (cpp/bindings/)."""

from collections.abc import Sequence
from typing import Literal

from trillium.ops.kernel_specs import BatchSpec, BitmaskSpec, CacheSpec, LogitsSpec, RowsSpec, VerifySpec

__version__: str

class OutOfBlocksError(MemoryError):
    """Fewer free blocks than requested; nothing was allocated."""

class InvariantError(AssertionError, RuntimeError):
    """An internal invariant of the core does not hold (a bug, never a user error)."""

class BlockAllocator:
    """Ref-counted KV block ids [0, num_blocks) with an O(1) intrusive free list."""

    def __init__(self, num_blocks: int) -> None: ...
    def allocate(self, n: int) -> list[int]:
        """n free blocks with ref count 1; all-or-nothing (OutOfBlocksError), ValueError if n < 0."""
    def can_allocate(self, n: int) -> bool: ...
    def incref(self, block_ids: list[int]) -> None:
        """One more reference per listed id; ValueError and no change on a bad id or free block."""
    def free(self, block_ids: list[int]) -> None:
        """One reference less per listed id; freed blocks are reused tail-first (reverse order).

        ValueError and no change on a bad id or a double free.
        """
    def ref_count(self, block_id: int) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def num_total_blocks(self) -> int: ...
    @property
    def num_used_blocks(self) -> int: ...
    def check_invariants(self) -> None:
        """Raises InvariantError naming the first violated invariant."""

class MatchResult:
    """The longest cached prefix found by ``RadixTree.match``."""

    @property
    def block_ids(self) -> list[int]:
        """Cached blocks of the prefix, in order (the tree's blocks: no reference was added)."""
    @property
    def num_tokens(self) -> int:
        """Matched tokens, a multiple of block_size."""
    @property
    def handle(self) -> int:
        """Names the deepest matched node for lock()/unlock(); 0 (the root) when nothing matched."""

class InsertResult:
    """What ``RadixTree.insert`` adopted."""

    @property
    def num_new_blocks(self) -> int:
        """Caller blocks the tree adopted (one tree reference each) for the new suffix."""
    @property
    def duplicate_block_ids(self) -> list[int]:
        """Caller blocks for positions already cached under a different block id: not adopted.

        A position whose caller block is the tree's own block (reused after a match) is not listed.
        """

class CacheEvent:
    """One journalled prefix-cache change (``RadixTree.take_events()``)."""

    @property
    def kind(self) -> Literal["stored", "removed"]: ...
    @property
    def namespace(self) -> int: ...
    @property
    def block_ids(self) -> list[int]:
        """The blocks, in sequence order."""
    @property
    def parent_block_id(self) -> int:
        """stored: the cached block just before ``block_ids[0]``; -1 at the start of a sequence."""
    @property
    def tokens(self) -> list[int]:
        """stored: the blocks' tokens (``len(block_ids) * block_size``); removed: empty."""

class RadixTree:
    """Prefix cache: a block-aligned radix tree over token ids, one root per namespace.

    Holds one allocator reference on every cached block; shares the allocator's mutex, so tree
    and allocator calls from several threads never interleave. Namespaces are ints mod 2**64.
    """

    def __init__(self, allocator: BlockAllocator, block_size: int) -> None:
        """Keeps ``allocator`` alive. ValueError if block_size < 1."""
    def match(self, namespace: int, tokens: Sequence[int], *, lock: bool = False) -> MatchResult:
        """Longest cached prefix of whole blocks; stamps the path most recently used and may split
        a node so the handle names exactly the match. Adds no reference; ``lock=True`` also locks
        the handle atomically. ValueError for a token outside int32."""
    def lock(self, handle: int) -> None:
        """Lock the handle's node and its ancestors (counted). 0: no-op; stale handle: ValueError.

        A handle stays valid across splits; it goes stale only when its (unlocked) node is evicted
        or cleared, so lock right after match (or use ``match(lock=True)``).
        """
    def unlock(self, handle: int) -> None:
        """Undo one lock(). 0: no-op; stale handle or node not locked: ValueError."""
    def insert(self, namespace: int, tokens: Sequence[int], block_ids: Sequence[int]) -> InsertResult:
        """Cache the full blocks of ``tokens`` (block_ids[i] holds tokens [i*bs, (i+1)*bs); needs
        len(tokens) // block_size ids, extra ids ignored). The cached prefix keeps the tree's
        blocks; the new suffix's blocks get one tree reference each (the caller keeps its own).
        All-or-nothing ValueError on a bad, free, repeated or already cached suffix block."""
    def evict(self, num_blocks: int) -> int:
        """Free up to num_blocks blocks: LRU unlocked leaves first, tail blocks first; blocks that
        someone else still references are skipped. Returns how many went to the free list."""
    def clear(self) -> int:
        """Drop every unlocked node; returns the number of blocks the tree released."""
    def take_events(self) -> list[CacheEvent]:
        """The journal since the last call, oldest first: insert() adopting a suffix is one
        'stored' event (with the cached block before it, to chain sequences), each tail evict()
        or clear() drops is one 'removed' event. Empty unless ``record_events`` is on."""
    def journal_cached(self) -> None:
        """Journal the whole cache as 'stored' events, parents before children, after what is
        already journalled (for a subscriber starting from an empty view). No-op unless
        ``record_events`` is on."""
    @property
    def record_events(self) -> bool:
        """Journal stored/removed blocks for take_events() (off by default; off drops the journal)."""
    @record_events.setter
    def record_events(self, on: bool) -> None: ...
    def check_invariants(self) -> None:
        """Tree, then allocator self-check; raises InvariantError naming the first violation."""
    @property
    def block_size(self) -> int: ...
    @property
    def num_cached_blocks(self) -> int: ...
    @property
    def num_evictable_blocks(self) -> int:
        """What evict() could free now. O(nodes)."""
    @property
    def num_nodes(self) -> int:
        """Live nodes, namespace roots included."""
    @property
    def num_namespaces(self) -> int: ...
    @property
    def num_queries(self) -> int:
        """match() calls (cumulative, like the other counters; clear() keeps them)."""
    @property
    def num_query_tokens(self) -> int:
        """Tokens passed to match()."""
    @property
    def num_hit_tokens(self) -> int:
        """Tokens match() found cached."""
    @property
    def num_inserted_blocks(self) -> int:
        """Blocks insert() adopted."""
    @property
    def num_evicted_blocks(self) -> int:
        """Blocks evict() or clear() dropped from the tree."""

# ---------------------------------------------------------------- CPU kernels (cpp/bindings/kernels.cc)
# Tensors cross as the named specs of trillium.ops.kernel_specs (RowsSpec, CacheSpec, BatchSpec:
# addresses, sizes, strides, dtype codes 0 float32 / 1 bfloat16), read by field name; plain tuples
# are refused (TypeError). trillium.ops.attention builds them: call its typed wrappers.

def paged_attention(
    query: RowsSpec,
    out: RowsSpec,
    cache: CacheSpec,
    batch: BatchSpec,
    scale: float,
    num_threads: int,
    decode: bool,
    window: int = 0,
    softcap: float = 0.0,
) -> None:
    """Paged attention over one layer's pool; releases the GIL. ValueError (nothing written) on bad
    sizes, lengths or block ids. decode=True needs one token per request."""

def store_kv(
    key: RowsSpec,
    value: RowsSpec,
    cache: CacheSpec,
    slot_mapping: int,
    num_tokens: int,
    num_threads: int,
) -> None:
    """Write K/V rows into their slots (int64 pointer; negative = skip); releases the GIL.
    ValueError (nothing written) on a slot outside the pool."""

# Kernel ISA (cpp/include/trillium/cpu_isa.h, shared by every CPU kernel family); wrapper: trillium.ops.cpu_isa.
def kernel_isa() -> str:
    """Instruction set the CPU kernels use now: 'avx512', 'avx2' or 'portable'."""

def supported_kernel_isas() -> list[str]:
    """Instruction sets this CPU and build can run, worst first."""

def set_kernel_isa(name: str) -> None:
    """Force one instruction set (tests, benchmarks); ValueError if unknown or unsupported. Process-wide."""

def release_openmp_threads() -> bool:
    """End the OpenMP worker team the calling thread started (see trillium.engine.step_thread)."""

# One-call decoder layers (cpp/include/trillium/kernels/decoder_layer.h); typed wrapper: trillium.ops.decoder_stack.
class DecoderStack:
    """Every decoder layer of a model, bound once; forward runs a step through all of them."""

    def __init__(self) -> None: ...
    @property
    def num_layers(self) -> int: ...
    def add_layer(
        self,
        hidden: int,
        intermediate: int,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rms_eps: float,
        input_norm: int,
        post_attention_norm: int,
        q_norm: int,
        k_norm: int,
        qkv: list[tuple[int, int, int, int, int, int, int]],  # 1-3 parts (consecutive rows, own formats)
        qkv_bias: int,
        o: tuple[int, int, int, int, int, int, int],  # (N, K, bits, codes, scales, mins, sub_scales)
        gate_up: list[tuple[int, int, int, int, int, int, int]],
        down: tuple[int, int, int, int, int, int, int],
        k_cache: int,
        v_cache: int,
        kv_dtype: int,
        num_blocks: int,
        block_size: int,
        window: int = 0,
        pre_feedforward_norm: int = 0,
        post_feedforward_norm: int = 0,
        activation: int = 0,
        rope_cos: int = 0,
        rope_sin: int = 0,
        rope_max_positions: int = 0,
        attn_softcap: float = 0.0,
    ) -> None: ...
    def forward(
        self,
        hidden: int,
        residual: int,
        num_tokens: int,
        num_requests: int,
        decode: bool,
        query_start_loc: int,
        context_lens: int,
        block_tables: int,
        block_table_stride: int,
        slot_mapping: int,
        positions: int,
        rope_cos: int,
        rope_sin: int,
        rope_max_positions: int,
        attn_scale: float,
        activations: int,
        num_threads: int,
    ) -> None:
        """Run every layer (addresses); releases the GIL; ValueError on bad sizes."""

# Block-quantized linear (cpp/include/trillium/kernels/quant_linear.h); typed wrapper: trillium.ops.quant_linear.
QUANT_BLOCK: int
QUANT_GROUP_COLS: int

def quant_linear_sizes(out_features: int, in_features: int, bits: int) -> tuple[int, int]:
    """(packed code bytes, scale count) of an [out_features, in_features] weight."""

def quant_linear_pack(
    codes: int,
    scale: int,
    min: int,
    out_features: int,
    in_features: int,
    bits: int,
    packed_codes: int,
    packed_scales: int,
    packed_mins: int,
) -> None:
    """Pack row-major int8 codes [N, K] and fp32 scale/min [N, K/S] (pointers; S = 32, or 16 for 6 bits;
    min and packed_mins both 0 for the format's symmetric codes) into the kernel layout."""

def quant_linear_super_count(out_features: int, in_features: int) -> int:
    """Floats of two-level super scales (and super mins) of an [out_features, in_features] weight."""

def quant_linear_pack_two_level(
    codes: int,
    super_scale: int,
    super_min: int,
    sub_scale: int,
    sub_min: int,
    out_features: int,
    in_features: int,
    bits: int,
    packed_codes: int,
    packed_super: int,
    packed_super_min: int,
    packed_sub: int,
    packed_sub_min: int,
) -> None:
    """Pack codes [N, K] with two-level scales (K-quants): fp32 super scale/min [N, K/256], int8/uint8
    sub-scale [N, K/S] and uint8 sub-min [N, K/32] (pointers; mins 0 for symmetric codes)."""

def quant_linear_dequantize_rows(
    out_features: int,
    in_features: int,
    bits: int,
    codes: int,
    scales: int,
    mins: int,
    sub_scales: int,
    rows: int,
    num_rows: int,
    out: int,
    out_stride: int,
    num_threads: int = 0,
) -> None:
    """out[i, :] = W[rows[i], :] dequantized (an embedding lookup over a packed weight; pointers)."""

def quant_linear(
    x: int,
    num_rows: int,
    x_stride: int,
    out_features: int,
    in_features: int,
    bits: int,
    codes: int,
    scales: int,
    mins: int,
    sub_scales: int,
    bias: int,
    out: int,
    out_stride: int,
    num_threads: int = 0,
    activations: int = 0,
) -> None:
    """out[M, N] = x[M, K] . W^T (+ bias) with a packed block-quantized W; fp32 x and out (pointers).
    activations: 0 exact fp32, 1 rounded to int8 per 32-block, 2 to int16 (quant_linear.h)."""

# Fused decoder-layer ops (cpp/include/trillium/kernels/layer_ops.h); typed wrappers: trillium.ops.layer_ops.
def rms_norm(
    x: int,
    x_stride: int,
    residual: int,
    residual_stride: int,
    weight: int,
    out: int,
    out_stride: int,
    rows: int,
    hidden: int,
    eps: float,
) -> None:
    """RMSNorm of fp32 rows (pointers), with the residual add folded in when residual != 0."""

def silu_and_mul(
    gate_up: int, gate_up_stride: int, out: int, out_stride: int, rows: int, inter: int, activation: int = 0
) -> None:
    """out = act(gate) * up over fp32 rows [gate | up] (pointers); activation 0 SiLU, 1 GELU-tanh."""

def rotary_inplace(
    x: int,
    stride_token: int,
    stride_head: int,
    tokens: int,
    heads: int,
    head_dim: int,
    cos: int,
    sin: int,
    max_positions: int,
    positions: int,
) -> None:
    """Rotate-half RoPE in place on fp32 [tokens, heads, head_dim] (pointers), from cos/sin tables."""

# Structured output (cpp/include/trillium/kernels/token_bitmask.h); typed wrapper: trillium.ops.token_bitmask.
def apply_token_bitmask(logits: LogitsSpec, bitmask: BitmaskSpec, mask_rows: int) -> None:
    """Set logits whose token bit is 0 to -inf in place. mask_rows: int32 [num_rows] pointer (-1 = unmasked
    row) or 0 (row r takes bitmask row r). Releases the GIL; ValueError (nothing written) on bad sizes."""

# Speculative decoding (cpp/include/trillium/kernels/spec_verify.h); typed wrapper: trillium.ops.spec_verify.
def spec_verify(spec: VerifySpec, num_threads: int) -> None:
    """Write num_accepted and output_tokens of one verify step (host addresses in spec; num_threads 0 =
    OpenMP's default). Releases the GIL; ValueError (nothing written) on a bad size or per-request value."""
