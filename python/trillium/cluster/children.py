"""A child process of ``trillium cluster``: started with its own CPU affinity, its output copied
line by line to the launcher's stderr under its name, stopped with SIGTERM (drain) then SIGKILL."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

import trio

TAIL_LINES = 40  # kept per child, printed when it fails to start


class Child:
    """One run of a command. ``start`` then ``wait``; a restart is a new :class:`Child`."""

    def __init__(self, name: str, argv: Sequence[str], cores: Sequence[int] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.cores = tuple(cores) if cores else None
        self.process: trio.Process | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)  # its last output lines
        self._exited = trio.Event()

    def last_lines(self, n: int) -> str:
        """Its last ``n`` output lines (at most TAIL_LINES), for an error message."""
        return "\n".join(list(self._tail)[-n:])

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def returncode(self) -> int | None:
        return self.process.returncode if self.process is not None else None

    async def start(self, nursery: trio.Nursery) -> None:
        self.process = await trio.lowlevel.open_process(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C on the terminal reaches the launcher only: it drains in order
        )
        if self.cores and hasattr(os, "sched_setaffinity"):
            # Set from here rather than in a preexec_fn (unsafe in a threaded parent): the child
            # is still starting its interpreter, and every thread it makes later inherits this.
            try:
                os.sched_setaffinity(self.process.pid, self.cores)
            except OSError:  # it exited already; its supervisor sees that
                pass
        nursery.start_soon(self._pump)

    async def wait(self) -> int:
        assert self.process is not None
        code = await self.process.wait()
        await self._exited.wait()  # its last lines are out
        return code

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.returncode is None:
            try:
                self.process.send_signal(signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``grace_s``."""
        if self.process is None:
            return
        self.terminate()
        with trio.move_on_after(grace_s):
            await self.process.wait()
        if self.process.returncode is None:
            self.kill()
            await self.process.wait()

    async def _pump(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        pending = b""
        try:
            async for chunk in self.process.stdout:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._emit(line)
            if pending:
                self._emit(pending)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        finally:
            self._exited.set()

    def _emit(self, raw: bytes) -> None:
        line = raw.decode(errors="replace").rstrip("\r")
        self._tail.append(line)
        sys.stderr.write(f"[{self.name}] {line}\n")
        sys.stderr.flush()
