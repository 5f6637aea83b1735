"""Training data: a batch is a pure function of (source, seed, step, process), so the checkpointed
data position is the step. A corpus is one token stream cut into `seq_len+1`-token rows at stride
`seq_len`, reshuffled each epoch; each process reads only its rows; `pack` adds segment ids, whose
documents `measure_documents` reads into the histogram the price takes.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache, partial

import numpy as np

from cost_models.documents import DocumentLengths, histogram
from cost_models.errors import CpplanError
from runtime.data.packing import segments_from_eos, segments_from_starts
from runtime.data.sources import TokenStream, check_byte_vocab, is_text, open_stream

SYNTHETIC = "synthetic"
MEASURED_TOKENS = 1 << 24  # the stream's first this many tokens hold plenty of documents, and fit in memory


@dataclass(frozen=True)
class Batch:
    """One process's rows of a step: global rows `[process_index·local_batch, (process_index+1)·local_batch)`."""

    tokens: np.ndarray  # [local_batch, seq_len+1] int32
    segment_ids: np.ndarray | None  # like tokens, documents numbered from 1 in each row; None unless packed


def _local_rows(step: int, *, global_batch: int, process_index: int, process_count: int) -> np.ndarray:
    """Global indices (over all steps) of this process's rows of a step."""
    if step < 0:
        raise CpplanError(f"step={step}: data steps count from 0.")
    if process_count < 1 or not 0 <= process_index < process_count:
        raise CpplanError(
            f"process_index={process_index} with process_count={process_count}: the index must be "
            f"in [0, process_count)."
        )
    if global_batch < 1 or global_batch % process_count:
        raise CpplanError(
            f"global_batch={global_batch} does not split over {process_count} processes; use a "
            f"multiple of {process_count}."
        )
    local = global_batch // process_count
    return step * global_batch + process_index * local + np.arange(local, dtype=np.int64)


class SyntheticDataset:
    """Uniformly random tokens (for timing, not learning); each global row seeded by (seed, row)."""

    def __init__(self, *, seq_len: int, vocab: int, seed: int):
        self.seq_len, self.vocab, self.seed = seq_len, vocab, seed

    def batch(self, step: int, *, global_batch: int, process_index: int = 0, process_count: int = 1) -> Batch:
        """This process's rows of a step (see `Batch`)."""
        rows = _local_rows(step, global_batch=global_batch, process_index=process_index, process_count=process_count)
        tokens = np.stack(
            [np.random.default_rng([self.seed, int(row)]).integers(0, self.vocab, self.seq_len + 1) for row in rows]
        ).astype(np.int32)
        return Batch(tokens, None)


def _epoch_order(epoch: int, *, seed: int, num_rows: int) -> np.ndarray:
    """The order in which an epoch visits the rows (numpy's, not grain's: grain imports jax)."""
    return np.random.default_rng([seed, epoch]).permutation(num_rows)


class TokenDataset:
    """Rows of a token stream, shuffled per epoch, with segment ids when `pack`.

    Raises:
        CpplanError: data shorter than one row, or packing without document boundaries.
    """

    def __init__(
        self, stream: TokenStream, *, seq_len: int, vocab: int, seed: int, pack: bool, eos_id: int | None = None
    ):
        if seq_len < 1:
            raise CpplanError(f"seq_len={seq_len}: a sequence needs at least one token.")
        self.num_rows = (len(stream) - 1) // seq_len
        if self.num_rows < 1:
            raise CpplanError(
                f"data {stream.name!r} has {len(stream)} tokens, fewer than one sequence of "
                f"seq_len+1={seq_len + 1}; use more data or a shorter seq_len."
            )
        if pack and eos_id is None and stream.doc_starts is None:
            raise CpplanError(
                f"packing {stream.name!r} needs its document boundaries: pass eos_id (the token that "
                f"ends each document) or an offsets file of document starts, or do not pack."
            )
        if eos_id is not None and not 0 <= eos_id < vocab:
            raise CpplanError(
                f"eos_id={eos_id} is not a token of the model's vocabulary of {vocab}; give the "
                f"tokenizer's end-of-document id."
            )
        self.stream, self.seq_len, self.vocab, self.seed = stream, seq_len, vocab, seed
        self.pack, self.eos_id = pack, eos_id
        # a step's rows span at most two epochs unless the batch outnumbers the rows
        self._order = lru_cache(maxsize=2)(partial(_epoch_order, seed=seed, num_rows=self.num_rows))

    def batch(self, step: int, *, global_batch: int, process_index: int = 0, process_count: int = 1) -> Batch:
        """This process's rows of a step (see `Batch`).

        Raises:
            CpplanError: bad step or process arguments, or a token outside the vocabulary.
        """
        rows = _local_rows(step, global_batch=global_batch, process_index=process_index, process_count=process_count)
        length = self.seq_len + 1
        epochs, within = np.divmod(rows, self.num_rows)
        starts = np.array([self._order(int(e))[w] for e, w in zip(epochs, within)], dtype=np.int64) * self.seq_len
        tokens = np.stack([self.stream.read(int(s), int(s) + length) for s in starts])
        bad = (tokens < 0) | (tokens >= self.vocab)
        if bad.any():
            row, col = np.argwhere(bad)[0]
            raise CpplanError(
                f"data {self.stream.name!r} has token {tokens[row, col]} at offset "
                f"{starts[row] + col}, outside the model's vocabulary of {self.vocab}; tokenize with "
                f"the model's tokenizer or use a model with a larger vocabulary."
            )
        segment_ids = None
        if self.pack:
            segment_ids = (
                segments_from_eos(tokens, self.eos_id)
                if self.eos_id is not None
                else segments_from_starts(starts, length, self.stream.doc_starts)
            )
        return Batch(tokens.astype(np.int32), segment_ids)


