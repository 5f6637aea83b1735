"""Packed sequences: segment ids, per-document positions and the targets a packed row may learn.

A packed row is `seq_len+1` consecutive tokens of the corpus that may hold several documents.
Its segment ids number the documents of the row 1, 2, 3, … in order (a document cut by the row's
start or end is a segment of its own), so attention that only joins equal ids never crosses a
document. Positions (RoPE) restart at 0 at every segment start. The target of a row's token j is
token j+1; it is learned only when both are in the same segment: the last token of a document
(its end-of-document token, where there is one) does not predict the next document's first.
Those targets are replaced by `IGNORED_TARGET`, which the loss skips. Plain numpy: no jax here.
"""
from __future__ import annotations

import numpy as np

from cost_models.errors import CpplanError

IGNORED_TARGET = -1  # a target the loss skips: it would cross a document boundary


def segments_from_eos(rows: np.ndarray, eos_id: int) -> np.ndarray:
    """Segment ids of rows whose documents each end with an `eos_id` token.

    Args:
        rows: `[batch, length]` tokens.
        eos_id: the end-of-document token; the token after it starts a new document.
    Returns:
        `[batch, length]` int32 ids, 1 at every row's first token, +1 after each `eos_id`.
    """
    rows = np.asarray(rows)
    after_eos = np.zeros(rows.shape, dtype=np.int32)
    after_eos[:, 1:] = rows[:, :-1] == eos_id
    return (1 + np.cumsum(after_eos, axis=1)).astype(np.int32)


def segments_from_starts(row_starts: np.ndarray, length: int, doc_starts: np.ndarray) -> np.ndarray:
    """Segment ids of rows cut from a stream whose documents start at `doc_starts`.

    Args:
        row_starts: `[batch]` stream offset of each row's first token.
        length: tokens per row.
        doc_starts: sorted stream offsets where documents start (the first is 0).
    Returns:
        `[batch, length]` int32 ids, 1 at every row's first token, +1 at each document start.
    """
    offsets = np.asarray(row_starts, dtype=np.int64)[:, None] + np.arange(length, dtype=np.int64)
    documents = np.searchsorted(doc_starts, offsets, side="right")
    return (documents - documents[:, :1] + 1).astype(np.int32)


def positions_in_segments(segment_ids: np.ndarray) -> np.ndarray:
    """Each token's position inside its segment: 0 at a segment's first token.

    Args:
        segment_ids: `[batch, length]` ids, constant along each segment.
    Returns:
        `[batch, length]` int32 positions.
    """
    segment_ids = np.asarray(segment_ids)
    index = np.broadcast_to(np.arange(segment_ids.shape[1]), segment_ids.shape)
    starts = np.ones(segment_ids.shape, dtype=bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    first = np.maximum.accumulate(np.where(starts, index, 0), axis=1)
    return (index - first).astype(np.int32)


def inputs_and_targets(rows: np.ndarray, segment_ids: np.ndarray | None):
    """Inputs, targets, positions and input segment ids of `[batch, seq_len+1]` rows.

    Args:
        rows: `[batch, seq_len+1]` tokens in natural order.
        segment_ids: the rows' segment ids, or None for unpacked rows (one sequence per row).
    Returns:
        `(tokens, targets, positions, segment_ids)`, each `[batch, seq_len]` int32; segment_ids is
        None for unpacked rows; targets crossing a document boundary are `IGNORED_TARGET`.
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
        raise CpplanError(f"segment ids shaped {segment_ids.shape} do not match the rows {rows.shape}; give one id "
                          f"per token of each row (`runtime.data.Batch.segment_ids`).")
    inputs_ids = segment_ids[:, :-1]
    targets = np.where(inputs_ids == segment_ids[:, 1:], targets, IGNORED_TARGET).astype(np.int32)
    return tokens, targets, positions_in_segments(inputs_ids), inputs_ids
