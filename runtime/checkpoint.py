"""Orbax checkpoints of a run: sharded parameters and AdamW state, written asynchronously, and the
step reached; the data at step k depends on (seed, k) alone, so the step is the data position.

What a save costs: `SaveInterval` picks how often to save so that saving stays under `SAVE_BUDGET` of
the step time (from the checkpoint's bytes and a disk's write bandwidth, then from a measured save), and
`SaveCost` says what the saves of a run cost in step time.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from cost_models.errors import CpplanError
from cost_models.units import GiB, MiB
from cost_models.vocabulary import DTYPE_BYTES

# what must be equal for a checkpoint to continue this run; the mesh may change (Orbax reshards)
SAME_RUN_KEYS = ("model", "seq_len", "global_batch", "seed")


def array_shapes(tree) -> dict[str, tuple[int, ...]]:
    """The shape of each array of a state tree, by its path written "params/layers/w_up": of arrays or
    `ShapeDtypeStruct`s, or of Orbax's metadata of a saved state, where named tuples are dicts and tuples
    lists (the paths name a field by its name and an element by its index alike)."""
    import jax

    def part(entry) -> str:
        for field in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
            if hasattr(entry, field):
                return str(getattr(entry, field))
        return str(entry)

    return {
        "/".join(part(entry) for entry in path): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }


def layout_difference(written: "dict | None", wanted: dict) -> str:
    """The first way the arrays a checkpoint holds (`array_shapes` of its metadata; None where that does not
    read) differ from those a restore wants, in words; "" where they are alike or unknown."""
    if written is None:
        return ""
    for path, shape in wanted.items():
        if path not in written:
            return f"no array {path} there, {shape} now"
        if written[path] != shape:
            return f"{path} is {written[path]} there, {shape} now"
    extra = next((path for path in written if path not in wanted), None)
    return f"{extra} there is not in this run's state" if extra else ""


@dataclass(frozen=True)
class Restored:
    """A run's state read back: `params`, `opt_state`, and the `step` to run next."""

    params: object
    opt_state: object
    step: int


CHECKPOINT_DIR = "checkpoints"  # under the run directory

SAVE_BUDGET = 0.02  # the default interval keeps a save's seconds under this fraction of the steps between saves
# A process's write bandwidth before one is measured: a TPU VM keeps the run directory on its boot disk,
# 100 GiB by default (cloud.google.com/tpu/docs/storage-options: "each Cloud TPU VM has a single 100 GiB boot
# disk"), Balanced Persistent Disk on v5e and v5p (docs.cloud.google.com/tpu/docs/storage-options-compute),
# which sustains 0.28 MiB/s per GiB (cloud.google.com/compute/docs/disks/performance, "Throughput limits for
# zonal Persistent Disk"): 100 × 0.28 = 28 MiB/s, a floor (any baseline throughput the disk adds is left
# out); the run's first save, timed, replaces it.
DISK_WRITE_BYTES_PER_S = 28 * MiB  # 100 GiB × 0.28 MiB/s per GiB
DISK_SOURCE = "a TPU VM's 100 GiB balanced persistent boot disk, 0.28 MiB/s per GiB"


def checkpoint_bytes(plan) -> int:
    """Bytes of one checkpoint of `plan`: the weights and AdamW's two moments (the first in mu_dtype,
    the second as the weights); the optimizer's step counts are a few bytes more."""
    return plan.model.num_params * (2 * DTYPE_BYTES[plan.param_dtype] + DTYPE_BYTES[plan.mu_dtype])


