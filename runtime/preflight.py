"""Pre-flight: compile the ranked plans best first until one fits, and run the executable that passed.
On TPUs a misfit fails in the compiler (`CompileTimeHbmOom`); elsewhere the compiler's figures are
held against the chip row's memory. Each plan left behind says why.
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
    """One plan compiled in the pre-flight."""

    plan: Plan
    rank: int  # place in the planner's ranking, 1 = best
    fits: bool
    compile_s: float  # lowering plus compiling
    required_bytes: int | None  # per device, as the compiler reports it (None where it reports none)
    available_bytes: int  # the device memory the step is held against
    reason: str = ""  # why it does not fit: the compiler's words or the figures

    def __str__(self) -> str:
        need = "n/a" if self.required_bytes is None else _size(self.required_bytes)
        verdict = "fits" if self.fits else f"does not fit: {self.reason}"
        mesh = " ".join(f"{axis}={size}" for axis, size in self.plan.mesh if size > 1) or "one device"
        plan = f"{self.plan.strategy_label} {mesh}, remat {self.plan.remat_label}"
        return (
            f"#{self.rank} {plan}: {need} of {_size(self.available_bytes)} per device, "
            f"compiled in {self.compile_s:.1f} s; {verdict}"
        )


@dataclass
class Preflight:
    """The pre-flight's outcome: every attempt, and the plan that passed with its compiled step."""

    attempts: list[Attempt] = field(default_factory=list)
    trainer: object = None  # the passing plan's runtime.train.Trainer
    compiled: object = None
    memory: CompiledMemory | None = None

    @property
    def plan(self) -> Plan:
        return self.trainer.plan


def preflight(
    plans: Sequence[Plan],
    *,
    devices,
    packed: bool = False,
    max_attempts: int = 4,
    available_bytes: int | None = None,
    on_attempt=None,
    should_stop=None,
) -> Preflight:
    """Compiles `plans` (ranked, best first) on `devices` until one fits `available_bytes` per device
    (default: the chip row's), trying at most `max_attempts`; `packed` compiles the step with segment
    ids; `on_attempt` gets each `Attempt` as it is made; `should_stop` (asked after each) ends it early,
    returning what was tried with no plan chosen.

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
            attempt = Attempt(
                plan,
                rank,
                False,
                time.perf_counter() - start,
                need,
                have,
                f"the compiler needs {_size(need)}, the device has {_size(have)}",
            )
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
        if should_stop is not None and should_stop():
            return result
    raise CpplanError(
        f"none of the planner's first {len(result.attempts)} plans fits once compiled:\n"
        + "\n".join(f"  {a}" for a in result.attempts)
        + "\nPlan a shorter sequence or a smaller batch, or allow more plans (--max-fallbacks)."
    )


def _size(nbytes: int) -> str:
    """Bytes in GiB, or in MiB below one GiB (a host's tiny plans)."""
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB else f"{nbytes / MiB:.2f} MiB"
