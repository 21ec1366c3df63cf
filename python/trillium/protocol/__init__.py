"""Every message that crosses an actor boundary. Structs only: no behaviour lives here."""

from trillium.protocol.messages import (
    AbortRequest,
    AddRequest,
    FinishReason,
    SamplingParams,
    TokenDelta,
    TokenizeRequest,
    TokenizeResult,
)
from trillium.protocol.step import ScheduledRequest, StepInput, StepOutput

__all__ = [
    "AbortRequest",
    "AddRequest",
    "FinishReason",
    "SamplingParams",
    "ScheduledRequest",
    "StepInput",
    "StepOutput",
    "TokenDelta",
    "TokenizeRequest",
    "TokenizeResult",
]
