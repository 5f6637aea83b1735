"""Running a plan: compile its step, time a few steps and report. MFU is `cost_models.units.mfu` against
the chip row's peak, as the prediction's, so predicted and measured MFU differ only by step time (on
`cpu:N`, the row `cpplan calibrate` measured, via `CPPLAN_CHIP_DIR`).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from cost_models.errors import CpplanError
from cost_models.units import MiB, mfu
from planner.plan import Plan
from runtime.compile import CompiledMemory
from runtime.compile_cache import Compiles, count_compiles


@dataclass(frozen=True)
class RunReport:
    """Measured figures of a run."""

    plan: Plan
    compile_s: float  # lowering + compiling the step (and, in `run`, the programs that initialise it)
    step_times_s: tuple[float, ...]  # wall time of every step (the first includes no compiling)
    losses: tuple[float, ...]
    model_flops: float  # of one step, as the cost model counts them
    memory: CompiledMemory | None = None  # None where the backend reports none
    first_step: int = 0  # steps done before these (a resumed run's checkpoint)
    stopped: bool = False  # asked to stop before its last step
    peak_memory_bytes: int | None = None  # the devices' peak bytes in use, where the backend reports it
    compiles: "Compiles | None" = None  # `run`'s compiles, and how many the persistent cache answered

    @property
    def step_time_s(self) -> float:
        """Median step time over the steps after the first (the only step if there is one)."""
        times = self.step_times_s[1:] or self.step_times_s
        return statistics.median(times)

    @property
    def best_step_s(self) -> float:
        """The fastest step after the first: the host's own speed, as calibration measures it
        (work sharing the machine only ever adds time)."""
        return min(self.step_times_s[1:] or self.step_times_s)

    @property
    def tokens_per_s(self) -> float:
        return self.plan.global_batch * self.plan.seq_len / self.step_time_s

    @property
    def hbm_bytes_per_device(self) -> int | None:
        """HBM per device from the compiler (`CompiledMemory.hbm_bytes_per_device`), or None."""
        return None if self.memory is None else self.memory.hbm_bytes_per_device

    @property
    def mfu(self) -> float:
        """MFU of the median step against the chip row's peak per device."""
        topo = self.plan.topology_spec
        return mfu(self.model_flops, self.step_time_s, topo.num_devices, topo.peak_flops_per_device)

    def __str__(self) -> str:
        losses = " ".join(f"{x:.3f}" for x in self.losses)
        hbm = self.hbm_bytes_per_device
        mem = "" if hbm is None else f", {hbm / MiB:.1f} MiB per device"
        peak = self.plan.topology_spec.peak_flops_per_device
        return (
            f"compiled in {self.compile_s:.1f} s; step {self.step_time_s * 1e3:.1f} ms (median of "
            f"{max(len(self.step_times_s) - 1, 1)}), {self.tokens_per_s:,.0f} tokens/s, MFU {self.mfu:.1%} of "
            f"{peak / 1e9:.1f} GFLOP/s per device{mem}; loss {losses}"
        )


@dataclass(frozen=True)
class CompiledPlan:
    """A plan's step and the programs that initialise it, compiled: nothing is allocated on the devices
    yet, so one plan can compile while another runs."""

    trainer: object  # runtime.train.Trainer
    step: object  # the step's jax.stages.Compiled
    compile_s: float
    compiles: Compiles


def compile_plan(plan: Plan, *, steps: int, devices=None, optimizer=None) -> CompiledPlan:
    """Compiles `plan`'s step and its initialisers (`runtime.initialise`) for a run of `steps` steps on
    `devices`, as `run` takes them (the arguments as `run`'s).

    Raises:
        CpplanError: bad step count, devices that do not match the plan, or a plan that cannot run.
    """
    from runtime.initialise import prepare_initialisers
    from runtime.mesh import build_mesh
    from runtime.optimizer import AdamW
    from runtime.tracing import TRACING
    from runtime.train import Trainer

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise CpplanError(f"steps={steps!r}: give a whole number of steps, at least 1.")
    mesh = build_mesh(plan, devices)
    with TRACING:
        trainer = Trainer(plan, mesh, optimizer=optimizer or AdamW(steps=steps))
    start = time.perf_counter()
    with count_compiles() as compiles:
        step = trainer.compile_step()
        prepare_initialisers(trainer)
    return CompiledPlan(trainer, step, time.perf_counter() - start, compiles)


def run(
    plan: Plan,
    *,
    steps: int,
    data: "str | os.PathLike | None" = None,
    seed: int = 0,
    devices=None,
    should_stop: Callable[[], bool] = lambda: False,
    optimizer=None,
    compiled: "CompiledPlan | Callable[[], CompiledPlan] | None" = None,
) -> RunReport:
    """Runs `steps` training steps of a plan on `devices` (default: all of jax's; the plan's topology
    must be theirs), on byte tokens of the text file `data` or synthetic ones (None), seeded by `seed`;
    `should_stop`, asked after each step, ends it early (the report says `stopped`). `optimizer`: a
    `runtime.optimizer.AdamW` (default: its defaults over the `steps`, as `cpplan run` trains).
    `compiled`: the plan's `compile_plan` for these arguments, or a function that gives it when the run
    needs it (a compile under way in another thread); None: compiled here.

    Raises:
        CpplanError: bad step count, devices that do not match the plan, or a plan that cannot run.
    """
    from runtime.data import open_dataset
    from runtime.loop import train

    if compiled is None:
        compiled = compile_plan(plan, steps=steps, devices=devices, optimizer=optimizer)
    elif callable(compiled):
        compiled = compiled()
    dataset = open_dataset(data, seq_len=plan.seq_len, vocab=plan.model.vocab, seed=seed)
    report = train(
        compiled.trainer,
        compiled.step,
        steps=steps,
        dataset=dataset,
        seed=seed,
        memory=CompiledMemory.of(compiled.step),
        compile_s=compiled.compile_s,
        should_stop=should_stop,
    )
    return dataclasses.replace(report, compiles=compiled.compiles)
