"""How far the model's step times are from measured ones, per chip and regime: the error band every
estimate carries and that `explain` uses to call close plans ties. Plans without context parallelism
take the public corpus's step-time MAPE, context-parallel plans the CP test set's, a chip without
published runs the attention kernel's MAPE. A plan in a regime priced worse (over several slices, with
experts) takes that regime's MAPE where larger, and a sequence longer than any published run of its chip
the largest error its chip's runs showed: a wider band where fewer measurements stand behind the price.
`benchmarks/bench_corpus.py` writes the figures, each naming its source, to `data/accuracy.json`."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cost_models.errors import CpplanError

ACCURACY_FILE = Path(__file__).parent / "data" / "accuracy.json"
MEMORY_ACCURACY_FILE = Path(__file__).parent / "data" / "memory_accuracy.json"


@dataclass(frozen=True)
class ErrorBand:
    """The model's measured relative error of a step time on one chip, in one regime.

    Attributes:
        relative: the band (0.12 = ±12%).
        basis: `corpus` (step-time MAPE over published runs without context parallelism), `cp_corpus`
            (over published context-parallel runs) or `kernels` (the attention kernel's MAPE: a floor).
        runs: the runs (or kernel calls) it was measured over.
        source: where the figure was written from.
        context_parallel: the regime asked for: a plan that splits the sequence.
        widened: why the band is wider than its basis's MAPE, one phrase a reason.
    """

    chip: str
    relative: float
    basis: str
    runs: int
    source: str
    context_parallel: bool = False
    widened: tuple[str, ...] = ()

    @property
    def regime(self) -> str:
        return "context-parallel" if self.context_parallel else "no context parallelism"

    def describe(self) -> str:
        """E.g. '±7.8% (context-parallel plans: step-time MAPE over 30 published context-parallel v5p runs)'."""
        unchecked = (
            "; no published context-parallel runs on this chip, so the context-parallel terms are unchecked"
            if self.context_parallel and self.basis != "cp_corpus"
            else ""
        )
        if self.basis == "cp_corpus":
            how = f"step-time MAPE over {self.runs} published context-parallel {self.chip} runs"
        elif self.basis == "corpus":
            how = f"step-time MAPE over {self.runs} published {self.chip} runs without context parallelism"
        else:
            how = (
                f"attention-kernel MAPE over {self.runs} measured {self.chip} calls; no published end-to-end "
                f"runs, so the step's other terms are unchecked"
            )
        wider = "".join(f"; widened to ±{self.relative:.1%}: {why}" for why in self.widened[-1:])
        earlier = "".join(f"; {why}" for why in self.widened[:-1])
        return f"±{self.relative:.1%} ({self.regime} plans: {how}{unchecked}{earlier}{wider})"

    def to_dict(self) -> dict:
        return {
            "chip": self.chip,
            "relative": self.relative,
            "basis": self.basis,
            "runs": self.runs,
            "source": self.source,
            "regime": self.regime,
            "widened": list(self.widened),
        }


@lru_cache(maxsize=2)
def _read(path: Path, what: str, regenerator: str) -> dict:
    """A data file of measured errors, read once; unreadable, it says which script writes it."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CpplanError(
            f"cannot read the {what} {str(path)!r} ({err}); regenerate it with python {regenerator}."
        ) from None


def _table() -> dict:
    return _read(ACCURACY_FILE, "error bands", "benchmarks/bench_corpus.py")


