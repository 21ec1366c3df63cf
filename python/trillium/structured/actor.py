"""GrammarActor: compiles output constraints off the event loop, under a time limit.

Each :class:`CompileGrammar` is answered on its one-shot reply channel with a
:class:`GrammarCompiled`: a cache hit at once, otherwise after a compile in a worker thread
(``GRAMMAR_THREADS`` at a time). A compile that outlives ``timeout_s`` is abandoned (its thread
finishes in the background, bounded by llguidance's own fuel limits) and answered with an
error, so a pathological schema costs the client a 400, never the engine a stall. Every reply
channel is closed when its compile ends, answered or not, so that if the actor fails the askers
get ``ActorFailed`` at once (the supervisor restarts it; the compile cache survives).
"""

from __future__ import annotations

import logging

import trio

from trillium.protocol import CompileGrammar, GrammarCompiled, GrammarStats, StructuredOutputs
from trillium.runtime import Actor, Snapshot, faults
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
        super().__init__(inbox)
        self.compiler = compiler
        self._inbox = inbox
        self.timeout_s = timeout_s
        self._limiter = trio.CapacityLimiter(GRAMMAR_THREADS)
        self.num_timeouts = 0
        # Where /stats reads this actor's counters: replaced after every answer.
        self.stats = Snapshot(GrammarStats())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started()
            async for message in self._inbox:
                self.took_message()
                if isinstance(message, CompileGrammar):
                    with message.reply:  # closed on a failure here; else the compile task owns it
                        await faults.ahit("grammar.message")
                        nursery.start_soon(self._compile, message.constraint, message.scope, message.reply.clone())
                else:
                    log.error("grammar: unexpected message %r", message)

    async def _compile(
        self, constraint: StructuredOutputs, scope: str | None, reply: trio.MemorySendChannel[GrammarCompiled]
    ) -> None:
        with reply:
            try:
                result = GrammarCompiled(await self.compile(constraint, scope))
            except GrammarError as exc:
                result = GrammarCompiled(None, str(exc))
            self._publish_stats()
            try:
                reply.send_nowait(result)
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # the asker went away

    async def compile(self, constraint: StructuredOutputs, scope: str | None = None) -> CompiledGrammar:
        """The compiled grammar for ``constraint``, cached per ``scope`` (the asker's tenant's
        namespace). Raises GrammarError (malformed, rejected by llguidance, or over the time
        limit)."""
        hit = self.compiler.cached(constraint, scope)  # raises GrammarError when malformed
        if hit is not None:
            return hit
        try:
            with trio.fail_after(self.timeout_s):
                return await trio.to_thread.run_sync(
                    self.compiler.compile, constraint, scope, limiter=self._limiter, abandon_on_cancel=True
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
