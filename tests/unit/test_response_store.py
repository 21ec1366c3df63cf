"""The Responses API's store: bounded by count and bytes, oldest out first, one tenant's only."""

from trillium.server.response_store import ResponseStore
from trillium.server.schema import ChatMessage


def conversation(text: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=text)]


def test_bounded_by_count_oldest_out():
    store = ResponseStore(max_responses=3, max_bytes=10**6)
    for i in range(5):
        store.put(f"r{i}", "t", conversation(str(i)), {"id": f"r{i}"})
    assert len(store) == 3
    assert store.get("r0", "t") is None and store.get("r1", "t") is None
    assert store.get("r4", "t") is not None


def test_bounded_by_bytes():
    store = ResponseStore(max_responses=100, max_bytes=2000)
    for i in range(20):
        store.put(f"r{i}", "t", conversation("x" * 300), {"id": f"r{i}"})
        assert store.num_bytes <= 2000
    assert 1 < len(store) < 20
    store.put("huge", "t", conversation("x" * 5000), {"id": "huge"})  # larger than the bound: not kept
    assert store.get("huge", "t") is None and store.num_bytes <= 2000


def test_a_response_belongs_to_its_tenant():
    store = ResponseStore()
    store.put("r", "alice", conversation("secret"), {"id": "r"})
    assert store.get("r", "bob") is None
    assert not store.delete("r", "bob")
    item = store.get("r", "alice")
    assert item is not None and item.conversation[0].content == "secret"
    assert store.delete("r", "alice") and store.get("r", "alice") is None and store.num_bytes == 0


def test_one_tenant_cannot_push_out_the_others():
    store = ResponseStore(max_responses=100, max_bytes=10**6, max_per_tenant=3)
    store.put("alice-1", "alice", conversation("a"), {"id": "alice-1"})
    for i in range(50):
        store.put(f"mallory-{i}", "mallory", conversation("m"), {"id": i})
    assert store.get("alice-1", "alice") is not None
    assert [store.get(f"mallory-{i}", "mallory") is not None for i in (46, 47, 48, 49)] == [False, True, True, True]
    assert len(store) == 4
