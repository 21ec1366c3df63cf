"""Every message that crosses an actor boundary. Structs only: no behaviour lives here."""

from trillium.protocol.messages import (
    AbortRequest,
    AddRequest,
    DetokenizeRequest,
    DetokenizeResult,
    FinishReason,
    FlushPrefixCache,
    SamplingParamError,
    SamplingParams,
    TokenDelta,
    TokenizeRequest,
    TokenizeResult,
)
from trillium.protocol.stats import GrammarStats, SchedulerStats
from trillium.protocol.step import ScheduledRequest, StepInput, StepOutput, Verdict
from trillium.protocol.structured import CompileGrammar, GrammarCompiled, StructuredOutputs, ThinkSection

__all__ = [
    "AbortRequest",
    "AddRequest",
    "CompileGrammar",
    "DetokenizeRequest",
    "DetokenizeResult",
    "FinishReason",
    "FlushPrefixCache",
    "GrammarCompiled",
    "GrammarStats",
    "SamplingParamError",
    "SamplingParams",
    "ScheduledRequest",
    "SchedulerStats",
    "StepInput",
    "StepOutput",
    "StructuredOutputs",
    "ThinkSection",
    "TokenDelta",
    "TokenizeRequest",
    "TokenizeResult",
    "Verdict",
]
