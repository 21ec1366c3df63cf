"""Hugging Face transformers as the correctness oracle, for the default GGUF model.

HF reads the GGUF itself (its own dequantization and Q/K un-permutation), which is what makes
it an independent check of our loader. That path costs ~30 s on 2 cores, so it runs once: the
result is saved with ``save_pretrained`` (fp32 safetensors + tokenizer files) under pytest's
cache directory and later runs load that copy in about a second. The cache key is the GGUF's
size and mtime plus the transformers version; a stale or half-written copy is rebuilt.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest


def _key(gguf_path: str) -> dict:
    import transformers

    st = os.stat(gguf_path)
    return {
        "gguf": os.path.basename(gguf_path),
        "size": st.st_size,
        "mtime": st.st_mtime_ns,
        "transformers": transformers.__version__,
    }


def reference_dir(cache_root: Path, gguf_path: str) -> Path:
    """A HF model directory holding the GGUF as transformers dequantized it (built if missing)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = cache_root / "smollm2-hf-fp32"
    stamp = target / "trillium-key.json"
    key = _key(gguf_path)
    if stamp.exists() and json.loads(stamp.read_text()) == key:
        return target
    folder, name = os.path.dirname(gguf_path), os.path.basename(gguf_path)
    from safetensors.torch import save_model

    tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix="building-"))
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        # save_pretrained refuses GGUF-quantized models; the weights are plain fp32 by now, so
        # write them and a config without the quantization entry ourselves.
        save_model(model, str(tmp / "model.safetensors"))
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["architectures"] = [type(model).__name__]
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(tmp)
        (tmp / "trillium-key.json").write_text(json.dumps(key))  # written last: marks a complete copy
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@pytest.fixture(scope="session")
def hf_reference_dir(request, tmp_path_factory) -> Path:
    from trillium.models import default_model_path

    cache = getattr(request.config, "cache", None)
    root = Path(cache.mkdir("trillium-hf-oracle")) if cache is not None else tmp_path_factory.mktemp("hf")
    return reference_dir(root, default_model_path())
