"""The figures a validation reports: error, rank agreement, and the planner's regret."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Mean absolute percentage error of predictions against measurements.

    Args:
        predicted: predicted values.
        measured: measured values, in the same order.
    Returns:
        The mean of |predicted − measured| / measured (0.1 = 10%); NaN when there are none.
    """
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    if len(p) == 0:
        return float("nan")
    return float(np.mean(np.abs(p - m) / m))


def spearman(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Spearman rank correlation (ties share their average rank).

    Args:
        predicted: predicted values.
        measured: measured values, in the same order.
    Returns:
        The correlation in [−1, 1]; NaN with fewer than two points or when one side is constant.
    """
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    if len(p) < 2 or np.ptp(p) == 0 or np.ptp(m) == 0:
        return float("nan")
    return float(stats.spearmanr(p, m).statistic)


def regret(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """How much slower the plan predicted fastest ran than the fastest measured plan.

    Args:
        predicted: predicted step times of some plans.
        measured: their measured step times, in the same order.
    Returns:
        The measured time of the plan predicted fastest ÷ the best measured time (1.0 = no
        regret; a single plan has regret 1.0 by definition); NaN when there are none.
    """
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    if len(p) == 0:
        return float("nan")
    return float(m[int(np.argmin(p))] / m.min())
