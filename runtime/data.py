"""Training data for runs: byte-level tokens from a text file, or synthetic tokens for benchmarks."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from cost_models.errors import CpplanError

BYTE_VOCAB = 256


def text_tokens(path: "str | os.PathLike", *, vocab: int) -> np.ndarray:
    """The bytes of a text file as int32 tokens (a byte-level tokenizer).

    Raises:
        CpplanError: unreadable file, or a model vocabulary smaller than 256 bytes.
    """
    if vocab < BYTE_VOCAB:
        raise CpplanError(f"byte-level text needs a vocabulary of at least {BYTE_VOCAB}; the model has {vocab}.")
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise CpplanError(f"cannot read training text {str(path)!r}: {err}") from None
    if len(data) < 2:
        raise CpplanError(f"training text {str(path)!r} has {len(data)} bytes; give a file with some text.")
    return np.frombuffer(data, dtype=np.uint8).astype(np.int32)


def text_batches(tokens: np.ndarray, *, batch: int, seq_len: int, seed: int = 0) -> Iterator[np.ndarray]:
    """Endless `[batch, seq_len+1]` windows of a token stream at random offsets (the stream is
    repeated when it is shorter than a window)."""
    need = seq_len + 1
    if len(tokens) < need + batch:
        tokens = np.tile(tokens, (need + batch) // len(tokens) + 1)
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(tokens) - need + 1, size=batch)
        yield np.stack([tokens[s:s + need] for s in starts])


def synthetic_batches(*, vocab: int, batch: int, seq_len: int, seed: int = 0) -> Iterator[np.ndarray]:
    """Endless `[batch, seq_len+1]` uniformly random tokens (for timing, not learning)."""
    rng = np.random.default_rng(seed)
    while True:
        yield rng.integers(0, vocab, size=(batch, seq_len + 1), dtype=np.int32)