def error_band(
    chip: str,
    *,
    context_parallel: bool,
    num_slices: int = 1,
    experts: bool = False,
    seq_len: int = 0,
    runtime: bool = False,
) -> ErrorBand | None:
    """The measured error band of `chip`'s step times in a regime: for context-parallel plans the CP test
    set's MAPE where the chip has CP runs, else the corpus MAPE, else the kernel checks'; None for a chip
    measured none of these ways (e.g. a calibrated host). Then widened where the plan runs over
    `num_slices` > 1 or with `experts` (those published runs' MAPE, over every chip, where larger); for
    cpplan's `runtime` (the published runs are MaxText's), by its own measured MAPE on the chip where larger,
    and where it was never measured on the chip, to the largest error of the basis's runs (its own terms are
    unchecked there); and to that largest error too at a `seq_len` beyond its chip's longest published run
    (or, for the runtime, its longest timed plan).

    Raises:
        CpplanError: the accuracy file is unreadable.
    """
    table = _table()
    entry = table["chips"].get(chip)
    if entry is None:
        return None
    cp, corpus, kernels = entry.get("cp_corpus"), entry.get("corpus"), entry.get("kernels")
    if context_parallel and cp:
        band, basis = ErrorBand(chip, cp["step_time_mape"], "cp_corpus", cp["runs"], cp["source"], True), cp
    elif corpus:
        band, basis = (
            ErrorBand(chip, corpus["step_time_mape"], "corpus", corpus["runs"], corpus["source"], context_parallel),
            corpus,
        )
    elif kernels:
        band, basis = (
            ErrorBand(chip, kernels["mape"], "kernels", kernels["calls"], kernels["source"], context_parallel),
            None,
        )
    else:
        return None
    regimes = table.get("regimes", {})
    for name, applies in (("multislice", num_slices > 1), ("experts", experts)):
        regime = regimes.get(name)
        if applies and regime and regime["step_time_mape"] > band.relative:
            reason = f"{regime['what']}: MAPE over {regime['runs']} published runs"
            band = _widened(band, regime["step_time_mape"], reason)
    measured = entry.get("runtime")
    if runtime and measured and measured["step_time_mape"] > band.relative:
        reason = f"cpplan's runtime: MAPE over {measured['runs']} plans timed on the chip"
        band = _widened(band, measured["step_time_mape"], reason)
    elif runtime and not measured and basis is not None and basis["max_abs_error"] > band.relative:
        band = _widened(
            band,
            basis["max_abs_error"],
            f"cpplan's runtime was never timed on {chip} (the published runs are MaxText's), so its own terms are "
            f"unchecked and the largest error of those runs stands",
        )
    longest = max(entry.get("longest_seq_len", 0), measured.get("longest_seq_len", 0) if runtime and measured else 0)
    if seq_len > longest and basis is not None and basis["max_abs_error"] > band.relative:
        reason = (
            f"no published {chip} run is {seq_len:,} tokens long (longest {longest:,}), so the largest error of "
            f"its runs stands"
            if longest
            else f"no published {chip} run gives its sequence length, so the largest error of its runs stands"
        )
        band = _widened(band, basis["max_abs_error"], reason)
    return band


def _widened(band: ErrorBand, relative: float, why: str) -> ErrorBand:
    return dataclasses.replace(band, relative=relative, widened=(*band.widened, why))


@dataclass(frozen=True)
class MemoryBand:
    """How far the HBM the compiler needed has been from the memory price, at most, each way, on one
    chip for one target (`regenerate/memory_bands.py` measures it over stored compiles).

    Attributes:
        under: the compiler's largest excess, as a fraction of the price (0.07: it needed up to 7% more).
        over: the price's largest excess, as a fraction of what the compiler needed (0.05: the price
            said up to 5% more).
        allocated: what a compile given the whole HBM has allocated beyond the price at most, as a fraction
            of the price: `under` and the heap's gaps, which the compiler packs away when short of room.
        rows: the compiles it was measured over.
        source: where they are.
    """

    chip: str
    target: str
    under: float
    over: float
    allocated: float
    rows: int
    source: str

    def describe(self) -> str:
        return (
            f"the compiler has needed up to {self.under:.1%} more and up to {self.over:.1%} less than priced over "
            f"{self.rows} {self.chip} compiles ({self.target} target)"
        )


def _memory_table() -> dict:
    return _read(MEMORY_ACCURACY_FILE, "memory bands", "regenerate/memory_bands.py")


# a chip's own band needs this many compiles; with fewer, each side is the larger of its own and the
# largest measured on any chip (one compile says little about how far the price can be off)
MEMORY_BAND_MIN_ROWS = 3


def memory_band(chip: str, target: str) -> MemoryBand | None:
    """The memory price's measured error on `chip` for `target` ("cpplan" or "maxtext"); where fewer than
    `MEMORY_BAND_MIN_ROWS` compiles of that chip were measured, each side the largest measured on any
    chip where that is larger; None with no data at all.

    Raises:
        CpplanError: the memory accuracy file is unreadable.
    """
    chips = _memory_table().get(target, {})
    entry = chips.get(chip)
    if entry is not None and entry["rows"] >= MEMORY_BAND_MIN_ROWS:
        return MemoryBand(
            chip, target, entry["under"], entry["over"], entry["allocated"], entry["rows"], entry["source"]
        )
    if not chips:
        return None
    under, over, allocated = (
        max(chips.items(), key=lambda item: item[1][side]) for side in ("under", "over", "allocated")
    )
    named = (under[0], over[0], allocated[0], *([chip] if entry else []))
    used = {name: chips[name] for name in dict.fromkeys(named)}
    return MemoryBand(
        chip,
        target,
        under[1]["under"],
        over[1]["over"],
        allocated[1]["allocated"],
        sum(e["rows"] for e in used.values()),
        "; ".join(f"{name}'s: {e['source']}" for name, e in used.items()) + " (the largest each way standing in)",
    )


def memory_margins(chip: str, target: str) -> tuple[float, float]:
    """(under, over): the fractions around the HBM capacity within which an estimate's fit, or its misfit,
    is not sure (`memory_band`'s; 0 with no data)."""
    band = memory_band(chip, target)
    return (band.under, band.over) if band else (0.0, 0.0)
