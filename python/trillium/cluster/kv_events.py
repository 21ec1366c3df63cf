"""Prefix-cache events on the wire that vLLM workers use, for a KV-aware router.

vllm-router's ``kv_aware`` policy subscribes to each worker's ZMQ PUB socket and keeps an index of
which worker caches which token blocks; it scores a request by the longest run of its prompt's
blocks a worker holds (it asks the worker's ``/v1/*/render`` endpoint for the prompt's token ids
and hashes them itself, so the engine's own block hashes are opaque keys: they only have to name
a block for its later removal and chain a block to its parent). Wire format, as vLLM publishes it
and vllm-router 0.1.17 decodes it (checked against the router binary, see tests/integration/
test_cluster.py):

- a message is three frames: ``topic`` (empty), the sequence number as 8 big-endian bytes
  (starting at 0; a sequence that goes back tells the router the worker restarted), and a msgpack
  ``[ts, [event, ...], data_parallel_rank]`` array;
- an event is a map tagged by ``type``: ``BlockStored`` (block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name), ``BlockRemoved`` (block_hashes, medium),
  ``AllBlocksCleared``.

trillium's block hash is the KV block id: unique while the block is cached, and a block is always
reported removed before its id can be cached again (the journal is ordered). Only the served
model's unsalted namespace is published: requests with a ``cache_salt`` never share a prefix
with anyone else's, and their prompts stay off the wire.

The scheduler hands each step's journal (``RadixTree.take_events``) to :meth:`KVEventPublisher.
publish`, which only queues it; a daemon thread encodes and sends. PUB sockets never block: when
the queue or the socket's high-water mark is full, batches are dropped (counted), and the router
sees the gap in the sequence numbers.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from trillium._core import CacheEvent

log = logging.getLogger(__name__)

QUEUE_BATCHES = 4096  # journals waiting for the sender thread before new ones are dropped
MEDIUM = "GPU"  # vLLM's name for the engine's own KV pool (what the router credits in full)


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


class EventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


def to_wire(events: list[CacheEvent], namespace: int, block_size: int) -> list[KVEvent]:
    """The journal's events in ``namespace`` as wire events (others are left out)."""
    out: list[KVEvent] = []
    for event in events:
        if event.namespace != namespace:
            continue
        if event.kind == "stored":
            parent = event.parent_block_id
            out.append(BlockStored(event.block_ids, None if parent < 0 else parent, event.tokens, block_size))
        else:
            out.append(BlockRemoved(event.block_ids))
    return out


class KVEventPublisher:
    """Binds a ZMQ PUB socket at ``endpoint`` (e.g. ``tcp://*:5557``) and publishes prefix-cache
    events of one namespace on it from a daemon thread. ``publish``/``cleared`` are cheap and never
    block (the scheduler calls them between steps). ``close`` stops the thread and the socket."""

    def __init__(self, endpoint: str, *, namespace: int, block_size: int) -> None:
        try:
            import zmq
        except ImportError:  # pragma: no cover - the cluster extra is installed for tests
            raise RuntimeError("--kv-events-endpoint needs pyzmq: pip install 'trillium[cluster]'") from None
        self.endpoint = endpoint
        self.namespace = namespace
        self.block_size = block_size
        self.num_sent = 0  # batches on the wire
        self.num_dropped = 0  # batches dropped (queue or socket full)
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._socket.bind(endpoint)
        except zmq.ZMQError as exc:
            self._socket.close()
            self._context.term()
            raise ValueError(f"--kv-events-endpoint {endpoint}: {exc}") from None
        self._queue: queue.Queue[list[KVEvent] | None] = queue.Queue(QUEUE_BATCHES)
        self._seq = 0  # the next batch's sequence number (the sender thread's)
        self._lock = threading.Lock()  # guards _skipped, which both threads touch
        self._skipped = 0  # batches dropped before reaching the sender: their numbers are skipped
        self._stopping = False
        self._thread = threading.Thread(target=self._send_loop, name="kv-events", daemon=True)
        self._thread.start()
        log.info("publishing prefix-cache events on %s", endpoint)

    def publish(self, events: list[CacheEvent]) -> None:
        """Queue one journal (``RadixTree.take_events()``), converted to wire events."""
        wire = to_wire(events, self.namespace, self.block_size)
        if wire:
            self._put(wire)

    def cleared(self) -> None:
        """The whole prefix cache was dropped (the KV pool was rebuilt after a failure)."""
        self._put([AllBlocksCleared()])

    def close(self) -> None:
        self._stopping = True
        try:
            self._queue.put_nowait(None)
        except queue.Full:  # the sender is far behind: it sees _stopping after its next send
            pass
        self._thread.join(timeout=2)
        self._socket.close()
        self._context.term()

    def _put(self, events: list[KVEvent]) -> None:
        try:
            self._queue.put_nowait(events)
        except queue.Full:
            with self._lock:
                self.num_dropped += 1
                self._skipped += 1  # the router sees the gap

    def _send_loop(self) -> None:
        import zmq

        encoder = msgspec.msgpack.Encoder()
        while not self._stopping:
            events = self._queue.get()
            if events is None:
                return
            payload = encoder.encode(EventBatch(time.time(), events))
            with self._lock:
                self._seq += self._skipped
                self._skipped = 0
            seq = self._seq
            self._seq += 1
            try:
                self._socket.send_multipart([b"", seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
                self.num_sent += 1
            except zmq.Again:
                with self._lock:
                    self.num_dropped += 1
            except zmq.ZMQError as exc:  # socket closed under us at shutdown
                log.debug("kv events: %s", exc)
                return


def decode_batch(payload: bytes) -> EventBatch:
    """The inverse of what the sender puts in the third frame (for tests and tools)."""
    return msgspec.msgpack.decode(payload, type=EventBatch)
