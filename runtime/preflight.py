"""Pre-flight: compile the chosen plan ahead of time, and fall back when the compiler says no.

Before the first step the training step is compiled for the devices present. On TPUs a plan
that does not fit fails in the compiler (`CompileTimeHbmOom`); elsewhere (a CPU host) the
compiler's memory figures (`CompiledMemory.hbm_bytes_per_device`) are held against the chip
row's memory. Either way the run moves to the planner's next-ranked plan and says why. The
executable that passed is the one the run uses: nothing compiles twice.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from cost_models.errors import CpplanError
from cost_models.units import GiB, MiB
from planner.plan import Plan
from runtime.compile import CompiledMemory, parse_hbm_oom


@dataclass(frozen=True)
class Attempt:
    """One plan compiled in the pre-flight.

    Attributes:
        plan: the plan.
        rank: its place in the planner's ranking (1 = best).
        fits: whether the compiled step fits the device's memory.
        compile_s: lowering plus compiling.
        required_bytes: per-device bytes the compiler reports (None where it reports none).
        available_bytes: the device's memory the step is held against.
        reason: why it does not fit (the compiler's words or the figures), else empty.
    """

    plan: Plan
    rank: int
    fits: bool
    compile_s: float
    required_bytes: int | None
    available_bytes: int
    reason: str = ""

    def __str__(self) -> str:
        need = "n/a" if self.required_bytes is None else _size(self.required_bytes)
        verdict = "fits" if self.fits else f"does not fit: {self.reason}"
        mesh = " ".join(f"{axis}={size}" for axis, size in self.plan.mesh if size > 1) or "one device"
        plan = f"{self.plan.cp_strategy.value} {mesh}, remat {self.plan.remat.value}"
        return (f"#{self.rank} {plan}: {need} of {_size(self.available_bytes)} per device, "
                f"compiled in {self.compile_s:.1f} s; {verdict}")


@dataclass
class Preflight:
    """The pre-flight's outcome: every attempt, and the plan that passed with its compiled step.

    Attributes:
        attempts: the plans compiled, in order.
        trainer: the `runtime.train.Trainer` of the plan that passed.
        compiled: its compiled training step.
        memory: its compiler memory figures (None where the backend reports none).
    """

    attempts: list[Attempt] = field(default_factory=list)
    trainer: object = None
    compiled: object = None
    memory: CompiledMemory | None = None

    @property
    def plan(self) -> Plan:
        return self.trainer.plan


def preflight(plans: Sequence[Plan], *, devices, packed: bool = False, max_attempts: int = 4,
              available_bytes: int | None = None, on_attempt=None) -> Preflight:
    """Compiles the plans best first until one fits the devices' memory.

    Args:
        plans: the planner's ranked plans, best first.
        devices: the devices to build the mesh on (all processes').
        packed: compile the step that takes segment ids (packed documents).
        max_attempts: plans to try before giving up.
        available_bytes: memory per device to hold the step against (default: the chip row's).
        on_attempt: called with each `Attempt` as it is made (to say why a plan was left).
    Returns:
        The `Preflight`, with the compiled step of the first plan that fits.
    Raises:
        CpplanError: none of the first `max_attempts` plans fits.
    """
    import jax

    from runtime.mesh import build_mesh
    from runtime.train import Trainer

    result = Preflight()
    for rank, plan in enumerate(plans[:max_attempts], start=1):
        trainer = Trainer(plan, build_mesh(plan, devices))
        have = available_bytes or plan.topology_spec.hbm_bytes_per_device
        start = time.perf_counter()
        try:
            compiled = trainer.train_step.lower(*trainer.abstract_state(packed=packed)).compile()
        except jax.errors.JaxRuntimeError as err:
            parsed = parse_hbm_oom(str(err))
            if parsed is None:
                raise
            need, have = parsed
            attempt = Attempt(plan, rank, False, time.perf_counter() - start, need, have,
                              f"the compiler needs {_size(need)}, the device has {_size(have)}")
            compiled = None
        else:
            memory = CompiledMemory.of(compiled)
            need = None if memory is None else memory.hbm_bytes_per_device
            fits = need is None or need <= have
            reason = "" if fits else f"the compiled step holds {_size(need)}, over {_size(have)}"
            attempt = Attempt(plan, rank, fits, time.perf_counter() - start, need, have, reason)
        result.attempts.append(attempt)
        if on_attempt is not None:
            on_attempt(attempt)
        if attempt.fits:
            result.trainer, result.compiled, result.memory = trainer, compiled, memory
            return result
    raise CpplanError(f"none of the planner's first {len(result.attempts)} plans fits once compiled:\n"
                      + "\n".join(f"  {a}" for a in result.attempts)
                      + "\nPlan a shorter sequence or a smaller batch, or allow more plans (--max-fallbacks).")


def _size(nbytes: int) -> str:
    """Bytes in GiB, or in MiB below one GiB (a host's tiny plans)."""
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB else f"{nbytes / MiB:.2f} MiB"
