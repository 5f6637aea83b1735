"""MaxText 0.2.5's deviceless compiles of llama3.1-8b with the whole mesh on the context axes (the
anchors: their flags and compiled HBM per device, as `ANCHORS` lists them), read as `cpplan import`
reads their flags and priced by the MaxText target."""

import pytest

from cost_models.topology import get_topology
from cost_models.units import GiB
from planner.maxtext import read_maxtext
from validation.anchors import ANCHORS, TOLERANCE, reprice

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
    assert row["ok"] and abs(row["ratio"] - 1) <= TOLERANCE, row
    assert row["priced_fits"] == anchor.fits or row["priced_marginal"], row


def test_out_of_memory_figures_are_gib_as_their_verdicts_need():
    # MaxText's error writes GiB as "G" (it gives v5p's HBM as "95.73G"): read as GiB, every figure of
    # a compile that did not fit exceeds its device's HBM; read as 10^9 bytes, tpu7x's "95.9 G > 94.7 G"
    # would be 89.3 GiB, which fits
    refused = [a for a in ANCHORS if not a.fits]
    assert refused
    for anchor in refused:
        capacity = get_topology(anchor.topology).hbm_bytes_per_device
        assert anchor.compiled_gib * GiB > capacity, anchor.name
    assert any(a.compiled_gib * 1e9 <= get_topology(a.topology).hbm_bytes_per_device for a in refused)
