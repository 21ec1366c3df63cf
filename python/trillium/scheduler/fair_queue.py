"""The waiting queue: fair between tenants, by priority then arrival inside a tenant.

Between tenants it is start-time fair queueing (SFQ, a weighted-fair-queueing variant that
needs no packet lengths in advance) over prompt tokens. Each tenant with waiting requests has a
virtual finish tag ``finish``; the queue's virtual time ``vtime`` is the start tag of the last
request taken. The next request is the head of the tenant with the smallest start tag
``max(finish, vtime)`` (ties: the older head); taking it sets ``vtime`` to that tag and
advances the tenant's ``finish`` by the request's cost::

    tenant A (flooding): finish 900 ──▶ start max(900, 300) = 900
    tenant B (new):      finish   0 ──▶ start max(  0, 300) = 300   ◀── taken next

A tenant that goes idle keeps no credit (its old ``finish`` is below ``vtime``), and one that
arrives waits for at most one request of every other tenant, however many they queued: a
flooding tenant delays others by its share only (deficit round robin would make a new tenant
wait up to a whole quantum of every other tenant instead).

Cost is prompt tokens (at least 1): admission commits the request's prefill to the step's token
budget, the resource one step has, so a tenant of long prompts gets as much prefill as one of
short prompts, not more. Decode work is bounded by running slots, which the policy shares
(``SchedulerPolicy``).

Inside a tenant, requests go by ``(priority, arrival_time)``: lower ``priority`` first, as in
vLLM. A preempted request is put back with its own key, so it goes ahead of every request of its
tenant and priority that arrived after it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection, Iterator

from trillium.scheduler.request import Request


def cost(request: Request) -> int:
    """What taking ``request`` charges its tenant: its prompt tokens (at least 1)."""
    return max(1, request.num_prompt_tokens)


class _TenantQueue:
    """One tenant's waiting requests as a heap of ``(priority, arrival_time, seq, request)``."""

    __slots__ = ("heap", "finish")

    def __init__(self) -> None:
        self.heap: list[tuple[int, float, int, Request]] = []
        self.finish = 0  # virtual finish tag of the tenant's last request taken


class FairQueue:
    """Waiting requests of all tenants. Not thread-safe (the scheduler's event loop owns it).

    ``peek()`` returns what ``popleft()`` would take; neither mutates on an empty queue (they
    raise ``IndexError``). ``remove`` raises ``ValueError`` for a request that is not queued.
    """

    def __init__(self) -> None:
        self._tenants: dict[str, _TenantQueue] = {}  # only tenants with waiting requests
        self._finish: dict[str, int] = {}  # finish tags of idle tenants, dropped once below vtime
        self._vtime = 0
        self._len = 0
        self._seq = itertools.count()  # ties of equal (priority, arrival_time)

    # ---- queue operations ------------------------------------------------------------------

    def append(self, request: Request) -> None:
        """Queue a new or preempted request in its tenant's (priority, arrival) order."""
        queue = self._tenants.get(request.tenant)
        if queue is None:
            queue = self._tenants[request.tenant] = _TenantQueue()
            queue.finish = self._finish.pop(request.tenant, 0)
        heapq.heappush(queue.heap, (request.priority, request.arrival_time, next(self._seq), request))
        self._len += 1

    readd = append  # a preempted request: its old key puts it first among later arrivals

    def peek(self, tenants: Collection[str] | None = None) -> Request:
        """The next request; with ``tenants``, the next of those tenants' requests (IndexError if
        they have none)."""
        return self._tenants[self._next_tenant(tenants)].heap[0][3]

    def popleft(self) -> Request:
        """Take the next request and charge its tenant."""
        return self.take(self.peek())

    def take(self, request: Request) -> Request:
        """Take ``request``, a result of :meth:`peek` (still its tenant's first, even if another
        tenant's request went back into the queue since), and charge its tenant."""
        tenant = request.tenant
        queue = self._tenants[tenant]
        assert queue.heap[0][3] is request, "take() needs its tenant's first request"
        heapq.heappop(queue.heap)
        self._vtime = max(queue.finish, self._vtime)
        queue.finish = self._vtime + cost(request)
        self._len -= 1
        if not queue.heap:
            self._retire(tenant)
        return request

    def remove(self, request: Request) -> None:
        """Drop a queued request (abort) without charging its tenant."""
        queue = self._tenants.get(request.tenant)
        index = None if queue is None else next((i for i, e in enumerate(queue.heap) if e[3] is request), None)
        if queue is None or index is None:
            raise ValueError(f"{request.request_id!r} is not waiting")
        queue.heap[index] = queue.heap[-1]
        queue.heap.pop()
        heapq.heapify(queue.heap)
        self._len -= 1
        if not queue.heap:
            self._retire(request.tenant)

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[Request]:
        """Every waiting request, tenant by tenant, each tenant's in its own order (not the
        order ``popleft`` takes them across tenants)."""
        for queue in self._tenants.values():
            for entry in sorted(queue.heap):
                yield entry[3]

    # ---- introspection -----------------------------------------------------------------------

    def num_waiting(self, tenant: str) -> int:
        queue = self._tenants.get(tenant)
        return 0 if queue is None else len(queue.heap)

    @property
    def tenants(self) -> list[str]:
        """Tenants with waiting requests."""
        return list(self._tenants)

    # ---- internals ---------------------------------------------------------------------------

    def _next_tenant(self, among: Collection[str] | None = None) -> str:
        """The tenant (of ``among``, if given) with the smallest start tag; O(tenants waiting).
        Raises IndexError if there is none."""
        candidates = self._tenants if among is None else [t for t in among if t in self._tenants]
        if not candidates:
            raise IndexError("the waiting queue is empty")
        vtime = self._vtime
        return min(candidates, key=lambda t: (max(self._tenants[t].finish, vtime), self._tenants[t].heap[0][1:3]))

    def _retire(self, tenant: str) -> None:
        """A tenant's last request left: remember its finish tag while it still exceeds vtime
        (a tenant cannot skip its charge by emptying and refilling its queue)."""
        queue = self._tenants.pop(tenant)
        if queue.finish > self._vtime:
            self._finish[tenant] = queue.finish
        self._finish = {t: f for t, f in self._finish.items() if f > self._vtime}
