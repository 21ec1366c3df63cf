"""Stored responses of the Responses API, for ``previous_response_id`` and ``GET /v1/responses/{id}``.

In this process's memory only (a restart forgets them, as it forgets the prefix cache), bounded
twice: at most ``max_responses`` responses and ``max_bytes`` of their encoded conversations and
bodies, oldest out first; and at most ``max_per_tenant`` of one tenant's (its oldest out first), so
that one API key cannot push everyone else's out. A response belongs to its tenant: another API
key cannot read it or continue from it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec

from trillium.server.schema import ChatMessage

MAX_RESPONSES = 1024
MAX_BYTES = 64 * 1024 * 1024
MAX_PER_TENANT = 256


@dataclass(frozen=True)
class StoredResponse:
    tenant: str
    conversation: list[ChatMessage]  # input history + this response's output, for a continuation
    body: dict[str, Any]  # the response object as returned
    size: int  # bytes counted against the store's bound


class ResponseStore:
    def __init__(
        self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES, max_per_tenant: int = MAX_PER_TENANT
    ) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.max_per_tenant = max_per_tenant
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}  # each tenant's ids, oldest first
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
        self._by_tenant.setdefault(tenant, OrderedDict())[response_id] = None
        self.num_bytes += size
        own = self._by_tenant[tenant]
        while len(own) > self.max_per_tenant:
            self._remove(next(iter(own)))
        while len(self._items) > self.max_responses or self.num_bytes > self.max_bytes:
            self._remove(next(iter(self._items)))

    def get(self, response_id: str, tenant: str) -> StoredResponse | None:
        item = self._items.get(response_id)
        if item is None or item.tenant != tenant:
            return None
        self._items.move_to_end(response_id)
        self._by_tenant[tenant].move_to_end(response_id)
        return item

    def delete(self, response_id: str, tenant: str) -> bool:
        if self.get(response_id, tenant) is None:
            return False
        self._remove(response_id)
        return True

    def _remove(self, response_id: str) -> None:
        item = self._items.pop(response_id)
        self.num_bytes -= item.size
        own = self._by_tenant[item.tenant]
        del own[response_id]
        if not own:
            del self._by_tenant[item.tenant]
