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
from functools import lru_cache

import numpy as np

from cost_models.errors import CpplanError, member


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
        lead = f"attention mask {self.kind!r} is not one cpplan knows; the masks are"
        object.__setattr__(self, "kind", member(MaskKind, self.kind, lead=lead))
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


def hops_needed(mask: AttentionMask, block_tokens, ring):
    """Ring hops (K/V passed one rank on, `ring` ranks of `block_tokens` positions each, in natural
    order) that bring a rank's queries every key they see, its own block aside (arrays broadcast). An
    unbounded mask needs all N−1; a window the blocks it reaches back into; chunks none where each
    block holds whole chunks. (Zigzag order is refused under a local mask: `AttentionLayout`.)"""
    ring = np.asarray(ring, dtype=float)
    block = np.asarray(block_tokens, dtype=float)
    if not mask.local:
        return ring - 1
    back = np.ceil(mask.reach / block)
    if mask.kind is MaskKind.CHUNKED:
        back = np.where(block % mask.size == 0, 0.0, back)
    return np.minimum(ring - 1, back)


def _bounds(mask: AttentionMask, first, last):
    """For queries at positions first..last: the earliest key some of them sees, and the earliest key
    all of them see (the latest key each sees is itself, or any under a full mask)."""
    if mask.kind is MaskKind.SLIDING:
        return first - mask.size + 1, last - mask.size + 1
    if mask.kind is MaskKind.CHUNKED:
        start = first // mask.size * mask.size
        return start, np.where(first // mask.size == last // mask.size, start, np.iinfo(np.int64).max // 4)
    return np.full_like(first, np.iinfo(np.int64).min // 4), np.full_like(first, np.iinfo(np.int64).min // 4)


def _query_rows(mask: AttentionMask, q_start: int, q_len: int, bq: int):
    """(first position, last position, first key some query sees, first key every query sees) of each
    block of `bq` queries from q_start.. (`q_len`)."""
    q0 = q_start + np.arange(q_len // bq, dtype=np.int64) * bq
    q1 = q0 + bq - 1
    some, every = _bounds(mask, q0, q1)
    return q0, q1, some, every


def _seen_key_blocks(mask: AttentionMask, q1, some, kv_start: int, kv_len: int, bkv: int):
    """(first, last) key block some query of each row sees, from the rows' last positions and first seen keys."""
    # from the block holding max(some, first key) to the one holding min(q1, last key)
    lo = (np.maximum(some, kv_start) - kv_start) // bkv
    if mask.kind is MaskKind.FULL:
        return lo, np.full(len(q1), kv_len // bkv - 1)
    return lo, (np.minimum(q1, kv_start + kv_len - 1) - kv_start) // bkv


def row_key_blocks(mask: AttentionMask, q_start: int, q_len: int, kv_start: int, kv_len: int, bq: int, bkv: int):
    """(first, last) key block some query of each query block sees, in a call of queries at positions
    q_start.. (`q_len`) against keys at kv_start.. (`kv_len`) in blocks of `bq` × `bkv`; a row whose last
    is before its first sees none."""
    _, q1, some, _ = _query_rows(mask, q_start, q_len, bq)
    return _seen_key_blocks(mask, q1, some, kv_start, kv_len, bkv)


@dataclass(frozen=True)
class CallBlocks:
    """What splash does for one call's mask: blocks computed (some pair visible), blocks where the rule
    is evaluated (partly visible), and the widths of its shrunk grids (the most computed key blocks of
    any query row: forward and dq; the most query blocks of any key column: dK/dV)."""

    computed: int
    partial: int
    row_width: int
    column_width: int


@lru_cache(maxsize=4096)
def call_blocks(mask: AttentionMask, q_start: int, q_len: int, kv_start: int, kv_len: int, bq: int, bkv: int):
    """`CallBlocks` of a call of queries at positions q_start.. (`q_len`) against keys at kv_start..
    (`kv_len`), in blocks of `bq` × `bkv` consecutive positions; one row per query block, so it never
    builds the blocks² table."""
    nq, nk = q_len // bq, kv_len // bkv
    q0, q1, some, every = _query_rows(mask, q_start, q_len, bq)
    full = mask.kind is MaskKind.FULL
    lo, hi = _seen_key_blocks(mask, q1, some, kv_start, kv_len, bkv)
    computed = np.where(hi >= lo, hi - lo + 1, 0)
    # key blocks every query sees: they start at or after `every` and end at or before q0
    a_lo = -((kv_start - np.maximum(every, kv_start)) // bkv)  # ceil
    a_hi = np.full(nq, nk - 1) if full else (q0 + 1 - kv_start) // bkv - 1
    a_hi = np.minimum(a_hi, nk - 1)
    whole = np.where(a_hi >= a_lo, a_hi - a_lo + 1, 0)
    # query blocks that see some key of a column: from the block holding its first key to the latest query
    # that sees its last key
    k0 = kv_start + np.arange(nk, dtype=np.int64) * bkv
    k1 = k0 + bkv - 1
    if full:
        latest = np.full(nk, q_start + q_len - 1)
    elif mask.kind is MaskKind.SLIDING:
        latest = k1 + mask.size - 1
    elif mask.kind is MaskKind.CHUNKED:
        latest = k1 // mask.size * mask.size + mask.size - 1
    else:
        latest = np.full(nk, q_start + q_len - 1)
    c_lo = (np.maximum(k0 if not full else q_start, q_start) - q_start) // bq
    c_hi = (np.minimum(latest, q_start + q_len - 1) - q_start) // bq
    column = np.where(c_hi >= c_lo, c_hi - c_lo + 1, 0)
    return CallBlocks(
        computed=int(computed.sum()),
        partial=int((computed - whole).sum()),
        row_width=int(computed.max(initial=0)),
        column_width=int(column.max(initial=0)),
    )
