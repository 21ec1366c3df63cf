"""``trillium inspect PATH``: what a model file is and what serving it takes, before loading it.

Architecture (and whether trillium serves it), shape, context length, parameters, the GGUF
quantization mix, the chat template (and its tool-call format, fill-in-the-middle tokens), what
``--weights auto`` will do on this machine and why, and the memory: resident weights and KV cache
per token. Exit status 1 when the model cannot be served.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from trillium.config import EngineConfig
from trillium.launch import precision_report, resolve_weights
from trillium.models.inspect import ModelReport, inspect_model
from trillium.models.registry import can_run_quantized
from trillium.ops.cpu_isa import kernel_isa
from trillium.tokenizer import load_tokenizer
from trillium.tools import tool_format

MiB = 1024 * 1024


def describe(path: str) -> dict[str, Any]:
    """The report as plain data (``--json`` prints it as is)."""
    report = inspect_model(path)
    out: dict[str, Any] = {
        "path": path,
        "format": report.format,
        "file_bytes": report.file_bytes,
        "architecture": report.architecture,
        "supported": report.supported,
        "problem": report.problem,
        "parameters": report.num_params,
        "quantization": {
            name: {"tensors": g.tensors, "parameters": g.params, "bytes": g.bytes}
            for name, g in report.quant_mix.items()
        },
    }
    config = report.config
    if config is None:
        return out
    out["shape"] = {
        "layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "heads": config.num_heads,
        "kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "tied_embeddings": config.tie_word_embeddings,
    }
    out["context_length"] = config.max_position_embeddings
    out["served_name"] = config.name
    tokenizer = load_tokenizer(path)
    fmt = tool_format(tokenizer.chat_template)
    out["chat_template"] = tokenizer.chat_template is not None
    out["chat_template_fallback"] = tokenizer.chat_template_fallback
    out["tool_calls"] = f"{fmt.name}, {'the template' if fmt.native else 'fallback system prompt'}"
    out["fill_in_the_middle"] = tokenizer.fim_token_ids is not None
    out.update(_weights(path, report))
    return out


def _weights(path: str, report: ModelReport) -> dict[str, Any]:
    """What ``--weights auto --dtype auto`` resolves to here, and the memory it needs."""
    config = resolve_weights(EngineConfig(model=path, speculative_config=None), path)
    quantized = config.weights != "dense"
    # The file's reason first (its types), else the activations' (bf16 where fp32 would do).
    why = (
        ""
        if quantized
        else (can_run_quantized(path, torch.float32)[1] or can_run_quantized(path, config.torch_dtype)[1])
    )
    width = 4 if config.dtype == "fp32" else 2
    weights_bytes = report.quantized_bytes() if quantized else report.dense_bytes(width)
    kv = report.kv_bytes_per_token(config.torch_kv_dtype.itemsize)
    default_pool = int(config.kv_cache_gib * 1024**3)  # the default: inspect sets no --kv-cache-gib
    return {
        "weights_auto": config.weights,
        "dtype_auto": config.dtype,
        "precision": precision_report(config),
        "kernel": kernel_isa() if quantized else "torch",
        "why_dense": why or None,
        "resident_weights_bytes": weights_bytes,
        "kv_bytes_per_token": kv,
        "default_kv_pool_tokens": default_pool // kv if kv else 0,
    }


def print_report(path: str, as_json: bool) -> int:
    info = describe(path)
    if as_json:
        print(json.dumps(info, indent=1))
        return 0 if info["supported"] else 1
    rows = [("model", f"{path} ({info['format']}, {info['file_bytes'] / MiB:.1f} MiB)")]
    if not info["supported"]:
        rows.append(("architecture", f"{info['architecture']}: NOT SUPPORTED ({info['problem']})"))
    else:
        shape = info["shape"]
        rows += [
            ("architecture", f"{info['architecture']} (served as {info['served_name']!r})"),
            (
                "shape",
                f"{shape['layers']} layers, hidden {shape['hidden_size']}, FFN {shape['intermediate_size']}, "
                f"{shape['heads']} heads / {shape['kv_heads']} KV heads of {shape['head_dim']}, "
                f"vocab {shape['vocab_size']}{', tied embeddings' if shape['tied_embeddings'] else ''}",
            ),
            ("context", f"{info['context_length']} tokens"),
        ]
    rows.append(("parameters", f"{info['parameters'] / 1e6:.1f} M"))
    if info["quantization"]:
        rows.append(
            (
                "quantization",
                "; ".join(
                    f"{name} {g['tensors']} tensor{'s' if g['tensors'] != 1 else ''}, "
                    f"{g['parameters'] / 1e6:.1f} M params, {g['bytes'] / MiB:.1f} MiB"
                    for name, g in info["quantization"].items()
                ),
            )
        )
    if info["supported"]:
        rows += [
            (
                "chat",
                f"template: {_template(info)}; tool calls: {info['tool_calls']}; "
                f"fill-in-the-middle: {'yes' if info['fill_in_the_middle'] else 'no'}",
            ),
            (
                "--weights auto",
                f"{info['weights_auto']}, {info['precision']['activations']} activations ({info['kernel']} kernel)"
                + (f"; dense because {info['why_dense']}" if info["why_dense"] else ""),
            ),
            (
                "--precision auto",
                f"{info['precision']['activations']} activations, {info['precision']['weights']} weights, "
                f"{info['precision']['kv_cache_dtype']} KV cache (--precision exact: fp32 everywhere)",
            ),
            (
                "memory",
                f"weights ~{info['resident_weights_bytes'] / MiB:.0f} MiB resident; KV "
                f"{info['kv_bytes_per_token'] / 1024:.1f} KiB per token (the default 1 GiB pool holds "
                f"{info['default_kv_pool_tokens']} tokens; one full context takes "
                f"{info['kv_bytes_per_token'] * info['context_length'] / MiB:.0f} MiB)",
            ),
        ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0 if info["supported"] else 1


def _template(info: dict[str, Any]) -> str:
    if not info["chat_template"]:
        return "no"
    return "none in the file; its turn markers' format (Gemma)" if info.get("chat_template_fallback") else "yes"
