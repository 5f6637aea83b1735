"""Orbax checkpoints of a run: sharded parameters and AdamW state, written asynchronously, and the
step reached; the data at step k depends on (seed, k) alone, so the step is the data position.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cost_models.errors import CpplanError

# what must be equal for a checkpoint to continue this run; the mesh may change (Orbax reshards)
SAME_RUN_KEYS = ("model", "seq_len", "global_batch", "seed")


@dataclass(frozen=True)
class Restored:
    """A run's state read back: `params`, `opt_state`, and the `step` to run next."""

    params: object
    opt_state: object
    step: int


CHECKPOINT_DIR = "checkpoints"  # under the run directory


class Checkpoints:
    """The checkpoints of one run `directory`, saved every `every` steps, the `keep` newest kept, each
    stamped with the run's `identity` (`SAME_RUN_KEYS`), which a resume checks."""

    def __init__(self, directory: "str | os.PathLike", *, every: int, keep: int, identity: dict):
        import orbax.checkpoint as ocp

        self.directory = Path(directory).absolute()
        self.every = every
        self.identity = identity
        self._ocp = ocp
        self._manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True)
        )

    @property
    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step count, or None."""
        return self._manager.latest_step()

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
            CpplanError: the checkpoint is of another run (model, sequence, batch or seed differ), no
                checkpoint reads, or `step` is not one of them.
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
        state = self._manager.restore(step, args=args.Composite(state=args.StandardRestore(target)))["state"]
        return Restored(state["params"], state["opt_state"], int(run["step"]))

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
