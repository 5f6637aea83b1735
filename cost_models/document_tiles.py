"""The splash tiles a kernel that prunes by segment ids computes: tokamax 0.0.17's splash
(`_refine_mask_info_with_segments`) runs a tile (query block × key block) that its static mask leaves
only where the two blocks' [min, max] segment-id ranges meet in some row of the call (vmapped rows share
one schedule: `_segment_block_overlap` reduces over the batch with any). jax's splash applies segment
ids inside the tiles only, so cpplan's runtime prunes its tables by `computed_tiles` in the graph.

Counted exactly for given ids (`computed_tiles`, operators and array methods only, so numpy and jax
arrays alike evaluate it) and as an expectation over documents packed back to back
(`expected_computed_tiles`). Within a row ids rise with position, so a query block and an earlier key
block meet iff no document starts after the key block's last token up to the query block's first.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from cost_models.documents import DocumentLengths
from cost_models.masks import AttentionMask, call_blocks, row_key_blocks


def ranges_meet(q_lo, q_hi, kv_lo, kv_hi):
    """Whether a query block with ids in [q_lo, q_hi] and a key block with ids in [kv_lo, kv_hi] may
    share a segment (tokamax's test: no false negatives; arrays broadcast)."""
    return (q_hi >= kv_lo) & (kv_hi >= q_lo)


def computed_tiles(static, q_ids, kv_ids, bq: int, bkv: int):
    """`[q blocks, key blocks]` booleans: the tiles a pruning kernel computes in one call.

    Args:
        static: `[q blocks, key blocks]` booleans, the tiles the static mask leaves (splash's block_mask > 0),
            or True for every tile.
        q_ids, kv_ids: `[rows, q_len]` and `[rows, kv_len]` segment ids of the call's rows, in kernel order.
        bq, bkv: the query and key blocks.
    """
    rows = q_ids.shape[0]
    q = q_ids.reshape(rows, -1, bq)
    kv = kv_ids.reshape(rows, -1, bkv)
    meet = ranges_meet(
        q.min(axis=-1)[:, :, None], q.max(axis=-1)[:, :, None], kv.min(axis=-1)[:, None, :], kv.max(axis=-1)[:, None, :]
    )
    return static & meet.any(axis=0)


def rows_per_call(sequences_per_device):
    """The rows of a device's splash call: its sequences, vmapped into one call (a shard's fraction of a
    sequence is one row; arrays broadcast)."""
    return np.maximum(np.ceil(sequences_per_device), 1)


def computed_chance(documents: DocumentLengths, gap, rows: int):
    """The chance a tile whose blocks a document start in `gap` positions would part is computed, in a
    call of `rows` rows packed independently: unless every row parts it."""
    return 1.0 - (1.0 - documents.unbroken(gap)) ** rows


def row_fraction_computed(
    mask: AttentionMask, seq_len: int, bq: int, bkv: int, documents: DocumentLengths, rows: int
) -> float:
    """The expected share of the tiles `mask` leaves in a whole row's call (queries and keys the row's
    `seq_len` tokens) that a pruning kernel computes over `rows` rows of `documents`."""
    static = call_blocks(mask, 0, seq_len, 0, seq_len, bq, bkv).computed
    return expected_computed_tiles(mask, 0, seq_len, 0, seq_len, bq, bkv, documents, rows) / static


@lru_cache(maxsize=1024)
def expected_computed_tiles(
    mask: AttentionMask,
    q_start: int,
    q_len: int,
    kv_start: int,
    kv_len: int,
    bq: int,
    bkv: int,
    documents: DocumentLengths,
    rows: int,
) -> float:
    """The expected tiles a pruning kernel computes in a call of queries at positions q_start.. (`q_len`)
    against keys at kv_start.. (`kv_len`) in natural order, blocks of `bq` × `bkv`, under the static
    `mask` (causal or local: no key after its query), over `rows` rows cut from documents of `documents` lengths.

    In O(blocks): a tile's gap is c + a·t with a = gcd(bq, bkv), t = i·(bq/a) − (j+1)·(bkv/a) for query
    block i and key block j, so each row's sum over its key blocks is a difference of a cumulative sum
    taken in strides of bkv/a.
    """
    lo, hi = row_key_blocks(mask, q_start, q_len, kv_start, kv_len, bq, bkv)
    nq, nk = q_len // bq, kv_len // bkv
    a = math.gcd(bq, bkv)
    p, r = bq // a, bkv // a
    offset = q_start - kv_start + 1  # the gap of query block 0 and a key block ending at kv_start - 1
    t_min = -(nk + 1) * r
    t = np.arange(t_min, (nq - 1) * p + 1, dtype=np.int64)
    chance = computed_chance(documents, offset + a * t, rows)
    # strided cumulative sums: cum[k] = chance[k] + cum[k - r], so a row's tiles are one difference
    padded = np.concatenate([chance, np.zeros(-len(chance) % r)]).reshape(-1, r)
    cum = np.cumsum(padded, axis=0).reshape(-1)

    def upto(index):  # Σ chance[k] over k ≤ index, k ≡ index (mod r); none below 0
        return np.where(index >= 0, cum[np.maximum(index, 0)], 0.0)

    i = np.arange(nq, dtype=np.int64)
    top = i * p - (lo + 1) * r - t_min
    bottom = i * p - (hi + 2) * r - t_min
    per_row = np.where(hi >= lo, upto(top) - upto(bottom), 0.0)
    return float(per_row.sum())
