"""Several processes, one run, through `jax.distributed`: one mesh spans every process's devices.
TPU VMs find the coordinator from the slice; elsewhere it is given. CPU collectives go through gloo.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from cost_models.errors import CpplanError


@dataclass(frozen=True)
class ProcessGroup:
    """Where to find the other processes of a run: all three given, or none (a TPU VM, or alone)."""

    coordinator: str | None = None  # host:port of process 0's coordination service
    num_processes: int | None = None
    process_id: int | None = None  # 0 .. num_processes-1

    def check(self) -> None:
        """Raises CpplanError unless the three are given together and agree."""
        given = [x is not None for x in (self.coordinator, self.num_processes, self.process_id)]
        if any(given) and not all(given):
            raise CpplanError(
                f"--coordinator, --num-processes and --process-id go together (got coordinator="
                f"{self.coordinator!r}, num_processes={self.num_processes}, process_id="
                f"{self.process_id}); give all three, or none on a TPU VM."
            )
        if all(given) and not 0 <= self.process_id < self.num_processes:
            raise CpplanError(
                f"--process-id {self.process_id} is not one of the {self.num_processes} processes "
                f"(0..{self.num_processes - 1})."
            )
        if self.coordinator is not None and ":" not in self.coordinator:
            raise CpplanError(f"--coordinator {self.coordinator!r} needs a port, e.g. localhost:12355.")
        if self.coordinator is not None:
            host, port = self.address
            if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise CpplanError(
                    f"--coordinator {self.coordinator!r}: write HOST:PORT with a port from 1 to 65535, e.g. "
                    f"localhost:12355."
                )

    @property
    def address(self) -> tuple[str, str]:
        """The coordinator's (host, port) as written, an IPv6 host without its brackets."""
        host, _, port = self.coordinator.rpartition(":")
        return host.strip("[]"), port

    @property
    def explicit(self) -> bool:
        return self.coordinator is not None

    @property
    def count(self) -> int:
        """Processes in the run (1 when none are given; on a TPU VM jax counts them itself)."""
        return self.num_processes or 1


def initialize(group: ProcessGroup, *, platform: str, timeout_s: int = 300) -> None:
    """Joins the run's processes before jax touches a device (a no-op for one process on a CPU host);
    on `platform` "cpu" collectives use gloo, on "tpu" with nothing given jax reads the slice's metadata.

    Raises:
        CpplanError: the flags disagree, or the coordinator cannot be reached.
    """
    import jax

    group.check()
    if not group.explicit and platform == "cpu":
        return
    if platform == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if group.explicit and group.num_processes > 1:  # a peer that never comes is a line here, not an abort in jax
        from runtime.rendezvous import gather, join

        host, port = group.address
        if group.process_id == 0:
            gather(group.coordinator, int(port), group.num_processes, timeout_s)
        else:
            join(group.coordinator, host, int(port), group.process_id, group.num_processes, timeout_s)
    try:
        if group.explicit:
            jax.distributed.initialize(
                coordinator_address=group.coordinator,
                num_processes=group.num_processes,
                process_id=group.process_id,
                initialization_timeout=timeout_s,
            )
        else:
            jax.distributed.initialize()
    except Exception as err:  # jax's cluster detection raises what its metadata client raises
        if not group.explicit:
            # a TPU VM that is its slice's only host, or one whose metadata server cannot be reached (a
            # sandbox): nothing to join, and a multi-host slice could not have been joined without it
            if "coordinator" not in str(err).lower():
                print(
                    f"cpplan: the TPU slice's metadata could not be read ({type(err).__name__}): running as its "
                    f"only process; give --coordinator, --num-processes and --process-id to join several",
                    file=sys.stderr,
                )
            return
        raise CpplanError(
            f"could not join the run's processes ({str(err).strip().splitlines()[0]}); check that "
            f"every process got the same --coordinator and --num-processes and a distinct "
            f"--process-id, and that the coordinator's port is reachable."
        ) from None


def is_leader() -> bool:
    """Whether this process is the one that prints and writes the run's files (process 0)."""
    import jax

    return jax.process_index() == 0


def stop_agreed(step: int, requested: bool) -> bool:
    """Whether every process stops after `step` (this one `requested` it, or another did); every process
    calls it after every step. jax's preemption notifier owns SIGTERM and picks the step; a Ctrl-C is
    shared by a gather of the flags."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return requested
    if multihost_utils.reached_preemption_sync_point(step):
        return True
    return bool(np.any(multihost_utils.process_allgather(np.array(requested))))
