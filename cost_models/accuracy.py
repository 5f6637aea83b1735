"""How far the model's step times are from measured ones, per chip: the error band every
estimate carries and that `explain` uses to call close plans ties.

The figures live in `data/accuracy.json`, written by `benchmarks/bench_corpus.py` from the
public corpus (`benchmarks/public_runs.csv`: step-time MAPE of the chips with published runs) and
from the kernel checks of `benchmarks/fit_kernels.py` (attention-kernel MAPE, the only figure for
a chip without published end-to-end runs, such as TPU7x). Each entry names its source.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cost_models.errors import CpplanError

ACCURACY_FILE = Path(__file__).parent / "data" / "accuracy.json"


@dataclass(frozen=True)
class ErrorBand:
    """The model's measured relative error of a step time on one chip.

    `relative` is the band (0.12 = ±12%); `basis` says what it was measured on: `corpus` (the
    step-time MAPE over `runs` published end-to-end runs) or `kernels` (the attention kernel's
    MAPE against measured timings: a floor, as the rest of the step is unchecked there).
    """

    chip: str
    relative: float
    basis: str
    runs: int
    source: str

    def describe(self) -> str:
        """E.g. '±12.0% (step-time MAPE over 18 published v5p runs)'."""
        if self.basis == "corpus":
            return f"±{self.relative:.1%} (step-time MAPE over {self.runs} published {self.chip} runs)"
        return (f"±{self.relative:.1%} (attention-kernel MAPE over {self.runs} measured {self.chip} calls; no "
                f"published end-to-end runs, so the step's other terms are unchecked)")

    def to_dict(self) -> dict:
        return {"chip": self.chip, "relative": self.relative, "basis": self.basis, "runs": self.runs,
                "source": self.source}


@lru_cache(maxsize=1)
def _table() -> dict:
    try:
        return json.loads(ACCURACY_FILE.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CpplanError(f"cannot read the error bands {str(ACCURACY_FILE)!r} ({err}); regenerate it with "
                          "python benchmarks/bench_corpus.py.") from None


def error_band(chip: str) -> ErrorBand | None:
    """The measured error band of `chip`'s step times: the corpus MAPE where published runs exist,
    else the kernel checks' MAPE; None for a chip measured neither way (e.g. a calibrated host).

    Raises:
        CpplanError: the accuracy file is unreadable.
    """
    entry = _table()["chips"].get(chip)
    if entry is None:
        return None
    corpus, kernels = entry.get("corpus"), entry.get("kernels")
    if corpus:
        return ErrorBand(chip, corpus["step_time_mape"], "corpus", corpus["runs"], corpus["source"])
    if kernels:
        return ErrorBand(chip, kernels["mape"], "kernels", kernels["calls"], kernels["source"])
    return None
