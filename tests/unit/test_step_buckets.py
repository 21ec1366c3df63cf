"""Which padded shape a step runs in (``models.step_buckets``): shared by the CPU compiled decode
and the GPU's captured steps."""

from __future__ import annotations

import pytest

from trillium.models.step_buckets import GPU_BATCH_SIZES, StepBuckets


def test_a_step_runs_in_the_smallest_bucket_that_holds_it() -> None:
    buckets = StepBuckets([1, 4, 8], [1, 6])
    assert [buckets.bucket(n) for n in (1, 2, 4, 5, 8, 9)] == [1, 4, 4, 8, 8, None]
    assert buckets.match([1, 1, 1]) == (4, 1)
    assert buckets.match([6] * 7) == (8, 6)


@pytest.mark.parametrize(
    "query_lens",
    [[], [1, 6], [2, 2], [1] * 9],
    ids=["empty", "mixed", "uncaptured-length", "too-many"],
)
def test_steps_without_a_bucket_run_eagerly(query_lens: list[int]) -> None:
    assert StepBuckets([1, 4, 8], [1, 6]).match(query_lens) is None


def test_shapes_are_listed_largest_first_for_capture() -> None:
    shapes = StepBuckets([1, 4], [1, 3]).shapes()
    assert shapes == [(4, 3), (4, 1), (1, 3), (1, 1)]


def test_up_to_caps_the_gpu_sizes_at_the_running_limit() -> None:
    buckets = StepBuckets.up_to(100)
    assert buckets.max_batch == 100
    assert buckets.batch_sizes == [b for b in GPU_BATCH_SIZES if b < 100] + [100]
    assert buckets.bucket(97) == 100


@pytest.mark.parametrize(("sizes", "tokens"), [([], [1]), ([0, 4], [1]), ([4], [0])])
def test_bad_buckets_are_refused(sizes: list[int], tokens: list[int]) -> None:
    with pytest.raises(ValueError, match="positive"):
        StepBuckets(sizes, tokens)
