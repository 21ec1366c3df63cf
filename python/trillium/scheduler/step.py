"""What one step passes between the policy and the scheduler actor: the plan, each request's
update for its client, and the steps whose verdicts are decided off the event loop."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from trillium.protocol import FinishReason, StepInput, Verdict
from trillium.scheduler.request import Request


@dataclasses.dataclass
class StepPlan:
    """The requests of one step, each with its number of new tokens, and the executor's input."""

    scheduled: list[tuple[Request, int]]
    step_input: StepInput
    drafts: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # request id -> its draft tokens


@dataclasses.dataclass
class RequestUpdate:
    """What one request produced in a step, for delivery to its client: its verdict, and with
    the first token of a request that asked for prompt logprobs, one entry per prompt position
    1 .. P-1 (see protocol.TokenDelta)."""

    request: Request
    verdict: Verdict
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None

    @property
    def new_token_ids(self) -> list[int]:
        return self.verdict.new_token_ids

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.verdict.finish_reason


@dataclasses.dataclass
class Deferred:
    """A constrained request's step whose verdict its controller may take a while to reach
    (closing and witness searches): run :meth:`decide` off the event loop, then hand the verdict
    to :meth:`SchedulerPolicy.settle`. Until then the request is ``pending``: it sits out steps."""

    request: Request
    kept: list[int]
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None
    stop: Callable[[int, int], FinishReason | None]  # (token id, output length with it) -> finish
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] | None

    def decide(self, deadline: float) -> Verdict:
        """The controller's verdict (``deadline``: when its searches must stop). Touches only the
        request's output list and its controller, which nothing else touches while it is pending."""
        assert self.request.structured is not None
        return self.request.structured.step(
            self.request.output_token_ids, self.kept, self.logprobs, self.stop, deadline
        )
