"""Token corpora on disk, each one stream of token ids with its document boundaries.

Reads `.npy` arrays and raw little-endian uint16/uint32 files (nanoGPT/Megatron `.bin`), memory-mapped;
ArrayRecord shards (one document per record, via grain); and text (bytes as tokens). Boundaries are the
records, an `eos_id` token or an offsets `.npy`; tokens are checked against the vocabulary per batch.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cost_models.errors import CpplanError

BYTE_VOCAB = 256
RAW_DTYPES = ("uint16", "uint32")
ARRAY_RECORD_SUFFIXES = (".array_record", ".arrayrecord")
RAW_SUFFIXES = (".bin",)  # never read as text: their width must be given


@dataclass(frozen=True)
class TokenStream:
    """A corpus as one stream of token ids."""

    name: str  # where it came from, for messages
    tokens: object  # 1-D ids supporting len and slicing: a memory map, an array or a `RecordStream`
    doc_starts: np.ndarray | None = None  # sorted offsets where documents start; None: eos_id or unknown

    def __len__(self) -> int:
        return len(self.tokens)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens `[start, stop)` of the stream as int64 (so no id wraps in later checks)."""
        return np.asarray(self.tokens[start:stop], dtype=np.int64)


class RecordStream:
    """ArrayRecord shards (`paths`, in stream order; records of `dtype` tokens) as one stream:
    slicing reads only the records it covers."""

    def __init__(self, paths: list[str], dtype: np.dtype):
        from grain.sources import ArrayRecordDataSource

        self.source = ArrayRecordDataSource(paths)
        self.dtype = dtype
        lengths = np.empty(len(self.source), dtype=np.int64)
        for index in range(len(self.source)):
            size = len(self.source[index])
            if size % dtype.itemsize:
                raise CpplanError(
                    f"ArrayRecord record {index} of {paths} has {size} bytes, not a multiple of "
                    f"{dtype.itemsize} ({dtype.name} tokens); pass the dtype the records were "
                    f"written with ({' or '.join(RAW_DTYPES)})."
                )
            lengths[index] = size // dtype.itemsize
        self.doc_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else lengths
        self.length = int(lengths.sum())

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, window: slice) -> np.ndarray:
        start, stop, _ = window.indices(self.length)
        first = int(np.searchsorted(self.doc_starts, start, side="right")) - 1
        last = int(np.searchsorted(self.doc_starts, stop, side="left"))
        pieces = [np.frombuffer(self.source[i], dtype=self.dtype) for i in range(max(first, 0), last)]
        joined = np.concatenate(pieces) if pieces else np.empty(0, dtype=self.dtype)
        base = int(self.doc_starts[first]) if first >= 0 else 0
        return joined[start - base : stop - base]


def _raw_dtype(dtype: str | None, *, path: str) -> np.dtype:
    if dtype not in RAW_DTYPES:
        raise CpplanError(
            f"token dtype {dtype!r} for {path!r} is not supported; pass one of "
            f"{', '.join(RAW_DTYPES)} (the width the token ids were written with)."
        )
    return np.dtype(dtype).newbyteorder("<")


def _existing(path: str) -> Path:
    file = Path(path)
    if not file.is_file():
        raise CpplanError(f"data file {path!r} does not exist (or is not a file); give the path of a token file.")
    return file


