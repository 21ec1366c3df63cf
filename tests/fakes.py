"""A fake executor for scheduler tests: checks what the policy asks of it, samples by position."""

from __future__ import annotations

from trillium.protocol import StepInput, StepOutput


class FakeExecutor:
    """Keeps each request's "KV" (the tokens computed so far) and checks step inputs against it.

    The sampled token depends only on its position, so a preempted request that recomputes
    produces exactly the same output as one that never was preempted.
    """

    def __init__(self, block_size: int, vocab: int = 1000, eos_at: dict[str, int] | None = None) -> None:
        self.block_size = block_size
        self.vocab = vocab
        self.kv: dict[str, list[int]] = {}
        self.steps: list[StepInput] = []
        self.eos_at = eos_at or {}  # request id -> position at which to emit token 0

    @staticmethod
    def token_at(position: int, vocab: int = 1000) -> int:
        return 10 + position % (vocab - 10)

    def execute(self, step_input: StepInput) -> StepOutput:
        self.steps.append(step_input)
        for request_id in step_input.finished_request_ids:
            self.kv.pop(request_id, None)
        out = []
        for r in step_input.requests:
            kv = self.kv.setdefault(r.request_id, [])
            if r.start_pos == 0:
                kv.clear()  # a new request, or one recomputing after preemption
            assert r.start_pos == len(kv), f"{r.request_id}: KV holds {len(kv)} tokens, step starts at {r.start_pos}"
            kv.extend(r.token_ids)
            needed_blocks = -(-len(kv) // self.block_size)
            assert len(r.block_ids) >= needed_blocks, "block table too short for the tokens stored"
            if r.sample:
                pos = len(kv)
                out.append(0 if self.eos_at.get(r.request_id) == pos else self.token_at(pos, self.vocab))
            else:
                out.append(-1)
        return StepOutput(out)
