"""shared/ANCHORS.md's MaxText compiles, read as `cpplan import` reads their flags and priced by the MaxText target."""
import pytest

from benchmarks.reprice_anchors import ANCHORS, TOLERANCE, reprice
from planner.maxtext import read_maxtext

pytestmark = pytest.mark.pure


@pytest.mark.parametrize("anchor", ANCHORS, ids=lambda a: a.name)
def test_every_anchor_is_read_whole_and_priced_within_tolerance_with_its_verdict(anchor):
    found = read_maxtext(anchor.flags())
    # the whole mesh is the context axes, one sequence per step
    assert found.plan.global_batch == 1
    mesh = found.plan.mesh_dict
    assert mesh["context"] * mesh["context_ulysses"] == found.plan.topology_spec.num_devices
    assert set(found.unread) <= {"dataset_type"}
    row = reprice(anchor)
    assert abs(row["ratio"] - 1) <= TOLERANCE and row["priced_fits"] == anchor.fits, row


def test_an_out_of_memory_figure_is_read_in_gib_as_the_whole_step():
    # MaxText's error writes GiB as "G" (it gives v5p's HBM as "95.73G"): 189 G is 189 GiB, not 176
    ring_512k = next(a for a in ANCHORS if a.name == "v5p-16 ring 8 × 512K")
    assert reprice(ring_512k)["compiled_gib"] == 189.0
