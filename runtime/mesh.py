"""The device mesh of a plan: devices laid out in the plan's physical order, cut into named axes.

The physical grid (x, y, z[, core]: TPU devices by torus coordinates, CPU devices in list order) is
transposed to `plan.physical_order`, reshaped to `plan.axis_order`'s sizes and transposed to `AXES`,
the layout the planner priced. Slices are the outer part of data and fsdp, as in MaxText's meshes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jax.sharding import Mesh

from cost_models.errors import CpplanError
from cost_models.vocabulary import AXES
from planner.plan import Plan


def device_grid(plan: Plan, devices: Sequence) -> np.ndarray:
    """The devices shaped by the topology's physical dimensions; over several slices, one grid per
    slice, stacked first in the slice order of jax's `create_hybrid_device_mesh`.

    Raises:
        CpplanError: the devices are not those of the plan's topology.
    """
    topo = plan.topology_spec
    dims = topo.physical_dims
    if len(devices) != topo.num_devices:
        raise CpplanError(
            f"plan is for {topo.name} ({topo.num_devices} devices) but {len(devices)} devices are "
            f"present; plan for the devices you have, or on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={topo.num_devices} before importing jax."
        )
    kind = topo.chip.kind
    platform = devices[0].platform
    if platform != kind.jax_platform:
        raise CpplanError(
            f"plan is for {topo.name} ({kind.jax_platform} devices) but the devices are {platform} "
            f"devices; plan for {'cpu:' + str(len(devices)) if platform == 'cpu' else 'the slice'} "
            f"instead."
        )
    if not kind.has_torus:  # no coordinates to place by: the devices in list order
        return np.array(list(devices), dtype=object).reshape([d.size for d in dims])
    if topo.num_slices == 1:
        return _slice_grid(plan, devices)
    from jax.experimental import mesh_utils

    try:
        by_slice = mesh_utils.create_hybrid_device_mesh(
            [topo.devices_per_slice], [topo.num_slices], devices, allow_split_physical_axes=True
        )
    except ValueError as err:
        raise CpplanError(f"the {len(devices)} devices do not form {topo.name}: {err}") from None
    return np.stack([_slice_grid(plan, list(one)) for one in by_slice.reshape(topo.num_slices, topo.devices_per_slice)])


def _slice_grid(plan: Plan, devices: Sequence) -> np.ndarray:
    """One slice's TPU devices placed by their torus coordinates and core index."""
    topo = plan.topology_spec
    dims = topo.physical_dims
    grid = np.empty([d.size for d in dims], dtype=object)
    chip_rank = len(topo.chip_dims)
    for dev in devices:
        index = tuple(dev.coords[:chip_rank])
        if topo.devices_per_chip > 1:
            index += (dev.core_on_chip,)
        if any(i >= s for i, s in zip(index, grid.shape)) or grid[index] is not None:
            raise CpplanError(
                f"device {dev} (coords {dev.coords}) does not fit {topo.name}; plan for the slice these devices form."
            )
        grid[index] = dev
    return grid


def build_mesh(plan: Plan, devices: Sequence | None = None) -> Mesh:
    """The plan's mesh, axes `AXES`, over `devices` (default: all of jax's; or abstract TPU devices).

    Raises:
        CpplanError: the devices do not match the plan's topology.
    """
    if devices is None:
        import jax

        devices = jax.devices()
    grid = device_grid(plan, list(devices))
    if plan.num_slices == 1:
        return Mesh(_slice_mesh(plan, grid), AXES)
    # slice s is (s // dcn_fsdp, s % dcn_fsdp) on the DCN part of (data, fsdp); per axis the DCN
    # index is the outer digit of the mesh index
    dcn_shape = [plan.dcn_data, plan.dcn_fsdp] + [1] * (len(AXES) - 2)
    meshes = [_slice_mesh(plan, one) for one in grid]
    slices = np.stack(meshes).reshape(dcn_shape + list(meshes[0].shape))
    interleaved = slices.transpose([i for k in range(len(AXES)) for i in (k, len(AXES) + k)])
    return Mesh(interleaved.reshape([plan.axis_size(a) for a in AXES]), AXES)


def _slice_mesh(plan: Plan, grid: np.ndarray) -> np.ndarray:
    """One slice's device grid as the plan's mesh within it, axes in `AXES` order."""
    names = [d.name for d in plan.topology_spec.physical_dims]
    grid = grid.transpose([names.index(n) for n in plan.physical_order])
    sizes = plan.ici_mesh_dict
    logical = grid.reshape(-1).reshape([sizes[a] for a in plan.axis_order])
    return logical.transpose([plan.axis_order.index(a) for a in AXES])
