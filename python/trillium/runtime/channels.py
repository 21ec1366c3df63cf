"""Named bounds for every channel between actors.

Every channel is bounded: a full inbox is backpressure that the frontend turns into
HTTP 429/503 with ``Retry-After`` instead of an unbounded queue.
"""

from __future__ import annotations

import trio

# Requests waiting to be picked up by the scheduler between two steps. A step takes tens of
# milliseconds, so this many arrivals in one step means the server is overloaded.
INBOX_BOUND = 256

# Prompts waiting to be tokenized.
TOKENIZER_INBOX_BOUND = 256


def open_inbox(bound: int) -> tuple[trio.MemorySendChannel, trio.MemoryReceiveChannel]:
    """A bounded inbox; the bound is one of the named constants above."""
    return trio.open_memory_channel(bound)
