"""The device mesh of a plan: devices laid on the plan's physical order, cut into named axes.

The topology's devices form a grid shaped by its physical dimensions in natural order
(x, y, z[, core]) — TPU devices placed by their torus coordinates and core index, CPU devices
in list order. The grid is transposed to `plan.physical_order`, flattened, reshaped to the axis
sizes in `plan.axis_order`, and transposed to the canonical `AXES` order: the layout the planner
priced (`Plan.segments()`).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jax.sharding import Mesh

from cost_models.errors import CpplanError
from cost_models.vocabulary import AXES
from planner.plan import Plan


def device_grid(plan: Plan, devices: Sequence) -> np.ndarray:
    """The devices as an array shaped by the topology's physical dimensions (natural order).

    Raises:
        CpplanError: the devices are not those of the plan's topology.
    """
    topo = plan.topology_spec
    dims = topo.physical_dims
    if len(devices) != topo.num_devices:
        raise CpplanError(f"plan is for {topo.name} ({topo.num_devices} devices) but {len(devices)} devices are "
                          f"present; plan for the devices you have, or on CPU set "
                          f"XLA_FLAGS=--xla_force_host_platform_device_count={topo.num_devices} before importing jax.")
    kind = topo.chip.kind
    platform = devices[0].platform
    if platform != kind.jax_platform:
        raise CpplanError(f"plan is for {topo.name} ({kind.jax_platform} devices) but the devices are {platform} "
                          f"devices; plan for {'cpu:' + str(len(devices)) if platform == 'cpu' else 'the slice'} "
                          f"instead.")
    if not kind.has_torus:  # no coordinates to place by: the devices in list order
        return np.array(list(devices), dtype=object).reshape([d.size for d in dims])
    grid = np.empty([d.size for d in dims], dtype=object)
    chip_rank = len(topo.chip_dims)
    for dev in devices:
        index = tuple(dev.coords[:chip_rank])
        if topo.devices_per_chip > 1:
            index += (dev.core_on_chip,)
        if any(i >= s for i, s in zip(index, grid.shape)) or grid[index] is not None:
            raise CpplanError(f"device {dev} (coords {dev.coords}) does not fit {topo.name}; "
                              f"plan for the slice these devices form.")
        grid[index] = dev
    return grid


def build_mesh(plan: Plan, devices: Sequence | None = None) -> Mesh:
    """The plan's mesh over `devices` (default: all of jax's devices).

    Args:
        plan: the plan; its topology must be the devices'.
        devices: the devices, e.g. abstract TPU devices for deviceless compilation.
    Returns:
        A `Mesh` with axes `AXES` and the plan's sizes.
    Raises:
        CpplanError: the devices do not match the plan's topology.
    """
    if devices is None:
        import jax

        devices = jax.devices()
    grid = device_grid(plan, list(devices))
    names = [d.name for d in plan.topology_spec.physical_dims]
    grid = grid.transpose([names.index(n) for n in plan.physical_order])
    sizes = plan.mesh_dict
    logical = grid.reshape(-1).reshape([sizes[a] for a in plan.axis_order])
    logical = logical.transpose([plan.axis_order.index(a) for a in AXES])
    return Mesh(logical, AXES)
