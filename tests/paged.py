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


def assert_stack_equals_per_operation(
    model, query_lens: list[int], context_lens: list[int], tables: list[list[int]], block_size: int
) -> None:
    """One mixed step (requests with ``query_lens`` new tokens of ``context_lens``, earlier context
    random and the same both ways) run through the per-operation path and the core's one-call
    decoder stack: the hidden states and every layer's KV pool are bit-identical, and the stack
    was used. Leaves ``model.fused_layers`` on."""
    meta = AttentionMetadata.build(query_lens, context_lens, tables, block_size)
    input_ids = torch.randint(
        0, model.config.vocab_size, (sum(query_lens),), generator=torch.Generator().manual_seed(0)
    )
    positions = torch.tensor([p for q, c in zip(query_lens, context_lens) for p in range(c - q, c)])
    num_blocks = max(b for table in tables for b in table) + 1
    results = []
    for fused in (False, True):
        model.fused_layers = fused
        caches = model.allocate_kv_caches(num_blocks, block_size)
        for k, v in caches:  # the same earlier context in both runs
            k.copy_(torch.randn(k.shape, generator=torch.Generator().manual_seed(1)))
            v.copy_(torch.randn(v.shape, generator=torch.Generator().manual_seed(2)))
        with torch.inference_mode():
            results.append((model(input_ids, positions, caches, meta), caches))
    model.fused_layers = True
    (eager, eager_caches), (fused_out, fused_caches) = results
    assert model._stack is not None and model._stack[0] is fused_caches  # the fused run did use it
    assert torch.equal(fused_out, eager)
    for (k0, v0), (k1, v1) in zip(eager_caches, fused_caches, strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
