"""The placement picture's groups are the runtime's: for plans on v5p, TPU7x (two cores a chip) and
two slices over DCN, each axis's groups, device by device and in rank order, as the HTML report draws
them (from the planner's segments) equal those of the mesh `runtime.mesh.build_mesh` builds over the
slice's abstract TPU devices (placed by their torus coordinates)."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("libtpu")

import planner  # noqa: E402
from cost_models.vocabulary import AXES  # noqa: E402
from runtime.compile import tpu_devices  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from validation.html_report.torus import axis_groups  # noqa: E402

pytestmark = pytest.mark.tpu_compile

CASES = [
    ("4M", "v5p-256", {}),
    ("1M", "tpu7x-128", {}),
    ("1M", "v5p-128", {"num_slices": 2}),
    ("128k", "v5p-16", {"num_slices": 4}),
    ("256k", "tpu7x:2x2x4", {}),
]


def where(device, topo) -> tuple:
    """A device's place as the picture indexes it: (slice, x, y, z[, core])."""
    core = (device.core_on_chip,) if topo.devices_per_chip > 1 else ()
    return (getattr(device, "slice_index", 0) or 0, *device.coords[: len(topo.chip_dims)], *core)


def pictured(plan) -> dict[str, set]:
    """Each axis's groups as the picture draws them: tuples of device places in rank order."""
    out = {}
    for axis, (group, rank) in axis_groups(plan).items():
        places = {g: [None] * plan.axis_size(axis) for g in range(group.max() + 1)}
        for index in np.ndindex(group.shape):
            places[group[index]][rank[index]] = index
        out[axis] = {tuple(p) for p in places.values()}
    return out


def built(plan) -> dict[str, set]:
    """Each axis's groups in the runtime's mesh: rows of its device array along the axis."""
    topo, devices = plan.topology_spec, build_mesh(plan, tpu_devices(plan)).devices
    out = {}
    for k, axis in enumerate(AXES):
        if devices.shape[k] > 1:
            rows = np.moveaxis(devices, k, -1).reshape(-1, devices.shape[k])
            out[axis] = {tuple(where(d, topo) for d in row) for row in rows}
    return out


@pytest.mark.parametrize("seq_len, topology, options", CASES)
def test_the_pictured_groups_are_the_runtime_mesh(seq_len, topology, options):
    ranked = planner.explain("llama3.1-8b", seq_len, topology, **options).result.ranked
    # the choice and the best plan of each other axis order and placement among the first 30
    plans = list({(r.plan.axis_order, r.plan.physical_order, r.plan.mesh): r.plan for r in ranked[:30]}.values())
    for plan in plans[:6]:
        assert pictured(plan) == built(plan), (plan.mesh_dict, plan.axis_order, plan.physical_order)
