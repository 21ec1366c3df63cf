"""GrammarActor: compiles output constraints off the event loop, under a time limit.

Each :class:`CompileGrammar` is answered on its one-shot reply channel with a
:class:`GrammarCompiled`: a cache hit at once, otherwise after a compile in a worker thread
(``GRAMMAR_THREADS`` at a time). A compile that outlives ``timeout_s`` is abandoned (its thread
finishes in the background, bounded by llguidance's own fuel limits) and answered with an
error, so a pathological schema costs the client a 400, never the engine a stall.
"""

from __future__ import annotations

import logging

import trio

from trillium.protocol import CompileGrammar, GrammarCompiled, GrammarStats, StructuredOutputs
from trillium.runtime import Actor, Snapshot
from trillium.structured.compiler import CompiledGrammar, GrammarCompiler, GrammarError

log = logging.getLogger("trillium.structured")

COMPILE_TIMEOUT_S = 10.0
GRAMMAR_THREADS = 2  # compiles at once; the rest queue on the limiter (inside their time limit)


class GrammarActor(Actor):
    name = "grammar"

    def __init__(
        self,
        compiler: GrammarCompiler,
        inbox: trio.MemoryReceiveChannel[object],
        timeout_s: float = COMPILE_TIMEOUT_S,
    ) -> None:
        self.compiler = compiler
        self.inbox = inbox
        self.timeout_s = timeout_s
        self._limiter = trio.CapacityLimiter(GRAMMAR_THREADS)
        self.num_timeouts = 0
        # Where /stats reads this actor's counters: replaced after every answer.
        self.stats = Snapshot(GrammarStats())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started()
            async for message in self.inbox:
                if isinstance(message, CompileGrammar):
                    nursery.start_soon(self._compile, message)
                else:
                    log.error("grammar: unexpected message %r", message)

    async def _compile(self, message: CompileGrammar) -> None:
        try:
            result = GrammarCompiled(await self.compile(message.constraint))
        except GrammarError as exc:
            result = GrammarCompiled(None, str(exc))
        self._publish_stats()
        try:
            message.reply.send_nowait(result)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the asker went away

    async def compile(self, constraint: StructuredOutputs) -> CompiledGrammar:
        """The compiled grammar for ``constraint``. Raises GrammarError (malformed, rejected by
        llguidance, or over the time limit)."""
        hit = self.compiler.cached(constraint)  # raises GrammarError when malformed
        if hit is not None:
            return hit
        try:
            with trio.fail_after(self.timeout_s):
                return await trio.to_thread.run_sync(
                    self.compiler.compile, constraint, limiter=self._limiter, abandon_on_cancel=True
                )
        except trio.TooSlowError:
            self.num_timeouts += 1
            raise GrammarError(f"compiling the constraint took longer than {self.timeout_s:g} s") from None
        except GrammarError:
            raise
        except Exception as exc:  # llguidance raising on an API-level problem: still the request's fault
            log.exception("grammar compile failed")
            raise GrammarError(f"could not compile the constraint: {exc}") from None

    def _publish_stats(self) -> None:
        self.stats.publish(
            GrammarStats(
                grammars_compiled=self.compiler.num_compiled,
                grammar_cache_hits=self.compiler.num_cache_hits,
                grammar_compile_timeouts=self.num_timeouts,
            )
        )
