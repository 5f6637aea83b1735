"""Batches by step number: the data a run reads at step k is a pure function of (seed, k, rows).

This is the interface the training loop reads (`open_dataset(...).batch(step, ...)`); it wraps
the synthetic and text sources of `runtime.data`. Each row is drawn from its own generator
seeded by (seed, step, row), so a process makes only its own rows, every process count gives
the same global batch, and the data position to checkpoint is the step number.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from cost_models.errors import CpplanError
from runtime.data import text_tokens


@dataclass(frozen=True)
class Batch:
    """A process's rows of one step.

    Attributes:
        tokens: int32 `[local_batch, seq_len+1]` in natural order.
        segment_ids: int32 `[local_batch, seq_len+1]` document ids of packed rows, or None.
    """

    tokens: np.ndarray
    segment_ids: np.ndarray | None = None


@dataclass(frozen=True)
class _Windows:
    """Synthetic tokens (`tokens` None) or windows of a token stream, `seq_len+1` per row."""

    seq_len: int
    vocab: int
    seed: int
    tokens: np.ndarray | None

    def batch(self, step: int, *, global_batch: int, process_index: int = 0, process_count: int = 1) -> Batch:
        if global_batch % process_count:
            raise CpplanError(f"a batch of {global_batch} sequences does not split over {process_count} "
                              f"processes; plan a batch that is a multiple of {process_count}.")
        local = global_batch // process_count
        rows = range(process_index * local, (process_index + 1) * local)
        return Batch(np.stack([self._row(step, row) for row in rows]))

    def _row(self, step: int, row: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, step, row])
        need = self.seq_len + 1
        if self.tokens is None:
            return rng.integers(0, self.vocab, size=need, dtype=np.int32)
        start = int(rng.integers(0, len(self.tokens) - need + 1))
        return self.tokens[start:start + need]


def open_dataset(source: "str | os.PathLike | None", *, seq_len: int, vocab: int, seed: int = 0,
                 pack: bool = False):
    """The run's data: synthetic tokens (source None) or a text file read as byte tokens.

    Args:
        source: a text file, or None for synthetic tokens.
        seq_len: tokens per sequence (each row carries one more, the last target).
        vocab: the model's vocabulary.
        seed: data seed.
        pack: pack documents with segment ids (not supported by these sources).
    Returns:
        An object with `batch(step, *, global_batch, process_index, process_count) -> Batch`.
    Raises:
        CpplanError: packing asked of these sources, or an unreadable text file.
    """
    if pack:
        raise CpplanError("packing needs a tokenized dataset with document boundaries; synthetic tokens and text "
                          "files are single streams. Drop --pack.")
    if source is None:
        return _Windows(seq_len, vocab, seed, None)
    tokens = text_tokens(source, vocab=vocab)
    if len(tokens) < seq_len + 1:  # short texts repeat, as runtime.data.text_batches does
        tokens = np.tile(tokens, (seq_len + 1) // len(tokens) + 1)
    return _Windows(seq_len, vocab, seed, tokens)