def open_dataset(
    source: "str | os.PathLike | None" = None,
    *,
    seq_len: int,
    vocab: int,
    seed: int = 0,
    pack: bool = False,
    dtype: str | None = None,
    eos_id: int | None = None,
    offsets: "str | os.PathLike | None" = None,
) -> "SyntheticDataset | TokenDataset":
    """Opens `source` (None or "synthetic": random tokens; else a file as `sources.open_stream` reads it);
    `.batch(step, global_batch=..., process_index=..., process_count=...)` gives a `Batch`.

    Raises:
        CpplanError: bad files or flags (see `runtime.data.sources.open_stream`), packing synthetic
            data, a text file with a vocabulary under 256, or data shorter than one sequence.
    """
    if source is None or str(source) == SYNTHETIC:
        if pack or dtype is not None or eos_id is not None or offsets is not None:
            raise CpplanError(
                "synthetic data has no documents or files: drop pack, dtype, eos_id and offsets (`cpplan run`'s "
                "--pack, --data-dtype, --eos-id), or give a data file (--data)."
            )
        return SyntheticDataset(seq_len=seq_len, vocab=vocab, seed=seed)
    if is_text(source, dtype=dtype):
        check_byte_vocab(vocab)
    stream = open_stream(source, dtype=dtype, offsets=offsets)
    return TokenDataset(stream, seq_len=seq_len, vocab=vocab, seed=seed, pack=pack, eos_id=eos_id)


def measure_documents(
    source: "str | os.PathLike | None",
    *,
    dtype: str | None = None,
    eos_id: int | None = None,
    offsets: "str | os.PathLike | None" = None,
    max_tokens: int = MEASURED_TOKENS,
) -> DocumentLengths:
    """The lengths of the documents the packer marks (`TokenDataset` with `pack`: after each `eos_id`, or
    at the ArrayRecord records or `offsets`) in the first `max_tokens` tokens of `source`, as a histogram;
    a document those tokens' end cuts short is left out.

    Raises:
        CpplanError: no data file, data without document boundaries (an `eos_id` that does not occur), or no
            whole document in the tokens read.
    """
    if source is None or str(source) == SYNTHETIC:
        raise CpplanError(
            "measuring documents needs a data file (--data) whose documents are marked: synthetic tokens have none."
        )
    stream = open_stream(source, dtype=dtype, offsets=offsets)
    if eos_id is None and stream.doc_starts is None:
        raise CpplanError(
            f"the documents of {stream.name!r} are not marked: pass eos_id (--eos-id, the token that ends each "
            f"document) or an offsets file, or give ArrayRecord data (one document per record)."
        )
    n = min(len(stream), max_tokens)
    if eos_id is not None:
        tokens = stream.read(0, n)
        if not np.any(tokens == eos_id):
            raise CpplanError(
                f"eos_id {eos_id} does not occur in the first {n} tokens of {stream.name!r} ({tokens.dtype} tokens), "
                f"so nothing marks a document; check --eos-id (the token that ends each document)."
            )
        ids = segments_from_eos(tokens[None], eos_id)[0]
        whole_end = n == len(stream) or tokens[-1] == eos_id
    else:
        ids = segments_from_starts(np.zeros(1, dtype=np.int64), n, stream.doc_starts)[0]
        whole_end = n == len(stream) or bool(np.isin(n, stream.doc_starts))
    lengths = np.bincount(ids)[1:]
    lengths = lengths if whole_end else lengths[:-1]
    if not len(lengths):
        raise CpplanError(
            f"the first {n} tokens of {stream.name!r} hold no whole document; check the document marks (eos_id)."
        )
    values, counts = np.unique(lengths, return_counts=True)
    return histogram(values.tolist(), counts.tolist(), source=f"{os.path.basename(stream.name)} (measured)")


def text_tokens(path: "str | os.PathLike", *, vocab: int) -> np.ndarray:
    """The bytes of a text file as int32 tokens (a byte-level tokenizer).

    Raises:
        CpplanError: unreadable file, or a model vocabulary smaller than 256 bytes.
    """
    check_byte_vocab(vocab)
    return np.asarray(open_stream(path).tokens, dtype=np.int32)


def _steps(dataset, batch: int) -> Iterator[np.ndarray]:
    for step in itertools.count():
        yield dataset.batch(step, global_batch=batch).tokens


def text_batches(tokens: np.ndarray, *, batch: int, seq_len: int, seed: int = 0) -> Iterator[np.ndarray]:
    """Endless one-process `[batch, seq_len+1]` rows of a token stream, step after step (the
    `open_dataset` rows of an in-memory stream)."""
    stream = TokenStream("tokens", np.asarray(tokens))
    return _steps(TokenDataset(stream, seq_len=seq_len, vocab=int(np.max(tokens)) + 1, seed=seed, pack=False), batch)


def synthetic_batches(*, vocab: int, batch: int, seq_len: int, seed: int = 0) -> Iterator[np.ndarray]:
    """Endless one-process `[batch, seq_len+1]` uniformly random tokens, step after step."""
    return _steps(SyntheticDataset(seq_len=seq_len, vocab=vocab, seed=seed), batch)