@dataclass(frozen=True)
class SaveInterval:
    """How often a run saves by default: a save writes `checkpoint_bytes` split over `processes`, each at
    `write_bytes_per_s`, and `every` steps of `step_s` are long enough that it costs at most `SAVE_BUDGET`
    of their time, even counted whole (as if the loop waited for every write). The saves are asynchronous,
    but a write that outlasts the steps between saves holds the next save up, and one that overlaps
    steps slows them: the whole write is the cost to budget for. `source` says where the bandwidth is from;
    `timed`: the bandwidth and step time are a timed save's and the steps measured before it."""

    checkpoint_bytes: int
    processes: int
    write_bytes_per_s: float
    step_s: float
    source: str
    timed: bool = False

    @property
    def save_s(self) -> float:
        """Seconds one process takes to write its part of a checkpoint."""
        return self.checkpoint_bytes / self.processes / self.write_bytes_per_s

    @property
    def every(self) -> int:
        """The fewest steps between saves that keep a save under `SAVE_BUDGET` of their time."""
        return max(1, math.ceil(self.save_s / (SAVE_BUDGET * self.step_s)))

    def measured(self, *, save_s: float, step_s: float) -> "SaveInterval":
        """The interval a timed save of `save_s` seconds and measured steps of `step_s` give."""
        bandwidth = self.checkpoint_bytes / self.processes / save_s
        return dataclasses.replace(self, write_bytes_per_s=bandwidth, step_s=step_s, source="a timed save", timed=True)

    def __str__(self) -> str:
        split = f" ({_size(self.checkpoint_bytes / self.processes)} per process)" if self.processes > 1 else ""
        save = f"a save of {_size(self.checkpoint_bytes)}{split}"
        bandwidth = f"{self.write_bytes_per_s / MiB:,.1f} MiB/s"
        budget = f"under {SAVE_BUDGET:.0%} of {self.every} steps of {self.step_s:.3g} s"
        if self.timed:
            return f"checkpoints every {self.every} steps: {save} took {self.save_s:.3g} s ({bandwidth}), {budget}"
        return (
            f"checkpoints every {self.every} steps: {save} takes ~{self.save_s:.3g} s to write at {bandwidth} "
            f"({self.source}), {budget} (the plan's predicted step); --checkpoint-every sets it"
        )


@dataclass(frozen=True)
class SaveCost:
    """What a run's saves cost in step time. A save holds the loop (`held_s`: copying the state off the
    devices, waiting for the save before it, or the whole write where the save was timed), and the steps
    run while it is written (`writing`, one flag per step of `step_times_s`) may run slower than the median
    step run with none. `held_s` are the saves within the run, each followed by more steps; `final_s` the
    save after the last step (or the stop), which no step waits for but the run's end does."""

    step_times_s: tuple[float, ...]
    writing: tuple[bool, ...]
    held_s: tuple[float, ...]
    final_s: float
    every: int
    checkpoint_bytes: int

    @property
    def clean_step_s(self) -> float:
        """Median step with no save being written, the first step left out (it warms up)."""
        clean = [t for t, w in zip(self.step_times_s[1:], self.writing[1:]) if not w]
        return statistics.median(clean or self.step_times_s[1:] or self.step_times_s)

    @property
    def slowed(self) -> tuple[float, ...]:
        """The steps run while a save was being written."""
        return tuple(t for t, w in zip(self.step_times_s, self.writing) if w)

    @property
    def extra_s(self) -> float:
        """Seconds the saves within the run added: the loop held, and the slowed steps' excess over a
        clean step."""
        return sum(self.held_s) + sum(max(0.0, t - self.clean_step_s) for t in self.slowed)

    @property
    def fraction(self) -> float:
        """`extra_s` against the steps' time without saves."""
        return self.extra_s / (len(self.step_times_s) * self.clean_step_s)

    def __str__(self) -> str:
        held = self.held_s or (self.final_s,)
        median = statistics.median(held)
        text = (
            f"checkpoint cost: a save of {_size(self.checkpoint_bytes)} held the loop {median:.3g} s (median of "
            f"{len(held)}{f', at most {max(held):.3g} s' if len(held) > 1 else ''}; "
            f"{median / self.clean_step_s:.2g} steps of {self.clean_step_s * 1e3:,.1f} ms)"
        )
        if self.slowed:
            slow = statistics.median(self.slowed)
            text += (
                f"; the {len(self.slowed)} step(s) run while a save was written took {slow * 1e3:,.1f} ms "
                f"({slow / self.clean_step_s:.2g}×)"
            )
        if not self.held_s:
            return f"{text}; no save within the run" + (f" (every {self.every} steps)" if self.every else "")
        return f"{text}; the {len(self.held_s)} save(s) within the run added {self.fraction:.1%} to its steps' time"


def _size(nbytes: float) -> str:
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB else f"{nbytes / MiB:.1f} MiB"


