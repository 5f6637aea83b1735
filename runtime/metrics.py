"""What a person watches during a run: a progress bar, per-step JSON lines, TensorBoard scalars.
Only process 0 writes, each line flushed as made, so a killed run leaves every step it finished, and
nothing an earlier run of the directory logged is dropped: what a run does not continue is kept aside.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

from cost_models.units import mfu

METRICS_FILE = "metrics.jsonl"
EARLIER_METRICS = "metrics.{}.jsonl"  # an earlier run's whole log, set aside when a run starts from step 1
REPLAYED_METRICS = "metrics.replayed.jsonl"  # the steps a resumed run ran again, as first logged
TENSORBOARD_DIR = "tensorboard"


def peak_memory_bytes(devices) -> int | None:
    """The highest peak of bytes in use over `devices`, where the backend reports it (TPUs and
    GPUs do; CPU devices do not), else None."""
    peaks = []
    for device in devices:
        try:
            stats = device.memory_stats()
        except Exception:  # backends without memory statistics raise rather than return None
            stats = None
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(stats["peak_bytes_in_use"])
    return max(peaks) if peaks else None


class StepLog:
    """Per-step metrics of one run in `run_dir`, written by the `leader` only; MFU is the planner's own
    (`cost_models.units.mfu`) against the chip row's `peak_flops_per_device`."""

    def __init__(
        self,
        run_dir: Path,
        *,
        model_flops: float,
        tokens_per_step: int,
        num_devices: int,
        peak_flops_per_device: float,
        total_steps: int,
        first_step: int,
        leader: bool,
    ):
        self.model_flops, self.tokens_per_step = model_flops, tokens_per_step
        self.num_devices, self.peak = num_devices, peak_flops_per_device
        self.leader = leader
        self._lines = self._board = self._bar = None
        self.kept_aside: str | None = None  # the line that says an earlier run's log was set aside
        if not leader:
            return
        from tensorboardX import SummaryWriter
        from tqdm import tqdm

        run_dir.mkdir(parents=True, exist_ok=True)
        # a resumed run replays the steps after its checkpoint; one from step 1 starts a log of its own
        self.kept_aside = _keep_steps_up_to(run_dir / METRICS_FILE, first_step)
        self._lines = open(run_dir / METRICS_FILE, "a", buffering=1)  # line-buffered: each step on disk
        self._board = SummaryWriter(str(run_dir / TENSORBOARD_DIR), flush_secs=10)
        self._bar = tqdm(total=total_steps, initial=first_step, unit="step", dynamic_ncols=True)

    def step(self, step: int, *, loss: float, seconds: float) -> dict:
        """Records one finished step (counted from 1) and returns its record: loss, seconds, tokens/s per
        device, MFU."""
        record = {
            "step": step,
            "loss": loss,
            "step_time_s": seconds,
            "tokens_per_s_per_device": self.tokens_per_step / seconds / self.num_devices,
            "mfu": mfu(self.model_flops, seconds, self.num_devices, self.peak),
        }
        if not self.leader:
            return record
        finite = {k: v if not isinstance(v, float) or math.isfinite(v) else None for k, v in record.items()}
        self._lines.write(json.dumps(finite, allow_nan=False) + "\n")  # a diverged loss is null, not NaN
        for key in ("loss", "step_time_s", "tokens_per_s_per_device", "mfu"):
            if math.isfinite(record[key]):
                self._board.add_scalar(f"train/{key}", record[key], step)
        self._bar.set_postfix(
            loss=f"{loss:.4f}",
            tok_s_chip=f"{record['tokens_per_s_per_device']:,.0f}",
            mfu=f"{record['mfu']:.1%}",
            refresh=False,
        )
        self._bar.update(1)
        return record

    def note(self, text: str) -> None:
        """A line printed above the progress bar (leader only)."""
        if self.leader:
            self._bar.write(text)

    def close(self) -> None:
        if self.leader:
            self._bar.close()
            self._board.close()
            self._lines.close()


def _keep_steps_up_to(path: Path, last: int) -> str | None:
    """Leaves in a metrics file the records of steps up to `last` (those a resumed run keeps) and drops a
    line a kill cut short. A record it takes out is kept aside, never lost: from step 1 (`last` 0) an
    earlier run's whole log moves to `metrics.N.jsonl`; the steps a resume runs again are appended to
    `metrics.replayed.jsonl` as first logged.

    Returns:
        The line that says an earlier run's log was set aside, or None.
    """
    if not path.exists():
        return None
    kept, replayed = [], []
    for line in path.read_text().splitlines():
        try:
            step = json.loads(line)["step"]
            (kept if step <= last else replayed).append(line)
        except (ValueError, KeyError, TypeError):
            continue
    if last == 0 and replayed:
        aside = next(
            p for p in (path.with_name(EARLIER_METRICS.format(n)) for n in itertools.count(1)) if not p.exists()
        )
        path.rename(aside)
        steps = [json.loads(line)["step"] for line in replayed]
        return (
            f"starting from step 1 over an earlier run in {path.parent} (no checkpoint of it to resume from): "
            f"its log of {len(steps)} step(s), to step {max(steps)}, is kept as {aside.name}"
        )
    if replayed:
        with open(path.with_name(REPLAYED_METRICS), "a") as aside:
            aside.write("".join(f"{line}\n" for line in replayed))
    path.write_text("".join(f"{line}\n" for line in kept))
    return None
