"""The training loop of a run: steps of a compiled plan, with checkpoints, metrics and a clean stop.
Each process feeds its own rows (`process_rows`); after each step the processes agree whether any
was asked to stop (SIGTERM, Ctrl-C), and if so save a checkpoint together and return. Saves are timed:
the run ends with what they cost in step time (`runtime.checkpoint.SaveCost`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cost_models.errors import CpplanError
from cost_models.flops import model_flops_per_step
from runtime.checkpoint import (
    CHECKPOINT_DIR,
    DISK_SOURCE,
    DISK_WRITE_BYTES_PER_S,
    SaveCost,
    SaveInterval,
    checkpoint_bytes,
)
from runtime.compile import CompiledMemory
from runtime.runner import RunReport

PROFILE_DIR = "profile"


@dataclass(frozen=True)
class Checkpointing:
    """How a run keeps its state."""

    # save every this many steps (0: only at the end and when stopped; None: the `SaveInterval` of the
    # predicted step time, then of the first save, timed)
    every: int | None = None
    keep: int = 3  # checkpoints kept, newest first
    resume: bool = True  # resume from the newest checkpoint; False refuses a directory that has one
    resume_from: int | None = None  # resume from this step's checkpoint rather than the newest
    predicted_step_s: float | None = None  # the plan's step time as priced: the default interval's start

    def __post_init__(self):
        if self.every is None and self.predicted_step_s is None:
            raise CpplanError("a checkpoint interval is chosen from the predicted step time: give one of them.")


def process_rows(trainer) -> tuple[int, int, int]:
    """`(block, blocks, first_row)`: the batch cut into `blocks` equal row blocks, of which this process's
    devices hold block `block`, from row `first_row` (one block when the sequence spans the processes).

    Raises:
        CpplanError: the process's rows are not one contiguous block (a mesh this loop cannot feed).
    """
    import jax

    rows = trainer.plan.global_batch
    index_map = trainer.token_sharding.devices_indices_map((rows, trainer.plan.seq_len))
    mine = [index[0] for device, index in index_map.items() if device.process_index == jax.process_index()]
    covered = sorted({r for s in mine for r in range(*s.indices(rows))})
    first, count = covered[0], len(covered)
    if covered != list(range(first, first + count)) or rows % count or first % count:
        raise CpplanError(
            f"process {jax.process_index()} holds rows {covered} of the batch, not one of equal "
            f"contiguous blocks; plan a mesh whose data axes split the batch evenly over processes."
        )
    return first // count, rows // count, first


def train(
    trainer,
    compiled,
    *,
    steps: int,
    dataset,
    seed: int = 0,
    run_dir: Path | None = None,
    checkpointing: Checkpointing | None = None,
    profile_steps: tuple[int, int] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    memory: CompiledMemory | None = None,
    compile_s: float = 0.0,
    on_note: Callable[[str], None] | None = None,
    initial: Callable[[], object] | None = None,
    trained: Callable[[object], None] | None = None,
) -> RunReport:
    """Runs `trainer`'s `compiled` step to `steps` steps, from the newest checkpoint if any; returns the
    `RunReport` of the steps run here. `dataset.batch(step, ...)` gives a `Batch`; `run_dir` (None:
    nowhere) gets metrics, checkpoints and traces of `profile_steps` `(first, last)`; `should_stop` is
    polled after each step; `memory`, `compile_s` go to the report; `on_note` gets the leader's notes.
    `initial` gives the weights to start from where no checkpoint is resumed (None: random ones of `seed`);
    `trained` gets the weights after the last step (not called when stopped).

    Raises:
        CpplanError: a checkpoint of another run, or one present when resuming is refused.
    """
    import jax

    from runtime.checkpoint import Checkpoints
    from runtime.distributed import stop_agreed
    from runtime.metrics import StepLog, peak_memory_bytes

    plan = trainer.plan
    leader = jax.process_index() == 0
    say = on_note if on_note is not None and leader else lambda _text: None
    checkpoints = interval = None  # interval: the default one, until the first save it times refines it
    if checkpointing is not None:
        identity = {"model": plan.model.name, "seq_len": plan.seq_len, "global_batch": plan.global_batch, "seed": seed}
        every = checkpointing.every
        if every is None:
            interval = SaveInterval(
                checkpoint_bytes(plan),
                jax.process_count(),
                DISK_WRITE_BYTES_PER_S,
                checkpointing.predicted_step_s,
                DISK_SOURCE,
            )
            every = interval.every
        checkpoints = Checkpoints(
            Path(run_dir) / CHECKPOINT_DIR, every=every, keep=checkpointing.keep, identity=identity
        )
    first_step = 0
    if checkpointing is not None and checkpointing.resume_from is not None and checkpoints.latest_step is None:
        raise CpplanError(
            f"--resume-from {checkpointing.resume_from}: {checkpoints.directory} holds no checkpoint; drop "
            f"--resume-from to start, or give the --run-dir of the run to resume."
        )
    if checkpoints is not None and checkpoints.latest_step is not None:
        if not checkpointing.resume:
            raise CpplanError(
                f"{checkpoints.directory} holds a checkpoint at step {checkpoints.latest_step} and "
                f"resuming was refused (--no-resume); give another --run-dir, or drop --no-resume."
            )
        abstract_params, abstract_opt, *_ = trainer.abstract_state()
        restored = checkpoints.restore(abstract_params, abstract_opt, step=checkpointing.resume_from, on_note=say)
        params, opt_state, first_step = restored.params, restored.opt_state, restored.step
        say(f"resumed from the checkpoint at step {first_step} in {checkpoints.directory}")
    else:
        params, opt_state = trainer.init(seed, params=None if initial is None else initial())
    if interval is not None:
        say(str(interval))
    block, blocks, first_row = process_rows(trainer)
    flops = model_flops_per_step(plan.model, plan.seq_len, plan.global_batch)
    topo = plan.topology_spec
    log = None
    if run_dir is not None:
        log = StepLog(
            Path(run_dir),
            model_flops=flops,
            tokens_per_step=plan.global_batch * plan.seq_len,
            num_devices=topo.num_devices,
            peak_flops_per_device=topo.peak_flops_per_device,
            total_steps=steps,
            first_step=first_step,
            leader=leader,
        )
        if log.kept_aside:
            say(log.kept_aside)
    times, losses, stopped = [], [], False
    writing, held = [], []  # whether a save was being written during each step; seconds each save held the loop
    try:
        for step in range(first_step + 1, steps + 1):  # steps count from 1
            if profile_steps and step == profile_steps[0]:
                jax.profiler.start_trace(str(Path(run_dir) / PROFILE_DIR))
            batch = dataset.batch(step - 1, global_batch=plan.global_batch, process_index=block, process_count=blocks)
            inputs = trainer.prepare_batch(batch.tokens, batch.segment_ids, first_row=first_row)
            jax.block_until_ready(inputs)
            writing.append(checkpoints is not None and checkpoints.saving)
            begin = time.perf_counter()
            params, opt_state, loss = compiled(params, opt_state, *inputs)
            loss = float(loss)
            times.append(time.perf_counter() - begin)
            losses.append(loss)
            if profile_steps and step == profile_steps[1]:
                jax.profiler.stop_trace()
            if log is not None:
                log.step(step, loss=loss, seconds=times[-1])
            # every process takes part in the agreement after every step; a stop asked for after the last
            # step stops nothing: the run is done
            stopped = stop_agreed(step, should_stop()) and step < steps
            if checkpoints is not None and (checkpoints.due(step) or step == steps or stopped):
                begin = time.perf_counter()
                checkpoints.save(step, params, opt_state)
                if interval is not None and step < steps and not stopped:
                    # the first save of a default interval is waited for and timed, and the interval
                    # follows what it took, at the steps measured so far
                    checkpoints.wait()
                    save_s, step_s = _leaders(time.perf_counter() - begin, statistics.median(times[1:] or times))
                    interval = interval.measured(save_s=save_s, step_s=step_s)
                    checkpoints.every = interval.every
                    say(f"the first save, timed: {interval}")
                    interval = None
                held.append(time.perf_counter() - begin)
            if stopped:
                break
    finally:
        if checkpoints is not None:
            checkpoints.close()  # waits for the last save: a stopped run's checkpoint is complete
        if log is not None:
            log.close()
    if checkpoints is not None and losses:
        say(f"checkpoint at step {first_step + len(losses)} in {checkpoints.directory}")
        # the last save is the one after the last step (or the stop)
        cost = SaveCost(
            tuple(times), tuple(writing), tuple(held[:-1]), held[-1], checkpoints.every, checkpoint_bytes(plan)
        )
        say(str(cost))
    if trained is not None and not stopped:
        trained(params)
    return RunReport(
        plan,
        compile_s,
        tuple(times),
        tuple(losses),
        flops,
        memory,
        first_step=first_step,
        stopped=stopped,
        peak_memory_bytes=peak_memory_bytes(jax.local_devices()),
    )


def _leaders(*values: float) -> tuple[float, ...]:
    """Process 0's `values` on every process (each calls it at the same step), so that all choose alike."""
    import jax

    if jax.process_count() == 1:
        return values
    import numpy as np
    from jax.experimental import multihost_utils

    return tuple(float(v) for v in multihost_utils.broadcast_one_to_all(np.array(values, np.float32)))
