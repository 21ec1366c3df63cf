"""Structured output: constraints compiled to grammars (llguidance), one matcher per request,
and the per-step token bitmask.

``compiler`` turns a :class:`~trillium.protocol.StructuredOutputs` into a cached
:class:`CompiledGrammar`; ``actor`` is the :class:`GrammarActor` that compiles off the event
loop under a time limit; ``matcher`` advances one request's grammar with its accepted tokens;
``bitmask`` fills a step's masks in the grammar thread while the model runs.
"""

from trillium.structured.bitmask import BitmaskFiller, StepBitmask
from trillium.structured.compiler import CompiledGrammar, GrammarCompiler, GrammarError, build_ll_tokenizer
from trillium.structured.matcher import GrammarMatcher

__all__ = [
    "BitmaskFiller",
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarMatcher",
    "StepBitmask",
    "build_ll_tokenizer",
]
