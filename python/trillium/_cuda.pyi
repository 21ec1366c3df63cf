"""Type stub for the CUDA kernels (cuda/bindings.cc); absent on builds without nvcc."""

__version__: str
CUDART_VERSION: int

def device_count() -> int:
    """Usable CUDA devices; 0 when there is no device or no driver."""

def fill_(ptr: int, n: int, value: float, stream: int = 0) -> None:
    """Asynchronously set n float32 values at device pointer ptr; RuntimeError on a CUDA error."""
