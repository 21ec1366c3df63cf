"""Type stub for the CUDA kernels (cpp/bindings/cuda/module.cc); absent on builds without nvcc.

The attention, KV-store, bitmask and verify entry points take the named specs of trillium.ops.kernel_specs,
as trillium._core does (device pointers here).
"""

from trillium.ops.kernel_specs import BatchSpec, BitmaskSpec, CacheSpec, LogitsSpec, RowsSpec, VerifySpec

__version__: str
CUDART_VERSION: int

def device_count() -> int:
    """Usable CUDA devices; 0 when there is no device or no driver."""

def fill_(ptr: int, n: int, value: float, stream: int = 0) -> None:
    """Asynchronously set n float32 values at device pointer ptr; RuntimeError on a CUDA error."""

def store_kv(
    key: RowsSpec,
    value: RowsSpec,
    cache: CacheSpec,
    slot_mapping: int,
    num_tokens: int,
    stream: int = 0,
) -> None:
    """Asynchronous store_kv on stream (specs as trillium._core.store_kv, device pointers);
    out-of-pool slots are skipped."""

def paged_attention(
    query: RowsSpec,
    out: RowsSpec,
    cache: CacheSpec,
    batch: BatchSpec,
    scale: float,
    decode: bool,
    max_query_len: int,
    stream: int = 0,
) -> None:
    """Asynchronous paged attention (decode or extend) on stream; head_dim 64, 128 or 256.
    ValueError on arguments the launcher rejects, RuntimeError on a CUDA error."""

def apply_token_bitmask(logits: LogitsSpec, bitmask: BitmaskSpec, mask_rows: int, stream: int = 0) -> None:
    """Asynchronous apply_token_bitmask on stream (arguments as trillium._core.apply_token_bitmask, device
    pointers). ValueError on sizes the launcher rejects."""

def spec_verify(spec: VerifySpec, stream: int = 0) -> None:
    """Asynchronous spec_verify on stream (spec as trillium._core.spec_verify, device addresses). ValueError on
    sizes the launcher rejects; a request with a bad per-request value gets num_accepted -1 and an all -1 row."""