def _npy(path: str, dtype: str | None) -> np.ndarray:
    try:
        tokens = np.load(_existing(path), mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as err:
        raise CpplanError(f"cannot read {path!r} as a .npy token array: {err}") from None
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise CpplanError(
            f"{path!r} holds a {tokens.ndim}-D {tokens.dtype} array; token files must be 1-D "
            f"integer arrays of token ids (flatten it, or save the ids with an integer dtype)."
        )
    if dtype is not None and np.dtype(dtype) != tokens.dtype:
        raise CpplanError(
            f"{path!r} holds {tokens.dtype} tokens but dtype={dtype!r} was given; drop the dtype "
            f"(a .npy file records its own) or give {tokens.dtype.name}."
        )
    return tokens


def _raw(path: str, dtype: str | None) -> np.ndarray:
    file = _existing(path)
    width = _raw_dtype(dtype, path=path)
    size = file.stat().st_size
    if size % width.itemsize:
        raise CpplanError(
            f"{path!r} has {size} bytes, not a multiple of {width.itemsize}: it does not hold "
            f"{width.name} tokens; pass the dtype it was written with ({' or '.join(RAW_DTYPES)})."
        )
    if size == 0:
        raise CpplanError(f"{path!r} is empty; give a file of token ids.")
    return np.memmap(file, dtype=width, mode="r")


def _text(path: str) -> np.ndarray:
    try:
        return np.frombuffer(Path(path).read_bytes(), dtype=np.uint8)
    except OSError as err:
        raise CpplanError(f"cannot read training text {path!r}: {err}") from None


def _array_record_paths(path: str) -> list[str]:
    paths = sorted(glob.glob(path)) if glob.has_magic(path) else [str(_existing(path))]
    if not paths:
        raise CpplanError(f"no ArrayRecord files match {path!r}; give a file or a glob of shard files.")
    return paths


def _offsets(path: "str | os.PathLike", *, length: int) -> np.ndarray:
    starts = _npy(str(path), None).astype(np.int64)
    if len(starts) == 0 or starts[0] != 0 or (np.diff(starts) <= 0).any() or starts[-1] >= length:
        raise CpplanError(
            f"document offsets {str(path)!r} must start at 0, increase strictly and stay below the "
            f"{length} tokens of the data; write the start offset of every document."
        )
    return np.asarray(starts)


def is_array_record(path: str) -> bool:
    """Whether a path names ArrayRecord shards (by suffix)."""
    return path.endswith(ARRAY_RECORD_SUFFIXES)


def is_text(path: "str | os.PathLike", *, dtype: str | None) -> bool:
    """Whether `open_stream` reads a path as text (bytes as tokens)."""
    path = str(path)
    return dtype is None and not path.endswith(".npy") and not is_array_record(path)


def check_byte_vocab(vocab: int) -> None:
    """Raises CpplanError when a model's vocabulary cannot hold byte tokens."""
    if vocab < BYTE_VOCAB:
        raise CpplanError(f"byte-level text needs a vocabulary of at least {BYTE_VOCAB}; the model has {vocab}.")


def open_stream(
    path: "str | os.PathLike", *, dtype: str | None = None, offsets: "str | os.PathLike | None" = None
) -> TokenStream:
    """A `.npy` file, a raw token file or ArrayRecord shards (a file or a glob) with `dtype` "uint16" or
    "uint32", or a text file, as a `TokenStream`; `offsets`: a `.npy` of document starts.

    Raises:
        CpplanError: a missing or unreadable file, an unsupported dtype, a file that does not hold
            whole tokens of that dtype, or bad offsets.
    """
    path = str(path)
    if dtype is None and path.endswith(RAW_SUFFIXES):
        raise CpplanError(
            f"{path!r} looks like a raw token file; pass its dtype ({' or '.join(RAW_DTYPES)}), the "
            f"width its token ids were written with."
        )
    if is_array_record(path):
        if offsets is not None:
            raise CpplanError(f"ArrayRecord data {path!r} has one document per record; drop the offsets file.")
        tokens = RecordStream(_array_record_paths(path), _raw_dtype(dtype, path=path))
        return TokenStream(path, tokens, tokens.doc_starts)
    if is_text(path, dtype=dtype):
        tokens = _text(path)
    elif path.endswith(".npy"):
        tokens = _npy(path, dtype)
    else:
        tokens = _raw(path, dtype)
    return TokenStream(path, tokens, None if offsets is None else _offsets(offsets, length=len(tokens)))
