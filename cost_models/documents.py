"""How long the documents packed into a row are, when they vary: a lognormal by mean and spread, or a
histogram of lengths (from a file, or measured from data by `runtime.data.measure_documents`).

A fixed length stays a plain int (`ModelSpec.documents`): documents aligned at its multiples, a static
chunked mask. Varying documents lie back to back in a stream that rows are cut from anywhere (as
cpplan's packer cuts them), so their starts are a stationary renewal process: the chance that no
document starts in the `gap` positions after a token is E[(X − gap)⁺] / E[X] for a length X.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from pathlib import Path

import numpy as np

from cost_models.errors import CpplanError, member
from cost_models.units import counted

MAX_SIGMA = 3.0  # beyond it a lognormal's mean rests on a few huge documents
MAX_HISTOGRAM_BYTES = 16 << 20
HISTOGRAM_FORMAT = (
    "one document length per line in tokens, optionally with how many documents have it: "
    "LENGTH or LENGTH,COUNT (comma or spaces); blank lines and lines starting with # are skipped"
)


class DocumentsKind(StrEnum):
    LOGNORMAL = "lognormal"
    HISTOGRAM = "histogram"


def _whole(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass(frozen=True)
class DocumentLengths:
    """Documents of varying length: `lognormal` of mean `mean` tokens and log-length standard
    deviation `sigma`, or a `histogram` of `counts` documents of each of `lengths` tokens (`source`
    names where it came from, for people)."""

    kind: DocumentsKind
    mean: float = 0.0
    sigma: float = 0.0
    lengths: tuple[int, ...] = ()
    counts: tuple[int, ...] = ()
    source: str = ""

    def __post_init__(self):
        lead = f"document lengths of kind {self.kind!r}: the kinds are"
        tail = " (a fixed length is a whole number of tokens)."
        object.__setattr__(self, "kind", member(DocumentsKind, self.kind, lead=lead, tail=tail))
        if self.kind is DocumentsKind.LOGNORMAL:
            self._check_lognormal()
        else:
            self._check_histogram()

    def _check_lognormal(self) -> None:
        ok = isinstance(self.mean, (int, float)) and not isinstance(self.mean, bool)
        if not ok or not math.isfinite(self.mean) or self.mean < 1:
            raise CpplanError(f"lognormal documents: mean={self.mean!r} must be a number of tokens, at least 1.")
        ok = isinstance(self.sigma, (int, float)) and not isinstance(self.sigma, bool)
        if not ok or not 0 < self.sigma <= MAX_SIGMA:
            raise CpplanError(
                f"lognormal documents: sigma={self.sigma!r} (the standard deviation of the log length) must be "
                f"above 0 and at most {MAX_SIGMA}; for documents of one length give the length alone."
            )
        if self.lengths or self.counts:
            raise CpplanError("lognormal documents have a mean and a sigma, not lengths and counts.")
        object.__setattr__(self, "mean", float(self.mean))
        object.__setattr__(self, "sigma", float(self.sigma))

    def _check_histogram(self) -> None:
        lengths, counts = tuple(self.lengths), tuple(self.counts)
        if not lengths or len(lengths) != len(counts):
            raise CpplanError(
                f"a histogram of documents needs one count per length and at least one length; got "
                f"{len(lengths)} lengths and {len(counts)} counts."
            )
        for what, values in (("length", lengths), ("count", counts)):
            bad = next((v for v in values if not _whole(v) or v < 1), None)
            if bad is not None:
                raise CpplanError(f"a histogram of documents has {what} {bad!r}: each must be a positive whole number.")
        if self.mean or self.sigma:
            raise CpplanError("a histogram of documents has lengths and counts, not a mean and a sigma.")
        merged: dict[int, int] = {}
        for length, count in zip(lengths, counts):
            merged[int(length)] = merged.get(int(length), 0) + int(count)
        object.__setattr__(self, "lengths", tuple(sorted(merged)))
        object.__setattr__(self, "counts", tuple(merged[n] for n in sorted(merged)))
        object.__setattr__(self, "mean", 0.0)

    @property
    def mean_tokens(self) -> float:
        """The mean document length in tokens."""
        if self.kind is DocumentsKind.LOGNORMAL:
            return self.mean
        return float(np.dot(self.lengths, self.counts) / sum(self.counts))

    def unbroken(self, gap) -> np.ndarray:
        """The chance that no document starts within the `gap` positions after a token (arrays; 1 where
        gap ≤ 0): E[(X − gap)⁺] / E[X], for the lognormal in closed form (m·Φ(d₁) − gap·Φ(d₂))."""
        gap = np.maximum(np.asarray(gap, dtype=float), 0.0)
        if self.kind is DocumentsKind.LOGNORMAL:
            from scipy.special import ndtr  # here, not at the top: importing it costs every plan ~0.8 s

            m, s = self.mean, self.sigma
            with np.errstate(divide="ignore"):
                d1 = (np.log(m) - np.log(gap) + s * s / 2) / s  # +inf at gap 0
            beyond = m * ndtr(d1) - gap * ndtr(d1 - s)
        else:  # Σ over lengths above the gap of count·(length − gap), from suffix sums of the sorted lengths
            lengths, counts = np.asarray(self.lengths, dtype=float), np.asarray(self.counts, dtype=float)
            tokens = np.concatenate([np.cumsum((lengths * counts)[::-1])[::-1], [0.0]])
            documents = np.concatenate([np.cumsum(counts[::-1])[::-1], [0.0]])
            above = np.searchsorted(lengths, gap, side="right")
            beyond = (tokens[above] - gap * documents[above]) / counts.sum()
        return np.clip(beyond / self.mean_tokens, 0.0, 1.0)

    def keys_seen(self, seq_len: int) -> float:
        """The mean number of keys a query of a row of `seq_len` tokens sees in its own document, itself
        included: query t sees key t − L while no document starts in between, Σ_L (seq_len − L)·unbroken(L)
        over the row's seq_len queries."""
        return _keys_seen(self, int(seq_len))

    def describe(self) -> str:
        """A phrase for people, e.g. 'lognormal document lengths (mean 8K tokens, sigma 1)'."""
        if self.kind is DocumentsKind.LOGNORMAL:
            return f"lognormal document lengths (mean {_tokens(self.mean)} tokens, sigma {self.sigma:g})"
        n = sum(self.counts)
        where = f" from {self.source}" if self.source else ""
        return f"document lengths{where} ({counted(n, 'document')}, mean {_tokens(self.mean_tokens)} tokens)"

    def to_dict(self) -> dict:
        if self.kind is DocumentsKind.LOGNORMAL:
            return {"kind": self.kind.value, "mean": self.mean, "sigma": self.sigma}
        lengths, counts = list(self.lengths), list(self.counts)
        return {"kind": self.kind.value, "lengths": lengths, "counts": counts, "source": self.source}

    @classmethod
    def from_dict(cls, row: dict) -> "DocumentLengths":
        """Document lengths from their JSON form (`to_dict`).

        Raises:
            CpplanError: not an object, an unknown field, or a value out of range.
        """
        fields = {"kind", "mean", "sigma", "lengths", "counts", "source"}
        if not isinstance(row, dict) or "kind" not in row or set(row) - fields:
            raise CpplanError(
                f"document lengths are a JSON object with a kind and its fields ({', '.join(sorted(fields))}), "
                f"not {row!r:.80}."
            )
        return cls(**{k: tuple(v) if k in ("lengths", "counts") and isinstance(v, list) else v for k, v in row.items()})


