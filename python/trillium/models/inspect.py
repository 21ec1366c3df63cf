"""What a model file is, read without loading its weights: ``trillium inspect`` reports it.

Architecture (and whether this package serves it), the hyperparameters, the parameter count, the
quantization mix of a GGUF file (tensors, parameters and bytes per type), and the bytes the
weights take resident in each form the engine can load them in. Reading a GGUF header and its
tensor table takes milliseconds; a Hugging Face directory is read from ``config.json`` and the
safetensors headers.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field

from gguf.constants import GGMLQuantizationType as QT

from trillium.models.config import ModelConfig
from trillium.models.gguf_quant import BITS, SYMMETRIC, TWO_LEVEL


@dataclass
class QuantGroup:
    tensors: int = 0
    params: int = 0
    bytes: int = 0


@dataclass
class ModelReport:
    path: str
    format: str  # "gguf" or "hf"
    file_bytes: int
    architecture: str  # as the file names it
    config: ModelConfig | None  # None when the architecture or its metadata is not supported
    problem: str | None  # why it cannot be served, or None
    num_params: int
    quant_mix: dict[str, QuantGroup] = field(default_factory=dict)  # type name -> totals (GGUF)
    # GGUF: the tensors the quantized path keeps quantized (projections, head, token table, where
    # of a kernel type), their parameters and their packed (resident) bytes.
    packed_params: int = 0
    packed_bytes: int = 0

    @property
    def supported(self) -> bool:
        return self.problem is None

    def dense_bytes(self, bytes_per_param: int) -> int:
        """Resident weights when every tensor is loaded dense at this width."""
        return self.num_params * bytes_per_param

    def quantized_bytes(self) -> int:
        """Resident weights with the projections, head and token table kept block-quantized (the
        kernel's packed layout) and everything else fp32 (the quantized kernel's activations)."""
        return self.packed_bytes + 4 * (self.num_params - self.packed_params)

    def kv_bytes_per_token(self, bytes_per_value: int) -> int:
        c = self.config
        return 0 if c is None else 2 * c.num_layers * c.num_kv_heads * c.head_dim * bytes_per_value


_PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def inspect_model(path: str) -> ModelReport:
    """Report on a GGUF file or a Hugging Face directory. Raises ValueError for anything else."""
    if os.path.isdir(path):
        return _inspect_hf(path)
    if os.path.isfile(path) and path.lower().endswith(".gguf"):
        return _inspect_gguf(path)
    raise ValueError(f"{path!r} is neither a .gguf file nor a Hugging Face model directory")


def _packed_bytes(n: int, k: int, qtype: QT) -> int:
    """Resident bytes of an [n, k] tensor packed for the quantized kernel (codes, scales, mins)."""
    from trillium import _core

    codes, scales = _core.quant_linear_sizes(n, k, BITS[qtype])
    copies = 1 if qtype in SYMMETRIC else 2  # scales, and mins where the type has them
    if qtype in TWO_LEVEL:  # fp32 super scales per 256 weights, a byte per scale block
        return int(codes + copies * (4 * _core.quant_linear_super_count(n, k) + scales))
    return codes + 4 * scales * copies


def _inspect_gguf(path: str) -> ModelReport:
    from gguf.constants import GGMLQuantizationType

    from trillium.models.gguf_file import GGUFFile
    from trillium.models.gguf_loader import read_config

    gguf = GGUFFile(path)
    arch = str(gguf.metadata.get("general.architecture", "unknown"))
    config, problem = None, None
    try:
        config = read_config(gguf)
        config.validate()
    except ValueError as exc:
        config, problem = None, str(exc)
    mix: dict[str, QuantGroup] = {}
    num_params = packed_params = packed_bytes = 0
    for tensor in gguf.tensors:
        params = math.prod(tensor.dims)
        try:
            name = GGMLQuantizationType(tensor.qtype).name
        except ValueError:
            name = f"type {tensor.qtype}"
        group = mix.setdefault(name, QuantGroup())
        group.tensors += 1
        group.params += params
        group.bytes += tensor.nbytes
        num_params += params
        kind = tensor.name.split(".")[-2] if tensor.name.count(".") >= 2 else ""
        kept = kind in _PROJECTIONS or tensor.name in ("output.weight", "token_embd.weight")
        if kept and tensor.qtype in BITS and len(tensor.dims) == 2:
            packed_params += params
            packed_bytes += _packed_bytes(*tensor.dims, QT(tensor.qtype))
    return ModelReport(
        path=path,
        format="gguf",
        file_bytes=os.path.getsize(path),
        architecture=arch,
        config=config,
        problem=problem,
        num_params=num_params,
        quant_mix=dict(sorted(mix.items(), key=lambda kv: -kv[1].bytes)),
        packed_params=packed_params,
        packed_bytes=packed_bytes,
    )


def _inspect_hf(path: str) -> ModelReport:
    from trillium.models.hf_loader import read_config

    with open(os.path.join(path, "config.json")) as fh:
        raw = json.load(fh)
    arch = str(raw.get("model_type") or (raw.get("architectures") or ["unknown"])[0])
    config, problem = None, None
    try:
        config = read_config(path)
        config.validate()
    except (ValueError, KeyError) as exc:
        config, problem = None, str(exc)
    num_params = file_bytes = 0
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.endswith(".safetensors"):
            file_bytes += os.path.getsize(full)
            num_params += _safetensors_params(full)
    return ModelReport(
        path=path,
        format="hf",
        file_bytes=file_bytes,
        architecture=arch,
        config=config,
        problem=problem,
        num_params=num_params,
    )


def _safetensors_params(path: str) -> int:
    """Parameters in a safetensors file, from its JSON header alone."""
    with open(path, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(length))
    return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
