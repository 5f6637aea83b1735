"""What a command needs of the machine before it starts: virtual host devices, the deviceless
TPU compiler, jax itself, readable data, and the devices a measurement runs on."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cost_models.chips import CHIP_DIR_ENV, measured_here
from cost_models.errors import CpplanError
from cost_models.topology import get_topology

RUNTIME_HINT = "install the runtime with pip install -e '.[runtime]'"


def use_host_devices(topology: str, *, processes: int = 1) -> None:
    """For a topology of a host's virtual devices (`cpu:N`), asks XLA for N of them, or for
    N / P in each of P processes that share them.

    Must run before jax is imported; a topology of real devices (a TPU slice) is left alone.
    """
    topo = get_topology(topology)
    if not topo.chip.kind.shares_cores:
        return
    if topo.num_devices % processes:
        raise CpplanError(
            f"{topo.name} has {topo.num_devices} devices, which do not split over {processes} processes; "
            f"give a device count that is a multiple of --num-processes."
        )
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        count = topo.num_devices // processes
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
    os.environ.setdefault("JAX_PLATFORMS", topo.chip.kind.jax_platform)


def use_deviceless_tpu() -> None:
    """Sets up compiling for abstract TPU devices: no TPU runtime, and libtpu told that this
    process is its only worker, so that on a host it does not print errors looking for others.

    Must run before jax is imported; values already set (on a TPU VM) are kept.
    """
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


def import_runtime() -> None:
    """Imports jax, or says how to install it."""
    try:
        import jax  # noqa: F401
    except ImportError as err:
        raise CpplanError(f"this command needs the jax runtime ({err}); {RUNTIME_HINT}.") from None


def check_data(path: str | None) -> None:
    """Refuses, before any work, --data that cannot be read: a file, or a glob of ArrayRecord shards."""
    if path is None or path == "synthetic":
        return
    import glob

    files = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
    if not files or not all(os.path.isfile(f) and os.access(f, os.R_OK) for f in files):
        raise CpplanError(
            f"--data {path!r} is not a readable file (or a glob of readable ArrayRecord shards); give a "
            f"token file (.npy, raw with --data-dtype, .array_record) or a text file, or leave --data out "
            f"for synthetic tokens."
        )


def check_devices(topo, command: str, *, scoped_vmem_kib: int | None = None) -> None:
    """Starts jax's backend with the chip's TPU compiler flags (as `cpplan run` sets them), and
    `scoped_vmem_kib` of scoped VMEM for every compile where given; refuses, before any work, a topology
    whose devices this process does not have."""
    from runtime.launch import use_tpu_compiler_flags

    use_tpu_compiler_flags(topo.chip, scoped_vmem_kib)
    import_runtime()
    import jax

    devices = jax.devices()
    platform = topo.chip.kind.jax_platform
    if devices[0].platform != platform or len(devices) < topo.num_devices:
        raise CpplanError(
            f"`cpplan {command}` measures the devices present; {topo.name} needs {topo.num_devices} "
            f"{platform} devices, this process has {len(devices)} {devices[0].platform} device(s). "
            f"Run it on that slice, or measure this host's devices with --topology cpu:8."
        )


def on_a_tpu_vm() -> bool:
    """Whether this host has TPU chips (their device files), judged without importing jax."""
    return any(Path("/dev").glob("accel*")) or any(Path("/dev/vfio").glob("[0-9]*"))


def note_uncalibrated_host(topology: str) -> None:
    """Says on stderr, once a command has answered, that a host's virtual devices were priced with
    the packaged generic row rather than a calibration of this machine."""
    try:
        topo = get_topology(topology)
    except CpplanError:
        return
    if topo.chip.kind.shares_cores and not measured_here(topo.chip.name):
        print(
            f"cpplan: note: {topo.name} is priced with cpplan's generic host row, not this machine's (rough defaults: "
            f"predicted step times can be off many times over); measure it with `cpplan calibrate --topology "
            f"{topo.name}` and export {CHIP_DIR_ENV}=cpplan-chips",
            file=sys.stderr,
        )
