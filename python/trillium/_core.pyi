"""Type stub for the compiled core (cpp/bindings/)."""

__version__: str

class OutOfBlocksError(MemoryError):
    """Fewer free blocks than requested; nothing was allocated."""

class InvariantError(AssertionError, RuntimeError):
    """An internal invariant of the core does not hold (a bug, never a user error)."""

class BlockAllocator:
    """Ref-counted KV block ids [0, num_blocks) with an O(1) intrusive free list."""

    def __init__(self, num_blocks: int) -> None: ...
    def allocate(self, n: int) -> list[int]:
        """n free blocks with ref count 1; all-or-nothing (OutOfBlocksError), ValueError if n < 0."""
    def can_allocate(self, n: int) -> bool: ...
    def incref(self, block_ids: list[int]) -> None:
        """One more reference per listed id; ValueError and no change on a bad id or free block."""
    def free(self, block_ids: list[int]) -> None:
        """One reference less per listed id; freed blocks are reused tail-first (reverse order).

        ValueError and no change on a bad id or a double free.
        """
    def ref_count(self, block_id: int) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def num_total_blocks(self) -> int: ...
    @property
    def num_used_blocks(self) -> int: ...
    def check_invariants(self) -> None:
        """Raises InvariantError naming the first violated invariant."""
