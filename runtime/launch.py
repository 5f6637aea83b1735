"""A planned run on the devices present: join the processes, pre-flight the ranked plans (best
first, falling back to the next that compiles and fits), open the data, and train."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cost_models.chips import ChipKind
from cost_models.errors import CpplanError
from cost_models.units import GiB
from planner.plan import Plan
from runtime.distributed import ProcessGroup
from runtime.optimizer import AdamW


@dataclass(frozen=True)
class Launch:
    """What `cpplan run` asks of a run; one line per flag of the same name."""

    steps: int
    run_dir: Path
    data: str | None = None
    pack: bool = False
    data_dtype: str | None = None
    eos_id: int | None = None
    seed: int = 0
    max_fallbacks: int = 4
    checkpoint_every: int | None = None  # None: as often as costs under 2% of the step time (runtime.checkpoint)
    keep_checkpoints: int = 3
    resume: bool = True
    resume_from: int | None = None
    join_timeout_s: int = 120
    profile_steps: tuple[int, int] | None = None
    init_from: Path | None = None
    rope_theta: float | None = None
    export_hf: Path | None = None
    optimizer: AdamW | None = None  # the optimizer flags (--learning-rate...); None: the defaults over the steps

    @property
    def adamw(self) -> AdamW:
        """The optimizer the run trains with."""
        return self.optimizer or AdamW(steps=self.steps)


def check_world(plan: Plan, group: ProcessGroup, launch: Launch) -> None:
    """Refuses, before any compile, a run whose directory, checkpoints, disk, coordinator, weights to start
    from (--init-from) or export (--export-hf) cannot serve it: each a one-line refusal naming the path or
    flag and the fix.

    Raises:
        CpplanError: the first problem found.
    """
    from runtime.checkpoint import CHECKPOINT_DIR, checkpoint_bytes

    run_dir = launch.run_dir
    if run_dir.exists() and not run_dir.is_dir():
        raise CpplanError(f"--run-dir {str(run_dir)!r} is a file; give a directory (it is created when missing).")
    existing = next(p for p in (run_dir, *run_dir.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise CpplanError(
            f"--run-dir {str(run_dir)!r}: {str(existing)!r} is not a directory this process can write "
            f"to; give a --run-dir under a writable directory."
        )
    checkpoints = run_dir / CHECKPOINT_DIR
    if checkpoints.exists() and not checkpoints.is_dir():
        raise CpplanError(
            f"{str(checkpoints)!r} is a file where the run keeps its checkpoints; move it away or give "
            f"another --run-dir."
        )
    if not launch.resume and launch.resume_from is not None:
        raise CpplanError(f"--resume-from {launch.resume_from} with --no-resume: give one of them.")
    if not launch.resume and checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir()):
        raise CpplanError(
            f"{str(checkpoints)!r} holds checkpoints and resuming was refused (--no-resume); give "
            f"another --run-dir, or drop --no-resume."
        )
    need = checkpoint_bytes(plan)
    free = shutil.disk_usage(existing).free
    if free < need:
        raise CpplanError(
            f"--run-dir {str(run_dir)!r}: {free / GiB:.2f} GiB free on its disk, and one checkpoint "
            f"of this plan takes {need / GiB:.2f} GiB; free some space or give a --run-dir on a larger "
            f"disk."
        )
    if launch.init_from is not None or launch.export_hf is not None:
        from runtime.hf_checkpoint import HFCheckpoint, check_export

        if launch.init_from is not None:
            checkpoint = HFCheckpoint(launch.init_from)
            checkpoint.check(plan.model, plan.seq_len)
            checkpoint.rope(launch.rope_theta)  # one the runtime runs
        if launch.export_hf is not None:
            check_export(plan.model, launch.export_hf, launch.init_from)
    if group.coordinator is not None:
        check_coordinator(group, launch.join_timeout_s)


def check_coordinator(group: ProcessGroup, timeout_s: float) -> None:
    """Refuses a --coordinator whose host does not resolve; a process other than 0 (process 0 serves
    the address) then waits until the coordination service accepts connections there, at most
    `timeout_s` seconds (jax's own wait ends in an abort, not an error).

    Raises:
        CpplanError: naming the address and the fix.
    """
    host, port = group.address
    try:
        socket.getaddrinfo(host, int(port))
    except OSError as err:
        raise CpplanError(
            f"--coordinator {group.coordinator!r}: host {host!r} does not resolve ({err.strerror or err}); give "
            f"process 0's host name or address."
        ) from None
    if group.process_id == 0:
        return
    from runtime.rendezvous import reach

    reach(group.coordinator, host, int(port), timeout_s).close()


def use_tpu_compiler_flags(chip, scoped_vmem_kib: int | None = None) -> None:
    """On a TPU, before jax starts its backend: the compiler flags the price's overlap data was read
    with, and `scoped_vmem_kib` of scoped VMEM for every compile where given (calibrate's kernels; a
    plan's programs take the limit their own splash blocks need per compile,
    `runtime.compile.plan_compiler_options`). The user's own LIBTPU_INIT_ARGS win."""
    if chip.kind is ChipKind.TPU:
        from cost_models.compute import scoped_vmem_flag
        from runtime.compile import use_compiler_flags

        use_compiler_flags(chip.name, scoped_vmem_flag(scoped_vmem_kib))


def prepare(
    plans: Sequence[Plan],
    group: ProcessGroup,
    launch: Launch,
    *,
    say: Callable[[str], None],
    should_stop: Callable[[], bool] = lambda: False,
):
    """Joins the processes, opens the data, and pre-flights `plans` (ranked, best first): the first
    of the first `max_fallbacks` that compiles and fits on this process's devices wins.

    Returns:
        (the `runtime.preflight.Preflight`, the dataset).
    Raises:
        CpplanError: none of them compiles and fits, or the data cannot be read.
    """
    from runtime.distributed import initialize

    plans = list(plans[: launch.max_fallbacks])
    chip = plans[0].topology_spec.chip
    use_tpu_compiler_flags(chip)
    initialize(group, platform=chip.kind.jax_platform, timeout_s=launch.join_timeout_s)
    import jax

    from runtime.data import open_dataset
    from runtime.hf_checkpoint import run_constants
    from runtime.preflight import preflight

    best = plans[0]  # every ranked plan has its model and sequence length
    dataset = open_dataset(
        launch.data,
        seq_len=best.seq_len,
        vocab=best.model.vocab,
        seed=launch.seed,
        pack=launch.pack,
        dtype=launch.data_dtype,
        eos_id=launch.eos_id,
    )
    say(
        f"{jax.process_count()} process(es), {jax.device_count()} {jax.devices()[0].platform} devices; "
        f"pre-flight compile of the planner's plans, best first:"
    )
    checked = preflight(
        plans,
        devices=jax.devices(),
        packed=launch.pack,
        max_attempts=launch.max_fallbacks,
        on_attempt=lambda attempt: say(f"  {attempt}"),
        should_stop=should_stop,
        constants=run_constants(launch.init_from, launch.rope_theta),
        optimizer=launch.adamw,
    )
    return checked, dataset


def train_checked(
    checked,
    dataset,
    launch: Launch,
    *,
    should_stop: Callable[[], bool],
    say: Callable[[str], None],
    predicted_step_s: float | None = None,
):
    """Trains the plan the pre-flight chose, with checkpoints and metrics in `launch.run_dir`;
    `predicted_step_s` (the plan's price) chooses the checkpoint interval where the launch gives none.

    Returns:
        runtime.loop's report of the steps done.
    """
    from runtime.hf_checkpoint import run_hooks
    from runtime.loop import Checkpointing, train

    checkpointing = Checkpointing(
        every=launch.checkpoint_every,
        keep=launch.keep_checkpoints,
        resume=launch.resume,
        resume_from=launch.resume_from,
        predicted_step_s=predicted_step_s,
    )
    initial, trained = run_hooks(checked.trainer, init_from=launch.init_from, export_hf=launch.export_hf, say=say)
    return train(
        checked.trainer,
        checked.compiled,
        steps=launch.steps,
        dataset=dataset,
        seed=launch.seed,
        run_dir=launch.run_dir,
        checkpointing=checkpointing,
        profile_steps=launch.profile_steps,
        should_stop=should_stop,
        memory=checked.memory,
        compile_s=sum(a.compile_s for a in checked.attempts),
        on_note=say,
        initial=initial,
        trained=trained,
    )
