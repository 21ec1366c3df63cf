"""Named bounds for every channel between actors.

Every channel is bounded: a full inbox is backpressure that the frontend turns into
HTTP 429/503 with ``Retry-After`` instead of an unbounded queue.
"""

from __future__ import annotations

from typing import Any

import trio

# Requests waiting to be picked up by the scheduler between two steps. A step takes tens of
# milliseconds, so this many arrivals in one step means the server is overloaded.
INBOX_BOUND = 256

# Prompts waiting to be tokenized.
TOKENIZER_INBOX_BOUND = 256

# Output constraints waiting to be compiled (cache hits are answered at once).
GRAMMAR_INBOX_BOUND = 64

# Usage records waiting to be written to the ledger. The frontend admits a request only while
# its record has a slot here (requests in flight count), so records are never dropped; a
# full inbox means the disk is far behind and new requests get 503.
METERING_INBOX_BOUND = 4096


def open_inbox(bound: int) -> tuple[trio.MemorySendChannel[Any], trio.MemoryReceiveChannel[Any]]:
    """A bounded inbox; the bound is one of the named constants above. Inboxes carry an actor's
    union of message types, which the actor dispatches on."""
    return trio.open_memory_channel[Any](bound)
