"""Packed rows for tests: segment ids of rows cut from a stream of documents of varying length, as
cpplan's packer cuts them (the price's tests count tiles on them, the runtime's prune tables by them)."""

import numpy as np


def packed_ids(documents, *, rows: int, length: int, seed: int) -> np.ndarray:
    """`[rows, length]` segment ids of rows cut at random offsets from a stream of documents drawn from
    `documents`, numbered as cpplan's packer numbers them (from 1 at each row's first token)."""
    rng = np.random.default_rng(seed)
    if documents.kind == "histogram":
        p = np.asarray(documents.counts) / sum(documents.counts)
        lengths = rng.choice(documents.lengths, size=4 * length, p=p)
    else:
        mu = np.log(documents.mean) - documents.sigma**2 / 2
        lengths = np.maximum(1, np.round(rng.lognormal(mu, documents.sigma, size=4 * length))).astype(int)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    offsets = rng.integers(0, starts[-1] - length, size=rows)[:, None] + np.arange(length)
    ids = np.searchsorted(starts, offsets, side="right")
    return ids - ids[:, :1] + 1
