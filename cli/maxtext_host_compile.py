"""MaxText 0.2.5's ahead-of-time compile (`train_compile`) aimed at this host's own devices.

`cpplan run --engine maxtext` runs this file, by its path, in MaxText's Python to pre-flight a plan
for a `cpu:N` topology: train_compile compiles for the slices named in MaxText's accelerator map
(`maxtext/utils/accelerator_to_spec_map.py`: TPU and GPU names only) and asserts `compile_topology`
is set, so here its `main` runs with the target mesh made of the devices jax sees instead. Everything
else is train_compile's own: the shaped train state, the jitted `train_step`, and the lines it prints,
`Memory analysis: CompiledMemoryStats(...)` among them. It imports nothing of cpplan's (MaxText's
Python need not have cpplan installed).

    python cli/maxtext_host_compile.py CONFIG.yml [key=value ...]
"""

import jax
from absl import app
from jax.sharding import AxisType, Mesh
from maxtext.common.common_types import ShardMode
from maxtext.trainers.pre_train import train_compile
from maxtext.utils import maxtext_utils


def host_mesh(config) -> Mesh:
    """The config's mesh over the devices of this process, typed as train_compile types its target's."""
    jax.config.update("jax_remove_size_one_mesh_axis_from_type", config.remove_size_one_mesh_axis_from_type)
    devices = maxtext_utils.create_device_mesh(config, jax.devices())
    kind = AxisType.Explicit if config.shard_mode == ShardMode.EXPLICIT else AxisType.Auto
    return Mesh(devices, config.mesh_axes, axis_types=(kind,) * len(config.mesh_axes))


def no_topology_needed(config) -> None:
    """train_compile's check that a target slice is named: the host's devices are the target here."""


if __name__ == "__main__":
    train_compile.get_topology_mesh = host_mesh
    train_compile.validate_config = no_topology_needed
    app.run(train_compile.main)