@lru_cache(maxsize=256)
def _keys_seen(documents: DocumentLengths, seq_len: int) -> float:
    back = np.arange(seq_len, dtype=float)
    return float(np.dot(seq_len - back, documents.unbroken(back)) / seq_len)


def lognormal(mean: float, sigma: float) -> DocumentLengths:
    """Document lengths lognormal with mean `mean` tokens and log-length standard deviation `sigma`."""
    return DocumentLengths(DocumentsKind.LOGNORMAL, mean=mean, sigma=sigma)


def histogram(lengths, counts=None, *, source: str = "") -> DocumentLengths:
    """Document lengths as `counts` documents of each of `lengths` tokens (None: one document each)."""
    lengths = tuple(int(n) if _whole(n) else n for n in lengths)
    counts = (1,) * len(lengths) if counts is None else tuple(int(c) if _whole(c) else c for c in counts)
    return DocumentLengths(DocumentsKind.HISTOGRAM, lengths=lengths, counts=counts, source=source)


def read_histogram(path: "str | os.PathLike") -> DocumentLengths:
    """The histogram in the file `path` (its format: `HISTOGRAM_FORMAT`).

    Raises:
        CpplanError: an unreadable or oversized file, a line that is not LENGTH or LENGTH,COUNT, or no line.
    """
    file = Path(path)
    try:
        if file.stat().st_size > MAX_HISTOGRAM_BYTES:
            raise CpplanError(f"histogram {str(path)!r} is over {MAX_HISTOGRAM_BYTES >> 20} MiB; merge equal lengths.")
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise CpplanError(f"cannot read the histogram of document lengths {str(path)!r}: {err}.") from None
    lengths, counts = [], []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"(\d+)(?:\s*[,\s]\s*(\d+))?", line)
        if not match:
            raise CpplanError(f"histogram {str(path)!r} line {number}: {line[:60]!r} is not {HISTOGRAM_FORMAT}.")
        lengths.append(int(match[1]))
        counts.append(int(match[2]) if match[2] is not None else 1)
    if not lengths:
        raise CpplanError(f"histogram {str(path)!r} has no document lengths: write {HISTOGRAM_FORMAT}.")
    return histogram(lengths, counts, source=file.name)


def _tokens(n: float) -> str:
    """8192 → '8K', 1.5·2²⁰ → '1.5M', 700.4 → '700'."""
    for suffix, size in (("M", 1024**2), ("K", 1024)):
        if n >= size:
            return f"{n / size:.3g}{suffix}"
    return f"{n:.0f}"
