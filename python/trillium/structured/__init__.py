"""Structured output: constraints compiled to grammars (llguidance), one controller per request,
and the per-step token bitmask.

``compiler`` turns a :class:`~trillium.protocol.StructuredOutputs` into a cached
:class:`CompiledGrammar`; ``actor`` is the :class:`GrammarActor` that compiles off the event
loop under a time limit; ``controller`` is the one interface the scheduler calls per request
(its verdicts say what a step's tokens came to); behind it ``matcher`` advances the grammar with
the kept tokens and ``guard`` keeps the value checks' state; ``bitmask`` fills a step's masks in
the grammar thread while the model runs.
"""

from trillium.structured.bitmask import BitmaskFiller, StepBitmask
from trillium.structured.compiler import CompiledGrammar, GrammarCompiler, GrammarError, build_ll_tokenizer
from trillium.structured.controller import OutputController, StructuredCounters
from trillium.structured.matcher import GrammarMatcher

__all__ = [
    "BitmaskFiller",
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarMatcher",
    "OutputController",
    "StepBitmask",
    "StructuredCounters",
    "build_ll_tokenizer",
]