class Checkpoints:
    """The checkpoints of one run `directory`, saved every `every` steps, the `keep` newest kept, each
    stamped with the run's `identity` (`SAME_RUN_KEYS`), which a resume checks with the arrays' shapes."""

    def __init__(self, directory: "str | os.PathLike", *, every: int, keep: int, identity: dict):
        import orbax.checkpoint as ocp

        self.directory = Path(directory).absolute()
        self.every = every
        self.identity = identity
        self._ocp = ocp
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True),
            # named, so that a saved state's metadata (its arrays' shapes) reads before the state does
            item_handlers={"state": ocp.StandardCheckpointHandler(), "run": ocp.JsonCheckpointHandler()},
        )

    @property
    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step count, or None."""
        return self._manager.latest_step()

    @property
    def saving(self) -> bool:
        """Whether a save is being written."""
        return self._manager.is_saving_in_progress()

    def due(self, steps_done: int) -> bool:
        """Whether a checkpoint is due after `steps_done` steps."""
        return self.every > 0 and steps_done % self.every == 0

    def save(self, steps_done: int, params, opt_state) -> None:
        """Starts writing the state after `steps_done` steps (returns before the write ends)."""
        args = self._ocp.args
        self._manager.save(
            steps_done,
            args=args.Composite(
                state=args.StandardSave({"params": params, "opt_state": opt_state}),
                run=args.JsonSave({**self.identity, "step": steps_done}),
            ),
            force=True,
        )

    def restore(self, abstract_params, abstract_opt_state, *, step: int | None = None, on_note=None) -> Restored:
        """The newest checkpoint that reads whole (or the one at `step`), laid out on the shardings of
        the given `ShapeDtypeStruct` trees. A newer one that does not read (a save cut short, a damaged
        file) is set aside as `<step>.unreadable`, said through `on_note`, and the next one tried.

        Raises:
            CpplanError: the checkpoint is of another run (model, sequence, batch or seed differ) or holds
                arrays other than the given trees' (set aside: none), no checkpoint reads, or `step` is not
                one of them.
        """
        steps = sorted(self._manager.all_steps(), reverse=True)
        if step is not None:
            if step not in steps:
                raise CpplanError(
                    f"--resume-from {step}: {self.directory} holds checkpoints at steps "
                    f"{', '.join(map(str, sorted(steps))) or 'none'}; give one of them."
                )
            steps = [step]
        target = {"params": abstract_params, "opt_state": abstract_opt_state}
        for at in steps:
            try:
                return self._restore(at, target)
            except CpplanError:
                raise
            except Exception as err:  # Orbax's errors for a missing or cut file vary by what broke
                reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
                if step is not None:
                    raise CpplanError(
                        f"the checkpoint at step {at} in {self.directory} cannot be read ({reason}); resume from "
                        f"another (--resume-from) or drop --resume-from to take the newest that reads."
                    ) from None
                self._set_aside(at)
                if on_note is not None:
                    on_note(
                        f"the checkpoint at step {at} in {self.directory} cannot be read ({reason}); set aside "
                        f"as {at}.unreadable, trying the one before it"
                    )
        raise CpplanError(
            f"no checkpoint in {self.directory} reads whole; move the directory away to start afresh, or give "
            f"another --run-dir."
        )

    def _restore(self, step: int, target: dict) -> Restored:
        args = self._ocp.args
        run = self._manager.restore(step, args=args.Composite(run=args.JsonRestore()))["run"]
        differ = {k: (run.get(k), v) for k, v in self.identity.items() if run.get(k) != v}
        if differ:
            what = ", ".join(f"{k} {old!r} there, {new!r} now" for k, (old, new) in differ.items())
            raise CpplanError(
                f"the checkpoint in {self.directory} is of another run ({what}); resume with the same "
                f"settings, or give another --run-dir (or --no-resume with an empty one)."
            )
        problem = layout_difference(self._written_shapes(step), array_shapes(target))
        if problem:
            raise CpplanError(
                f"the checkpoint at step {step} in {self.directory} holds another state than this run's ({problem}): "
                f"the model's config or cpplan's state layout changed since it was written; resume with what wrote "
                f"it, or give another --run-dir (or --no-resume with an empty one)."
            )
        state = self._manager.restore(step, args=args.Composite(state=args.StandardRestore(target)))["state"]
        return Restored(state["params"], state["opt_state"], int(run["step"]))

    def _written_shapes(self, step: int) -> "dict | None":
        """`array_shapes` of the state saved at `step`, from Orbax's metadata; None where that does not read (a
        damaged checkpoint: its restore says so)."""
        try:
            return array_shapes(self._manager.item_metadata(step)["state"])
        except Exception:  # Orbax's errors for a missing or cut metadata file vary by what broke
            return None

    def _set_aside(self, step: int) -> None:
        """Moves an unreadable checkpoint out of the manager's way (process 0 only: one file system)."""
        import jax

        if jax.process_index() == 0:
            folder = self.directory / str(step)
            if folder.exists():
                folder.rename(self.directory / f"{step}.unreadable")
        self._manager.reload()

    def wait(self) -> None:
        """Blocks until the last save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for the last save, then releases the manager's threads."""
        self._manager.close()
