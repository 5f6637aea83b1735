"""Packed rows: segment ids numbering a row's documents 1, 2, … (a document cut by the row's edge
is its own), positions restarting at each, and targets learned only inside their segment.
"""

from __future__ import annotations

import numpy as np

from cost_models.errors import CpplanError

IGNORED_TARGET = -1  # a target the loss skips: it would cross a document boundary


def segments_from_eos(rows: np.ndarray, eos_id: int) -> np.ndarray:
    """`[batch, length]` int32 segment ids of rows whose documents end with `eos_id`: 1 at each row's
    first token, +1 after each `eos_id`."""
    rows = np.asarray(rows)
    after_eos = np.zeros(rows.shape, dtype=np.int32)
    after_eos[:, 1:] = rows[:, :-1] == eos_id
    return (1 + np.cumsum(after_eos, axis=1)).astype(np.int32)


def segments_from_starts(row_starts: np.ndarray, length: int, doc_starts: np.ndarray) -> np.ndarray:
    """`[batch, length]` int32 segment ids of rows starting at stream offsets `row_starts`, documents at
    the sorted offsets `doc_starts`: 1 at each row's first token, +1 at each document start."""
    offsets = np.asarray(row_starts, dtype=np.int64)[:, None] + np.arange(length, dtype=np.int64)
    documents = np.searchsorted(doc_starts, offsets, side="right")
    return (documents - documents[:, :1] + 1).astype(np.int32)


def positions_in_segments(segment_ids: np.ndarray) -> np.ndarray:
    """Each token's position in its segment (0 at its first token), `[batch, length]` int32."""
    segment_ids = np.asarray(segment_ids)
    index = np.broadcast_to(np.arange(segment_ids.shape[1]), segment_ids.shape)
    starts = np.ones(segment_ids.shape, dtype=bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    first = np.maximum.accumulate(np.where(starts, index, 0), axis=1)
    return (index - first).astype(np.int32)


def inputs_and_targets(rows: np.ndarray, segment_ids: np.ndarray | None):
    """`(tokens, targets, positions, segment_ids)`, each `[batch, seq_len]` int32, of `[batch, seq_len+1]`
    rows; segment_ids None for unpacked rows, targets crossing a document `IGNORED_TARGET`.

    Raises:
        CpplanError: segment ids not shaped like the rows.
    """
    rows = np.asarray(rows, dtype=np.int32)
    tokens, targets = rows[:, :-1], rows[:, 1:]
    if segment_ids is None:
        positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
        return tokens, targets, positions, None
    segment_ids = np.asarray(segment_ids, dtype=np.int32)
    if segment_ids.shape != rows.shape:
        raise CpplanError(
            f"segment ids shaped {segment_ids.shape} do not match the rows {rows.shape}; give one id "
            f"per token of each row (`runtime.data.Batch.segment_ids`)."
        )
    inputs_ids = segment_ids[:, :-1]
    targets = np.where(inputs_ids == segment_ids[:, 1:], targets, IGNORED_TARGET).astype(np.int32)
    return tokens, targets, positions_in_segments(inputs_ids), inputs_ids
