"""A fake executor for scheduler tests: a paged "KV cache" of token ids, sampling by position."""

from __future__ import annotations

from trillium.protocol import ScheduledRequest, StepInput, StepOutput


class FakeExecutor:
    """Stores each computed token id in its KV slot (block_id * block_size + offset) and checks
    every step against that store: the positions before ``start_pos`` must already be in the
    request's blocks. A request that starts mid-sequence (a prefix-cache hit, or readmission
    after preemption) has the tokens it reused recorded in ``reused`` for the test to check.

    The sampled token depends only on its position, so preemption, recompute and cache hits
    must not change any output. A speculating request's drafts are accepted while each equals
    the token of its position; its K/V is kept up to the accepted run (the scheduler rolls the
    rest back).

    Prompt logprobs: the row of position p gives ``fake_prompt_logprob(p + 1, token)`` for the
    prompt token it predicts, so a test sees which positions were reported, in which order.
    """

    def __init__(self, block_size: int, vocab: int = 1000, eos_at: dict[str, int] | None = None) -> None:
        self.block_size = block_size
        self.vocab = vocab
        self.slots: dict[int, int] = {}
        self.kv: dict[str, list[int]] = {}
        self.reused: dict[str, list[int]] = {}
        self.steps: list[StepInput] = []
        self.eos_at = eos_at or {}  # request id -> position at which to emit token 0
        self.num_resets = 0

    @staticmethod
    def fake_prompt_logprob(position: int, token_id: int) -> tuple[float, list[tuple[int, float]]]:
        return -float(position), [(token_id, -float(position))]

    @staticmethod
    def token_at(position: int, vocab: int = 1000) -> int:
        return 10 + position % (vocab - 10)

    def _slot(self, block_ids: list[int], pos: int) -> int:
        return block_ids[pos // self.block_size] * self.block_size + pos % self.block_size

    def reset(self) -> None:
        """The scheduler rebuilt its KV pool empty: every slot and request is gone."""
        self.slots.clear()
        self.kv.clear()
        self.num_resets += 1

    def execute(self, step_input: StepInput) -> StepOutput:
        self.steps.append(step_input)
        for request_id in step_input.finished_request_ids:
            self.kv.pop(request_id, None)
        out = []
        accepted: list[int] = []
        for r in step_input.requests:
            kv = self.kv.get(r.request_id)
            if kv is None or len(kv) != r.start_pos:
                # New, or readmitted: everything before start_pos must come from its blocks.
                kv = [self.slots[self._slot(r.block_ids, p)] for p in range(r.start_pos)]
                if r.start_pos:
                    self.reused[r.request_id] = list(kv)
                self.kv[r.request_id] = kv
            for i, token in enumerate(r.token_ids):
                self.slots[self._slot(r.block_ids, r.start_pos + i)] = token
            kv.extend(r.token_ids)
            if r.num_draft_tokens:
                num_accepted = self._verify(r)
                accepted.append(num_accepted)
                del kv[r.start_pos + 1 + num_accepted :]
                pos = len(kv)
                out.append(0 if self.eos_at.get(r.request_id) == pos else self.token_at(pos, self.vocab))
                continue
            accepted.append(0)
            if r.sample:
                pos = len(kv)
                out.append(0 if self.eos_at.get(r.request_id) == pos else self.token_at(pos, self.vocab))
            else:
                out.append(-1)
        speculated = any(r.num_draft_tokens for r in step_input.requests)
        prompt_logprobs = [
            None
            if r.prompt_logprob_token_ids is None
            else [self.fake_prompt_logprob(r.start_pos + 1 + j, t) for j, t in enumerate(r.prompt_logprob_token_ids)]
            for r in step_input.requests
        ]
        asked = any(lp is not None for lp in prompt_logprobs)
        return StepOutput(out, None, accepted if speculated else None, None, prompt_logprobs if asked else None)

    def _verify(self, r: ScheduledRequest) -> int:
        """Drafts accepted: draft j sits at position start_pos + 1 + j and must be that
        position's token (token 0 where ``eos_at`` says so)."""
        num_accepted = 0
        for j, draft in enumerate(r.token_ids[1:]):
            pos = r.start_pos + 1 + j
            if draft != (0 if self.eos_at.get(r.request_id) == pos else self.token_at(pos, self.vocab)):
                break
            num_accepted += 1
        return num_accepted
