"""How much of each collective family XLA's TPU compiler overlaps with compute in cpplan's step.

Read from `data/overlap.json` (`regenerate/fit_overlap.py`, from deviceless compiles): per chip and
family, the fraction of bytes asynchronous with work scheduled between start and done; a ring's is its
collective-permutes'. A chip or family without compiled data takes the row's `comm_overlaps_compute`:
all or nothing (docs/provenance/cost_models.md#overlap).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from cost_models.errors import CpplanError

FAMILIES = ("fsdp_all_gather", "fsdp_reduce_scatter", "tensor", "data_all_reduce", "embedding")
RING_KIND = "collective-permute"  # the collective a ring's hops are


@dataclass(frozen=True)
class Overlap:
    """Fractions (0–1) of each family's bytes the compiler overlaps with compute, for one chip: `families`
    by family (`FAMILIES`), `context` by strategy name; `source` says where they come from."""

    families: dict[str, float]
    context: dict[str, float]
    source: str

    def of(self, family: str) -> float:
        return self.families[family]

    def of_context(self, strategy: str) -> float:
        return self.context[strategy]


@lru_cache(maxsize=1)
def _data() -> dict:
    text = resources.files("cost_models").joinpath("data/overlap.json").read_text()
    return json.loads(text)


def overlap_for(chip_name: str, *, assumed_overlap: bool) -> Overlap:
    """The overlap fractions of a chip; `assumed_overlap` (the row's `comm_overlaps_compute`) fills in
    where the file has no figure.

    Raises:
        CpplanError: the data file has a fraction outside 0–1 (a broken regeneration).
    """
    from cost_models.strategies import STRATEGIES

    fallback = 1.0 if assumed_overlap else 0.0
    rows = _data()["chips"].get(chip_name)
    names = [spec.name for spec in STRATEGIES.values()]
    if rows is None:
        return Overlap(
            {f: fallback for f in FAMILIES},
            {n: fallback for n in names},
            f"assumed: {chip_name} row's comm_overlaps_compute={assumed_overlap} (no compiled data)",
        )

    def fraction(key: str, kind: str | None = None) -> float:
        row = rows.get(key)
        if row is not None and kind is not None:
            row = row.get("by_kind", {}).get(kind)
        if row is None:
            return fallback
        value = float(row["overlapped_fraction"])
        if not 0.0 <= value <= 1.0:
            raise CpplanError(
                f"cost_models/data/overlap.json: {chip_name} {key} overlapped_fraction={value} is not "
                f"within 0–1; regenerate it with regenerate/fit_overlap.py."
            )
        return value

    context = {
        spec.name: fraction(f"context:{spec.name}", RING_KIND if spec.hides_traffic_behind_attention else None)
        for spec in STRATEGIES.values()
    }
    made = _data()["provenance"][chip_name]
    return Overlap(
        {f: fraction(f) for f in FAMILIES},
        context,
        f"compiled: {_data()['source']}; {chip_name}: compiler flags {made['compiler_flags']}, libtpu "
        f"{made['libtpu']} ({made['date']})",
    )
