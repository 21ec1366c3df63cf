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
from trillium.protocol.structured import CompileGrammar, GrammarCompiled, StructuredOutputs

__all__ = [
    "AbortRequest",
    "AddRequest",
    "CompileGrammar",
    "FinishReason",
    "GrammarCompiled",
    "SamplingParams",
    "ScheduledRequest",
    "StepInput",
    "StepOutput",
    "StructuredOutputs",
    "TokenDelta",
    "TokenizeRequest",
    "TokenizeResult",
]
