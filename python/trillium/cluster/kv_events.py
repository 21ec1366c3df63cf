"""Prefix-cache events on the wire that vLLM workers use, for a KV-aware router.

vllm-router's ``kv_aware`` policy subscribes to each worker's ZMQ PUB socket and keeps an index of
which worker caches which token blocks; it scores a request by the longest run of its prompt's
blocks a worker holds (it asks the worker's ``/v1/*/render`` endpoint for the prompt's token ids
and hashes them itself, so the engine's own block hashes are opaque keys: they only have to name
a block for its later removal and chain a block to its parent). Wire format, as vLLM publishes it
and vllm-router 0.1.17 decodes it (checked against the router binary, see tests/integration/
test_cluster.py):

- a message is three frames: ``topic`` (empty), the sequence number as 8 big-endian bytes
  (starting at 0; a sequence that goes back tells the router the worker restarted, one that jumps
  tells it batches were lost), and a msgpack ``[ts, [event, ...], data_parallel_rank]`` array;
- an event is a map tagged by ``type``: ``BlockStored`` (block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name), ``BlockRemoved`` (block_hashes, medium),
  ``AllBlocksCleared``.

trillium's block hash is the KV block id: unique while the block is cached, and the journal
reports a block removed before its id can be cached again. That holds on the wire only while no
batch is lost, so after a loss the next batch starts with ``AllBlocksCleared``: the router then
under-counts what this replica caches (until prefixes are stored again) rather than trusting a
stale entry. Only unsalted namespaces are published: the served model's (an open server's one
namespace) and, under ``--config``, each tenant scope's (``AddRequest.cache_scope``: a tenant's
own, or its group's), which the scheduler adds with :meth:`KVEventPublisher.add_namespace` when
it first sees it. The router scores a request by its tokens alone, so a tenant's next turn goes
to the replica that holds that tenant's earlier turns; another tenant's request for the same
tokens may be routed there too, and misses there (the namespaces still never share a block).
Requests with a ``cache_salt`` never share a prefix with anyone else's, and their prompts stay off
the wire.

The scheduler hands each step's journal (``RadixTree.take_events``) to :meth:`KVEventPublisher.
publish`, which only numbers and queues it; a daemon thread converts, encodes and sends. When the
queue is full the batch is dropped (``num_dropped``, logged) and its number skipped. A PUB socket
itself drops silently at its high-water mark (ZMQ's, per subscriber); the router sees neither kind
of loss except as the gap.

A router that subscribes late (it started after this replica, or restarted) is sent the whole
cache: the socket is an XPUB, whose subscribe messages the sender thread watches; on one it asks
the scheduler (:meth:`KVEventPublisher.snapshot_wanted`) for ``AllBlocksCleared`` followed by
every cached block (``RadixTree.journal_cached``), so every subscriber then holds exactly the
cache. (vLLM's replay socket answers the same need from a bounded buffer of past batches.)
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from trillium._core import CacheEvent

log = logging.getLogger(__name__)

QUEUE_BATCHES = 4096  # journals waiting for the sender thread before new ones are dropped
SUBSCRIBER_POLL_S = 0.2  # how often an idle sender looks for new subscribers
MEDIUM = "GPU"  # vLLM's name for the engine's own KV pool (what the router credits in full)


class EndpointError(ValueError):
    """The events socket cannot be bound (a port in use, a bad address); names the endpoint."""


class BlockStored(msgspec.Struct, tag=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM
    lora_name: str | None = None


class BlockRemoved(msgspec.Struct, tag=True):
    block_hashes: list[int]
    medium: str | None = MEDIUM


class AllBlocksCleared(msgspec.Struct, tag=True):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
# What the scheduler queues: the journal's events, first AllBlocksCleared after a loss or rebuild.
Pending = list["CacheEvent | AllBlocksCleared"]


class EventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


def to_wire(events: list[CacheEvent], block_size: int) -> list[KVEvent]:
    """The journal's events as wire events."""
    out: list[KVEvent] = []
    for event in events:
        if event.kind == "stored":
            parent = event.parent_block_id
            out.append(BlockStored(event.block_ids, None if parent < 0 else parent, event.tokens, block_size))
        else:
            out.append(BlockRemoved(event.block_ids))
    return out


