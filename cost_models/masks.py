"""The attention masks a layer can have, as the key positions a query sees, and the splash blocks they
leave for a kernel to compute.

causal: every key at or before the query; full: every key; sliding window of W: the W keys ending at
the query (Hugging Face's `sliding_window`); chunked of C: the keys at or before the query within its
C-token chunk (Llama 4's `attention_chunk_size`). Rules use operators only, so numpy and jax arrays
alike evaluate them: the price counts blocks with them, the runtime's kernels mask with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from cost_models.errors import CpplanError


class MaskKind(StrEnum):
    CAUSAL = "causal"
    FULL = "full"
    SLIDING = "sliding_window"
    CHUNKED = "chunked"


@dataclass(frozen=True)
class AttentionMask:
    """One layer's mask: its kind, and for a sliding window or chunks their length in tokens (`size`)."""

    kind: MaskKind
    size: int = 0

    def __post_init__(self):
        try:
            object.__setattr__(self, "kind", MaskKind(self.kind))
        except ValueError:
            raise CpplanError(
                f"attention mask {self.kind!r} is not one cpplan knows; the masks are "
                f"{', '.join(k.value for k in MaskKind)}."
            ) from None
        local = self.kind in (MaskKind.SLIDING, MaskKind.CHUNKED)
        size_ok = isinstance(self.size, int) and not isinstance(self.size, bool)
        if local and not (size_ok and self.size >= 1):
            raise CpplanError(
                f"a {self.kind.value} mask needs its length in tokens, a positive integer, not {self.size!r}."
            )
        if not local and self.size != 0:
            raise CpplanError(f"a {self.kind.value} mask has no length; got size={self.size!r}.")

    @property
    def local(self) -> bool:
        """Whether a query sees a bounded stretch of keys (a window or a chunk), however long the sequence."""
        return self.kind in (MaskKind.SLIDING, MaskKind.CHUNKED)

    @property
    def causal(self) -> bool:
        """Whether a query sees no key after it."""
        return self.kind is not MaskKind.FULL

    @property
    def reach(self) -> float:
        """How many positions before a query its furthest visible key can lie (inf: unbounded)."""
        return self.size - 1 if self.local else math.inf

    def describe(self) -> str:
        return f"{self.kind.value} of {self.size} tokens" if self.local else self.kind.value

    def allows(self, q, kv):
        """Whether the query at position `q` sees the key at position `kv` (arrays broadcast)."""
        if self.kind is MaskKind.FULL:
            return (q >= kv) | (q < kv)
        causal = q >= kv
        if self.kind is MaskKind.SLIDING:
            return causal & (q - kv < self.size)
        if self.kind is MaskKind.CHUNKED:
            return causal & (q // self.size == kv // self.size)
        return causal

    def block_visibility(self, q_first, kv_first, block_q: int, block_kv: int) -> tuple[np.ndarray, np.ndarray]:
        """(any, all): whether some / every query of the block of `block_q` consecutive positions from
        `q_first` sees some / every key of the block of `block_kv` from `kv_first` (arrays broadcast)."""
        q0, k0 = np.asarray(q_first, dtype=np.int64), np.asarray(kv_first, dtype=np.int64)
        q1, k1 = q0 + block_q - 1, k0 + block_kv - 1
        if self.kind is MaskKind.FULL:
            every = np.ones(np.broadcast_shapes(q0.shape, k0.shape), dtype=bool)
            return every, every
        # q − kv over the two blocks runs from q0 − k1 to q1 − k0; the mask asks for it in [0, reach]
        any_ = (q1 >= k0) & (q0 - k1 <= self.reach)
        all_ = (q0 >= k1) & (q1 - k0 <= self.reach)
        if self.kind is MaskKind.CHUNKED:
            c = self.size
            # some pair in one chunk with the key at or before the query: the query block's chunks from
            # q0's to q1's must meet the key block's, and a shared chunk must hold a key ≤ some query
            lo, hi = np.maximum(q0 // c, k0 // c), np.minimum(q1 // c, k1 // c)
            any_ = (lo <= hi) & (np.maximum(k0, lo * c) <= np.minimum(q1, hi * c + c - 1)) & (q1 >= k0)
            all_ = (q0 >= k1) & (q0 // c == q1 // c) & (k0 // c == k1 // c) & (q0 // c == k0 // c)
        return any_, all_

    def block_mask(self, q_first, kv_first, block_q: int, block_kv: int) -> np.ndarray:
        """Splash's block mask entry per block pair: 0 (nothing visible), 1 (partly), 2 (every pair)."""
        any_, all_ = self.block_visibility(q_first, kv_first, block_q, block_kv)
        return np.where(all_, 2, np.where(any_, 1, 0)).astype(np.int32)


CAUSAL = AttentionMask(MaskKind.CAUSAL)
FULL = AttentionMask(MaskKind.FULL)


def sliding_window(size: int) -> AttentionMask:
    return AttentionMask(MaskKind.SLIDING, size)


def chunked(size: int) -> AttentionMask:
    return AttentionMask(MaskKind.CHUNKED, size)


def hops_needed(mask: AttentionMask, block_tokens, ring, zigzag=False):
    """Ring hops (K/V passed one rank on, `ring` ranks of `block_tokens` positions each) that bring a
    rank's queries every key they see, its own block aside (arrays broadcast). An unbounded mask needs
    all N−1; a window the blocks it reaches back into; chunks none where each block holds whole chunks.
    Under zigzag (rank i holds chunks i and 2N−1−i) a window's keys for the second chunk lie on the
    ranks after it, which a ring passing one way reaches last: all N−1 again."""
    ring = np.asarray(ring, dtype=float)
    block = np.asarray(block_tokens, dtype=float)
    if not mask.local:
        return ring - 1
    back = np.ceil(mask.reach / block)
    if mask.kind is MaskKind.CHUNKED:
        back = np.where(block % mask.size == 0, 0.0, back)
    return np.where(np.asarray(zigzag) & (ring > 1), ring - 1, np.minimum(ring - 1, back))
