"""A small, fast GGUF reader: metadata as python values, tensors as memory-mapped raw bytes.

``gguf.GGUFReader`` builds a numpy view per array element, which takes seconds on a 50k-token
vocabulary; this reader parses the header with ``struct`` in tens of milliseconds and leaves the
dequantization to ``gguf.quants.dequantize`` (it takes the raw bytes laid out the same way).

File layout (GGUF v2/v3, little-endian):

    magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
    kv_count x (string key, u32 value_type, value)
    tensor_count x (string name, u32 n_dims, n_dims x u64 dim (innermost first), u32 type, u64 offset)
    padding to general.alignment | tensor data (offsets relative to here)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

_SCALARS = {  # GGUF value type -> (struct format, numpy dtype)
    0: ("<B", np.uint8),
    1: ("<b", np.int8),
    2: ("<H", np.uint16),
    3: ("<h", np.int16),
    4: ("<I", np.uint32),
    5: ("<i", np.int32),
    6: ("<f", np.float32),
    7: ("<?", np.bool_),
    10: ("<Q", np.uint64),
    11: ("<q", np.int64),
    12: ("<d", np.float64),
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    dims: tuple[int, ...]  # numpy order (outermost first): a [out, in] matrix is (out, in)
    qtype: int  # gguf.GGMLQuantizationType value
    offset: int  # absolute byte offset in the file
    nbytes: int


class GGUFFile:
    """Parsed header of a GGUF file plus a read-only memory map of its tensor data.

    ``metadata`` maps keys to python values (arrays of strings become lists of str, numeric
    arrays become lists). Raises ValueError for a file that is not GGUF v2/v3.
    """

    def __init__(self, path: str) -> None:
        from gguf.constants import GGML_QUANT_SIZES

        self.path = path
        self._map = np.memmap(path, dtype=np.uint8, mode="r")
        buf = memoryview(self._map)  # type: ignore[arg-type]  # numpy's memmap is a buffer; its stub says not
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic)")
        version, num_tensors, num_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"{path}: unsupported GGUF version {version}")
        self._buf, self._pos = buf, 24
        self.metadata: dict[str, Any] = {}
        for _ in range(num_kv):
            key = self._string()
            (value_type,) = self._unpack("<I")
            self.metadata[key] = self._value(value_type)
        infos = []
        for _ in range(num_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            dims = self._unpack(f"<{n_dims}Q")
            qtype, offset = self._unpack("<IQ")
            infos.append((name, dims, qtype, offset))
        alignment = int(self.metadata.get("general.alignment", 32))
        data_start = -(-self._pos // alignment) * alignment
        self.tensors: list[GGUFTensor] = []
        for name, dims, qtype, offset in infos:
            block_size, type_size = GGML_QUANT_SIZES[qtype]
            count = int(np.prod(dims)) if dims else 1
            self.tensors.append(
                GGUFTensor(name, tuple(reversed(dims)), qtype, data_start + offset, count // block_size * type_size)
            )
        del self._buf

    def raw(self, tensor: GGUFTensor) -> np.ndarray:
        """The tensor's bytes as uint8 ``[*dims[:-1], bytes_per_row]`` (what gguf.quants.dequantize takes)."""
        data = self._map[tensor.offset : tensor.offset + tensor.nbytes]
        rows = int(np.prod(tensor.dims[:-1])) if len(tensor.dims) > 1 else 1
        return data.reshape(*tensor.dims[:-1], tensor.nbytes // rows)

    def _unpack(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (length,) = struct.unpack_from("<Q", self._buf, self._pos)
        start = self._pos + 8
        self._pos = start + length
        return bytes(self._buf[start : self._pos]).decode("utf-8", errors="replace")

    def _value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self._string()
        if value_type == _ARRAY:
            item_type, count = self._unpack("<IQ")
            if item_type in _SCALARS:
                dtype = np.dtype(_SCALARS[item_type][1]).newbyteorder("<")
                arr = np.frombuffer(self._buf, dtype=dtype, count=count, offset=self._pos)
                self._pos += arr.nbytes
                return arr.tolist()
            return [self._value(item_type) for _ in range(count)]
        if value_type not in _SCALARS:
            raise ValueError(f"{self.path}: unknown GGUF value type {value_type}")
        (value,) = self._unpack(_SCALARS[value_type][0])
        return value
