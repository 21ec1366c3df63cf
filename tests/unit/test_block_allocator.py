"""Tests of the trillium._core.BlockAllocator binding (the C++ logic has its own ctest units)."""

import random

import pytest

from trillium import _core
from trillium._core import BlockAllocator, OutOfBlocksError


def test_allocate_free_round_trip():
    a = BlockAllocator(8)
    assert (a.num_total_blocks, a.num_free_blocks, a.num_used_blocks) == (8, 8, 0)
    ids = a.allocate(3)
    assert ids == [0, 1, 2]
    assert (a.num_free_blocks, a.num_used_blocks) == (5, 3)
    assert all(a.ref_count(i) == 1 for i in ids)
    a.free(ids)
    assert (a.num_free_blocks, a.num_used_blocks) == (8, 0)
    assert a.allocate(0) == []
    a.check_invariants()


def test_out_of_blocks_is_all_or_nothing():
    a = BlockAllocator(4)
    a.allocate(3)
    assert a.can_allocate(1) and not a.can_allocate(2)
    with pytest.raises(OutOfBlocksError, match="requested 2 blocks but only 1"):
        a.allocate(2)
    assert (a.num_free_blocks, a.num_used_blocks) == (1, 3)
    assert issubclass(OutOfBlocksError, MemoryError)
    with pytest.raises(ValueError):
        a.allocate(-1)
    a.check_invariants()


def test_refcount_sharing():
    a = BlockAllocator(4)
    ids = a.allocate(2)
    a.incref(ids)
    assert [a.ref_count(i) for i in ids] == [2, 2]
    a.free(ids)
    assert a.num_free_blocks == 2 and [a.ref_count(i) for i in ids] == [1, 1]
    a.free(ids)
    assert a.num_free_blocks == 4 and [a.ref_count(i) for i in ids] == [0, 0]
    a.check_invariants()


def test_double_free_and_bad_ids_raise_value_error_and_change_nothing():
    a = BlockAllocator(4)
    ids = a.allocate(2)
    a.free(ids)
    with pytest.raises(ValueError, match="double free"):
        a.free(ids)
    kept = a.allocate(1)
    with pytest.raises(ValueError):
        a.free(kept + kept)  # one reference, listed twice
    assert a.ref_count(kept[0]) == 1
    with pytest.raises(ValueError, match="outside"):
        a.free([4])
    with pytest.raises(ValueError):
        a.incref([kept[0], 3])  # 3 is free
    assert a.ref_count(kept[0]) == 1
    with pytest.raises(ValueError):
        a.ref_count(-1)
    with pytest.raises(ValueError):
        BlockAllocator(-1)
    assert a.num_free_blocks == 3
    a.check_invariants()


def test_freed_blocks_are_reused_tail_first():
    a = BlockAllocator(6)
    chain = a.allocate(6)  # the whole pool, so the reuse order is ours alone
    a.free(chain[:3])
    assert a.allocate(3) == chain[:3][::-1]


def test_invariant_error_type():
    assert issubclass(_core.InvariantError, AssertionError)
    assert issubclass(_core.InvariantError, RuntimeError)
    assert isinstance(_core.__version__, str)


def test_random_operations_match_a_python_model():
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    num_blocks = rng.randint(1, 48)
    a = BlockAllocator(num_blocks)
    model = [0] * num_blocks  # ref count per block
    held: list[list[int]] = []  # each entry holds one reference per listed id
    for step in range(500):
        ctx = f"seed={seed} step={step}"
        op = rng.random()
        if op < 0.4:
            n = rng.randint(0, 6)
            free_before = model.count(0)
            if n <= free_before:
                ids = a.allocate(n)
                assert len(set(ids)) == n and all(model[i] == 0 for i in ids), ctx
                for i in ids:
                    model[i] = 1
                held.append(ids)
            else:
                with pytest.raises(OutOfBlocksError):
                    a.allocate(n)
        elif op < 0.6 and held:
            ids = rng.choice(held)
            a.incref(ids)
            for i in ids:
                model[i] += 1
            held.append(list(ids))
        elif op < 0.95 and held:
            ids = held.pop(rng.randrange(len(held)))
            a.free(ids)
            for i in ids:
                model[i] -= 1
        else:  # an invalid free must be rejected without side effects
            free_ids = [i for i in range(num_blocks) if model[i] == 0]
            if free_ids:
                with pytest.raises(ValueError):
                    a.free([rng.choice(free_ids)])
        assert [a.ref_count(i) for i in range(num_blocks)] == model, ctx
        assert a.num_free_blocks == model.count(0), ctx
        assert a.num_used_blocks == num_blocks - model.count(0), ctx
        a.check_invariants()
