"""Fixed-shape step buckets: which padded shape a step of R requests runs in.

Compiled and captured steps (``models.compiled`` on the CPU, ``engine.cuda_graphs`` on a GPU)
each exist once per shape, so a step of R requests with q new tokens each runs in the smallest
batch bucket B >= R, padded with B - R requests that write nothing. q is 1 for a decode step and
k + 1 for a speculative verify step of k drafts per request; other steps (prefill, mixed query
lengths, more requests than the largest bucket) have no bucket and run eagerly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# Batch sizes captured on a GPU: dense where small batches are common, about 1.5x apart above.
GPU_BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512)


class StepBuckets:
    """Batch-size buckets for steps of ``tokens_per_request`` new tokens per request."""

    def __init__(self, batch_sizes: Iterable[int], tokens_per_request: Iterable[int] = (1,)) -> None:
        self.batch_sizes = sorted(set(batch_sizes))
        self.tokens_per_request = sorted(set(tokens_per_request))
        if not self.batch_sizes or self.batch_sizes[0] <= 0:
            raise ValueError(f"batch sizes must be positive, got {list(batch_sizes)}")
        if not self.tokens_per_request or self.tokens_per_request[0] <= 0:
            raise ValueError(f"tokens per request must be positive, got {list(tokens_per_request)}")

    @classmethod
    def up_to(cls, max_batch: int, tokens_per_request: Iterable[int] = (1,)) -> StepBuckets:
        """The GPU batch sizes up to ``max_batch``, and ``max_batch`` itself."""
        sizes = [b for b in GPU_BATCH_SIZES if b < max_batch] + [max_batch]
        return cls(sizes, tokens_per_request)

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    def bucket(self, num_requests: int) -> int | None:
        """The smallest batch size holding ``num_requests``; None past the largest."""
        for b in self.batch_sizes:
            if b >= num_requests:
                return b
        return None

    def match(self, query_lens: Sequence[int]) -> tuple[int, int] | None:
        """(batch bucket, tokens per request) of a step whose requests bring ``query_lens`` new
        tokens, or None when it has no bucket (empty, mixed lengths, an uncaptured length, or
        too many requests)."""
        if not query_lens:
            return None
        q = query_lens[0]
        if q not in self.tokens_per_request or any(n != q for n in query_lens):
            return None
        b = self.bucket(len(query_lens))
        return None if b is None else (b, q)

    def shapes(self) -> list[tuple[int, int]]:
        """Every (batch bucket, tokens per request), largest step first (the capture order: the
        largest step's memory is then reused by every smaller one)."""
        return sorted(((b, q) for b in self.batch_sizes for q in self.tokens_per_request), key=lambda s: -s[0] * s[1])
