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

    def restore(self, abstract_params, abstract_opt_state) -> Restored:
        """The newest checkpoint, laid out on the shardings of the given `ShapeDtypeStruct` trees.

        Raises:
            CpplanError: the checkpoint is of another run (model, sequence, batch or seed differ).
        """
        args = self._ocp.args
        step = self.latest_step
        run = self._manager.restore(step, args=args.Composite(run=args.JsonRestore()))["run"]
        differ = {k: (run.get(k), v) for k, v in self.identity.items() if run.get(k) != v}
        if differ:
            what = ", ".join(f"{k} {old!r} there, {new!r} now" for k, (old, new) in differ.items())
            raise CpplanError(
                f"the checkpoint in {self.directory} is of another run ({what}); resume with the same "
                f"settings, or give another --run-dir (or --no-resume with an empty one)."
            )
        target = {"params": abstract_params, "opt_state": abstract_opt_state}
        state = self._manager.restore(step, args=args.Composite(state=args.StandardRestore(target)))["state"]
        return Restored(state["params"], state["opt_state"], int(run["step"]))

    def wait(self) -> None:
        """Blocks until the last save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for the last save, then releases the manager's threads."""
        self._manager.close()
