"""Stored responses of the Responses API, for ``previous_response_id`` and ``GET /v1/responses/{id}``.

In this process's memory only (a restart forgets them, as it forgets the prefix cache), bounded
twice: at most ``max_responses`` responses and ``max_bytes`` of their encoded conversations and
bodies, oldest out first. A response belongs to its tenant: another API key cannot read it or
continue from it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec

from trillium.server.schema import ChatMessage

MAX_RESPONSES = 1024
MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class StoredResponse:
    tenant: str
    conversation: list[ChatMessage]  # input history + this response's output, for a continuation
    body: dict[str, Any]  # the response object as returned
    size: int  # bytes counted against the store's bound


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, tenant: str, conversation: list[ChatMessage], body: dict[str, Any]) -> None:
        """Keep a response; one larger than the whole bound is not kept (a continuation from it
        is then a clear 400, never an unbounded store)."""
        size = len(msgspec.json.encode(conversation)) + len(msgspec.json.encode(body))
        if size > self.max_bytes:
            return
        self._items[response_id] = StoredResponse(tenant, conversation, body, size)
        self.num_bytes += size
        while len(self._items) > self.max_responses or self.num_bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.num_bytes -= old.size

    def get(self, response_id: str, tenant: str) -> StoredResponse | None:
        item = self._items.get(response_id)
        if item is None or item.tenant != tenant:
            return None
        self._items.move_to_end(response_id)
        return item

    def delete(self, response_id: str, tenant: str) -> bool:
        item = self.get(response_id, tenant)
        if item is None:
            return False
        del self._items[response_id]
        self.num_bytes -= item.size
        return True
