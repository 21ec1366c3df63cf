"""A model run over the paged KV cache as the engine runs it, for tests: one prefill step of the
whole prompt, then decode steps of one token, through block tables that are neither contiguous nor
in order (block ids reversed, block 0 left unused)."""

from __future__ import annotations

import torch

from trillium.ops.attention import AttentionMetadata


def prefill_and_greedy(
    model, prompt: list[int], steps: int = 0, block_size: int = 16
) -> tuple[torch.Tensor, list[int]]:
    """(the prompt's logits [n, V] from one prefill step, ``steps`` greedy tokens decoded one at a time)."""
    total = len(prompt) + steps
    blocks = -(-total // block_size)
    kv = model.allocate_kv_caches(blocks + 1, block_size)
    table = list(range(blocks, 0, -1))
    tokens: list[int] = []
    with torch.inference_mode():
        meta = AttentionMetadata.build([len(prompt)], [len(prompt)], [table], block_size)
        logits = model.compute_logits(model(torch.tensor(prompt), torch.arange(len(prompt)), kv, meta))
        if steps:
            tokens.append(int(logits[-1].argmax()))
        for pos in range(len(prompt), total - 1):
            meta = AttentionMetadata.build([1], [pos + 1], [table], block_size)
            step = model.compute_logits(model(torch.tensor([tokens[-1]]), torch.tensor([pos]), kv, meta))
            tokens.append(int(step[-1].argmax()))
    return logits, tokens