class KVEventPublisher:
    """Binds a ZMQ XPUB socket at ``endpoint`` (e.g. ``tcp://*:5557``) and publishes prefix-cache
    events of the namespaces in ``namespaces`` on it from a daemon thread.

    Namespaces may be added after construction (the engine binds the socket before it loads the
    model, so a port in use fails fast, and knows the model's namespace only after; tenant scopes
    come with their first request). ``publish``, ``add_namespace`` and ``cleared`` are called from
    one thread (the scheduler's) and never block. ``close`` stops the
    sender (batches still queued are dropped) and closes the socket; calling it again is a no-op.
    Raises EndpointError naming the endpoint when the socket cannot be bound.
    """

    def __init__(self, endpoint: str, *, block_size: int, namespace: int = 0) -> None:
        try:
            import zmq
        except ImportError:  # pragma: no cover - the cluster extra is installed for tests
            raise RuntimeError("--kv-events-endpoint needs pyzmq: pip install 'trillium[cluster]'") from None
        self.endpoint = endpoint
        self.namespaces = {namespace}
        self.block_size = block_size
        self.num_sent = 0  # batches handed to the socket
        self.num_dropped = 0  # batches dropped because the queue was full
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.XPUB)  # a PUB that hears subscribers join
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.IPV6, 1)  # tcp://[::]:port too (IPv4 endpoints work as before)
        try:
            self._socket.bind(endpoint)
        except zmq.ZMQError as exc:
            self._socket.close()
            self._context.term()
            raise EndpointError(f"--kv-events-endpoint {endpoint}: {exc}") from None
        # (sequence number, the journal or [AllBlocksCleared()]); None stops the sender.
        self._queue: queue.Queue[tuple[int, Pending] | None] = queue.Queue(QUEUE_BATCHES)
        self._next_seq = 0  # numbered by the producer, so a dropped batch leaves its gap in place
        self._lost = False  # a batch was dropped: the next one first clears the router's view
        self._closed = False
        self._snapshot = threading.Event()  # a subscriber joined: send it the whole cache
        self._thread = threading.Thread(target=self._send_loop, name="kv-events", daemon=True)
        self._thread.start()
        log.info("publishing prefix-cache events on %s", endpoint)

    def add_namespace(self, namespace: int) -> None:
        """Publish ``namespace``'s events from now on (an unsalted tenant scope's)."""
        self.namespaces.add(namespace)

    def publish(self, events: list[CacheEvent]) -> None:
        """Queue one journal (``RadixTree.take_events()``): its events in the published namespaces,
        converted to wire events on the sender thread (a journal with none is not sent)."""
        mine: Pending = [e for e in events if e.namespace in self.namespaces]
        if mine:
            self._put(mine)

    def snapshot_wanted(self) -> bool:
        """True once after a subscriber joined: the caller then sends :meth:`cleared` and the
        whole cache (``RadixTree.journal_cached``) through :meth:`publish`."""
        if not self._snapshot.is_set():
            return False
        self._snapshot.clear()
        return True

    def cleared(self) -> None:
        """The whole prefix cache was dropped (the KV pool was rebuilt after a failure)."""
        self._put([AllBlocksCleared()])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put_nowait(None)
        except queue.Full:  # the sender is far behind: it sees _closed after its current batch
            pass
        self._thread.join(timeout=5)
        if not self._thread.is_alive():  # else the daemon thread still owns the socket
            self._socket.close()
            self._context.term()

    def _put(self, batch: Pending) -> None:
        seq = self._next_seq
        self._next_seq += 1
        if self._lost:
            batch = [AllBlocksCleared(), *batch]
        try:
            self._queue.put_nowait((seq, batch))
            self._lost = False
        except queue.Full:
            self.num_dropped += 1
            self._lost = True
            if self.num_dropped == 1 or self.num_dropped % 1000 == 0:
                log.warning("kv events: %d batches dropped (the sender is behind)", self.num_dropped)

    def _send_loop(self) -> None:
        import zmq

        encoder = msgspec.msgpack.Encoder()
        while not self._closed or not self._queue.empty():
            self._hear_subscribers(zmq)
            try:
                item = self._queue.get(timeout=SUBSCRIBER_POLL_S)
            except queue.Empty:
                continue
            if item is None:
                return
            seq, batch = item
            cleared = isinstance(batch[0], AllBlocksCleared)
            journal = [e for e in batch if not isinstance(e, AllBlocksCleared)]
            events: list[KVEvent] = [AllBlocksCleared()] if cleared else []
            events += to_wire(journal, self.block_size)
            payload = encoder.encode(EventBatch(time.time(), events))
            try:
                self._socket.send_multipart([b"", seq.to_bytes(8, "big"), payload])
                self.num_sent += 1
            except zmq.ZMQError as exc:  # the socket closed under us at shutdown
                log.debug("kv events: %s", exc)
                return

    def _hear_subscribers(self, zmq: Any) -> None:
        """Read the XPUB's subscribe/unsubscribe messages (first byte 1/0); a subscribe asks for a
        snapshot. The socket is this thread's alone."""
        while True:
            try:
                message = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:  # closed at shutdown
                return
            if message[:1] == b"\x01":
                self._snapshot.set()


def decode_batch(payload: bytes) -> EventBatch:
    """The inverse of what the sender puts in the third frame (for tests and tools)."""
    return msgspec.msgpack.decode(payload, type=EventBatch)
