"""The memory price's measured error per chip: measured against what each stored compile needs, and
the stored table is the one the stored compiles give today."""

import json

import pytest

from cost_models.accuracy import MEMORY_ACCURACY_FILE
from cost_models.units import MiB
from validation.memory_bands import memory_bands, needed_bytes

pytestmark = pytest.mark.pure


def test_a_step_needs_the_least_cap_it_compiled_under_where_one_was_found():
    row = {"compiled_bytes": 80 * 1024 * MiB}
    assert needed_bytes(row) == 80 * 1024 * MiB
    least = {"cap_mib": 61558, "failed_cap_mib": 61080, "compiled_bytes": 63 * 1024 * MiB, "verified": True}
    assert needed_bytes({**row, "least_hbm": least}) == 61558 * MiB
    # a bisection whose probes ran out before a cap compiled found nothing: the unconstrained figure stands
    assert needed_bytes({**row, "least_hbm": {**least, "verified": False}}) == 80 * 1024 * MiB


def test_the_stored_bands_are_what_the_stored_compiles_give_today():
    stored = json.loads(MEMORY_ACCURACY_FILE.read_text())
    now = memory_bands()
    assert stored.keys() == now.keys()
    for target, chips in now.items():
        assert stored[target].keys() == chips.keys()
        for chip, band in chips.items():
            assert stored[target][chip]["rows"] == band["rows"]
            for side in ("under", "over", "allocated"):
                assert stored[target][chip][side] == pytest.approx(band[side], abs=1e-9), (
                    f"{target} {chip} {side}: run python regenerate/memory_bands.py"
                )


def test_a_chip_with_few_compiles_takes_the_largest_of_any_chip_each_way():
    """MaxText on v6e has one compile (a published run's flags): too few for a band of its own, so each
    side is the largest measured on any chip, its own included."""
    from cost_models.accuracy import MEMORY_BAND_MIN_ROWS, memory_band

    stored = json.loads(MEMORY_ACCURACY_FILE.read_text())["maxtext"]
    assert stored["v6e"]["rows"] < MEMORY_BAND_MIN_ROWS <= stored["v5p"]["rows"]
    band = memory_band("v6e", "maxtext")
    assert band.under == max(e["under"] for e in stored.values()) > stored["v6e"]["under"]
    assert band.over == max(e["over"] for e in stored.values()) == stored["v6e"]["over"]
    assert band.allocated == max(e["allocated"] for e in stored.values())
    assert memory_band("v5p", "maxtext").over == stored["v5p"]["over"]
