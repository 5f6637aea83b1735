"""The figures a validation reports: error, rank agreement, and the planner's regret."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Mean absolute percentage error of predictions against measurements (0.1 = 10%)."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    if len(p) == 0:
        return float("nan")
    return float(np.mean(np.abs(p - m) / m))


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), float)
    ranks[order] = np.arange(1, len(values) + 1)
    for v in np.unique(values):
        tied = values == v
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson correlation of the ranks, ties averaged)."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    if len(p) < 2:
        return float("nan")
    rp, rm = _ranks(p), _ranks(m)
    if rp.std() == 0 or rm.std() == 0:
        return float("nan")
    return float(np.corrcoef(rp, rm)[0, 1])


def regret(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Measured time of the plan predicted fastest ÷ the best measured time (1.0 = no regret)."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    if len(p) == 0:
        return float("nan")
    return float(m[int(np.argmin(p))] / m.min())
