"""The prefix cache's events on vLLM's KV-event wire (cluster/kv_events.py), received by a ZMQ
subscriber as vllm-router's kv_aware policy receives them."""

from __future__ import annotations

import time

import msgspec
import pytest

from trillium._core import BlockAllocator, RadixTree
from trillium.cluster.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EndpointError,
    KVEventPublisher,
    decode_batch,
)

zmq = pytest.importorskip("zmq")

BS = 4
NS = 7


def _subscriber(endpoint: str):
    context = zmq.Context.instance()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(endpoint)
    return sub


def _join(sub, publisher: KVEventPublisher) -> int:
    """Send until the subscriber has joined (PUB drops what it sends before then), then drain what
    is left in flight; returns the last sequence number seen."""
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    seq = None
    for _ in range(50):
        publisher.cleared()
        while poller.poll(300):
            seq = int.from_bytes(sub.recv_multipart()[1], "big")
        if seq is not None:
            return seq
    raise AssertionError("the subscriber never joined")


def _next(sub) -> tuple[int, list]:
    topic, seq, payload = sub.recv_multipart()
    assert topic == b""
    return int.from_bytes(seq, "big"), decode_batch(payload).events


@pytest.fixture
def wired(tmp_path):
    """(allocator, journaling tree, publisher, a subscriber that has joined, the last sequence
    number it saw)."""
    endpoint = f"ipc://{tmp_path}/kv.sock"
    alloc = BlockAllocator(16)
    tree = RadixTree(alloc, BS)
    tree.record_events = True
    publisher = KVEventPublisher(endpoint, namespace=NS, block_size=BS)
    sub = _subscriber(endpoint)
    try:
        yield alloc, tree, publisher, sub, _join(sub, publisher)
    finally:
        sub.close()
        publisher.close()
        publisher.close()  # a second close is a no-op


def test_a_subscriber_sees_stored_and_removed_blocks_chained_by_parent(wired) -> None:
    alloc, tree, publisher, sub, last = wired
    blocks = alloc.allocate(3)
    tree.insert(NS, list(range(12)), blocks)
    tree.insert(NS + 1, list(range(8)), alloc.allocate(2))  # another namespace: not published
    publisher.publish(tree.take_events())
    assert _next(sub) == (last + 1, [BlockStored(blocks, None, list(range(12)), BS)])
    more = alloc.allocate(1)
    tree.insert(NS, [*range(8), 50, 51, 52, 53], blocks[:2] + more)  # branches after 2 blocks
    alloc.free(blocks + more)
    tree.evict(1)  # the least recently used tail: blocks[2]
    publisher.publish(tree.take_events())
    assert _next(sub) == (
        last + 2,
        [BlockStored([more[0]], blocks[1], [50, 51, 52, 53], BS), BlockRemoved([blocks[2]])],
    )
    publisher.publish(tree.take_events())  # nothing changed: nothing sent
    publisher.cleared()
    assert _next(sub) == (last + 3, [AllBlocksCleared()])


def test_the_wire_is_vllms_layout() -> None:
    """Events are maps tagged ``type`` with vLLM's field names (the router refuses arrays and
    missing fields); a batch is the array [ts, events, data_parallel_rank]."""
    from trillium.cluster.kv_events import EventBatch

    raw = msgspec.msgpack.encode(EventBatch(1.5, [BlockStored([3], None, [1, 2], 2), BlockRemoved([3])]))
    assert msgspec.msgpack.decode(raw) == [
        1.5,
        [
            {
                "type": "BlockStored",
                "block_hashes": [3],
                "parent_block_hash": None,
                "token_ids": [1, 2],
                "block_size": 2,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
            },
            {"type": "BlockRemoved", "block_hashes": [3], "medium": "GPU"},
        ],
        None,
    ]


def test_a_bad_or_busy_endpoint_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(EndpointError, match=r"kv-events-endpoint tcp://256\.0\.0\.1:1"):
        KVEventPublisher("tcp://256.0.0.1:1", namespace=0, block_size=16)
    first = KVEventPublisher(f"ipc://{tmp_path}/a.sock", block_size=16)
    try:
        port = _free_port()
        taken = KVEventPublisher(f"tcp://127.0.0.1:{port}", block_size=16)
        with pytest.raises(EndpointError, match="in use"):
            KVEventPublisher(f"tcp://127.0.0.1:{port}", block_size=16)
        taken.close()
    finally:
        first.close()


def test_the_config_refuses_an_endpoint_it_cannot_use() -> None:
    from trillium.config import EngineConfig

    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        EngineConfig(kv_events_endpoint="localhost:5557")
    with pytest.raises(ValueError, match="prefix cache"):
        EngineConfig(kv_events_endpoint="tcp://*:5557", enable_prefix_cache=False)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dropped_batch_leaves_its_gap_and_the_next_batch_first_clears_the_routers_view(wired) -> None:
    """Batches are numbered as they are published, so one the full queue drops leaves its number
    unused (the router sees the gap where it was), and the next one that goes out starts with
    AllBlocksCleared: a lost BlockRemoved must not leave the router trusting a stale block."""
    import queue

    alloc, tree, publisher, sub, last = wired
    sender_queue = publisher._queue
    publisher._queue = queue.Queue(1)  # the sender waits on its own queue: nothing leaves now
    journals = []
    for start in (0, 100, 200):
        tree.insert(NS, list(range(start, start + BS)), alloc.allocate(1))
        journals.append(tree.take_events())
        publisher.publish(journals[-1])
    assert publisher.num_dropped == 2  # the second and third: the stand-in queue holds one
    sender_queue.put(publisher._queue.get())
    publisher._queue = sender_queue
    tree.insert(NS, list(range(300, 300 + BS)), alloc.allocate(1))
    publisher.publish(tree.take_events())
    seq, events = _next(sub)
    assert seq == last + 1 and [e.token_ids for e in events] == [list(range(BS))]
    seq, events = _next(sub)
    assert seq == last + 4  # 2 and 3 were dropped
    assert events[0] == AllBlocksCleared() and events[1].token_ids == list(range(300, 300 + BS))


def test_a_subscriber_joining_asks_for_the_whole_cache(tmp_path) -> None:
    """The socket is an XPUB: a router that connects (late, or after a restart) makes
    snapshot_wanted() true once, so the scheduler sends it the whole cache."""
    endpoint = f"ipc://{tmp_path}/kv.sock"
    publisher = KVEventPublisher(endpoint, namespace=NS, block_size=BS)
    try:
        assert not publisher.snapshot_wanted()
        sub = _subscriber(endpoint)
        deadline = time.monotonic() + 5
        while not publisher.snapshot_wanted():
            assert time.monotonic() < deadline, "the subscription was never heard"
            time.sleep(0.05)
        assert not publisher.snapshot_wanted()  # once per subscriber
        sub.close()
    finally:
        publisher.close()
