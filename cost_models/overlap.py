"""How much of each collective family XLA's TPU compiler overlaps with compute in cpplan's step.

Read from `cost_models/data/overlap.json`, which `benchmarks/fit_overlap.py` writes from the
scheduled programs of deviceless compiles with the compiler flags cpplan's runtime uses on each
chip (see that file's `source`, `derived` and per-chip `provenance`): per chip and family, the
fraction of the family's bytes that are asynchronous with matmul or kernel work scheduled between
start and done. The price hides at most that fraction of a family behind compute; the rest the
step waits for.

A strategy whose spec hides its transfers behind attention (ring, USP) hides its ring's
collective-permutes: its fraction is theirs; any other strategy's is that of all its traffic.

A chip with no compiled data (a host) falls back on its row's `comm_overlaps_compute`
assumption: every family overlappable where it is true (the ring's hops as its spec says, FSDP
traffic within a layer's compute), none where it is false. A family a chip's compiles never made
takes the same fallback: the data-parallel all-reduce everywhere (the compiles keep data = 1),
and the context families on v5e and v6e (only their representative layer without context
parallelism is compiled).
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
    """Fractions (0–1) of each family's bytes the compiler overlaps with compute, for one chip.

    Attributes:
        families: family (`FAMILIES`) → fraction.
        context: strategy name → fraction of its own context traffic.
        source: where the figures come from (the data file, or the chip row's assumption).
    """

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
    """The overlap fractions of a chip.

    Args:
        chip_name: the chip row's name (e.g. ``v5p``).
        assumed_overlap: the row's `comm_overlaps_compute`, used where the file has no figure.
    Returns:
        Its `Overlap`.
    Raises:
        CpplanError: the data file has a fraction outside 0–1 (a broken regeneration).
    """
    from cost_models.strategies import STRATEGIES

    fallback = 1.0 if assumed_overlap else 0.0
    rows = _data()["chips"].get(chip_name)
    names = [spec.name for spec in STRATEGIES.values()]
    if rows is None:
        return Overlap({f: fallback for f in FAMILIES}, {n: fallback for n in names},
                       f"assumed: {chip_name} row's comm_overlaps_compute={assumed_overlap} (no compiled data)")

    def fraction(key: str, kind: str | None = None) -> float:
        row = rows.get(key)
        if row is not None and kind is not None:
            row = row.get("by_kind", {}).get(kind)
        if row is None:
            return fallback
        value = float(row["overlapped_fraction"])
        if not 0.0 <= value <= 1.0:
            raise CpplanError(f"cost_models/data/overlap.json: {chip_name} {key} overlapped_fraction={value} is not "
                              f"within 0–1; regenerate it with benchmarks/fit_overlap.py.")
        return value

    context = {spec.name: fraction(f"context:{spec.name}", RING_KIND if spec.hides_traffic_behind_attention else None)
               for spec in STRATEGIES.values()}
    made = _data()["provenance"][chip_name]
    return Overlap({f: fraction(f) for f in FAMILIES}, context,
                   f"compiled: {_data()['source']}; {chip_name}: compiler flags {made['compiler_flags']}, libtpu "
                   f"{made['libtpu']} ({made['date']})")
