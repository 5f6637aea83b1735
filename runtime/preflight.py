"""Pre-flight: compile the ranked plans best first until one fits, and run the executable that passed.
On TPUs each plan is first compiled deviceless in a child process (`runtime.compile.compile_in_child`):
a compiler that aborts ends the child alone, and a misfit fails there (`CompileTimeHbmOom`); the plan
that passes is then compiled here, on the devices. Elsewhere the compiler's figures are held against
the chip row's memory. Each plan left behind says why.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from cost_models.chips import ChipKind
from cost_models.errors import CpplanError
from cost_models.units import GiB, MiB
from planner.plan import Plan
from runtime.compile import CompiledMemory, compile_in_child, parse_hbm_oom


@dataclass(frozen=True)
class Attempt:
    """One plan compiled in the pre-flight."""

    plan: Plan
    rank: int  # place in the planner's ranking, 1 = best
    fits: bool
    compile_s: float  # lowering plus compiling
    required_bytes: int | None  # per device, as the compiler reports it (None where it reports none)
    available_bytes: int  # the device memory the step is held against
    reason: str = ""  # why it does not fit, or why no program came out: the compiler's words or the figures
    compiled: bool = True  # False: the compiler made no program (it aborted or refused the step)

    def __str__(self) -> str:
        need = "n/a" if self.required_bytes is None else _size(self.required_bytes)
        verdict = "fits" if self.fits else f"does not fit: {self.reason}" if self.compiled else f"failed: {self.reason}"
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
    constants=None,
    optimizer=None,
) -> Preflight:
    """Compiles `plans` (ranked, best first) on `devices` until one fits `available_bytes` per device
    (default: the chip row's), trying at most `max_attempts`; `packed` compiles the step with segment
    ids; `on_attempt` gets each `Attempt` as it is made; `should_stop` (asked after each) ends it early,
    returning what was tried with no plan chosen; `constants` (`runtime.model.ModelConstants`, None: Llama
    3's) and `optimizer` (`runtime.optimizer.AdamW`, None: its defaults) go to each plan's trainer. On a
    TPU each plan is compiled deviceless in a child process first: one whose compiler aborts or refuses it,
    or finds it over HBM, is left there, and only the plan that passes is compiled on `devices`.

    Raises:
        CpplanError: none of the first `max_attempts` plans compiles and fits.
    """
    result = Preflight()
    for rank, plan in enumerate(plans[:max_attempts], start=1):
        have = available_bytes or plan.topology_spec.hbm_bytes_per_device
        checked_s = 0.0
        if plan.topology_spec.chip.kind is ChipKind.TPU:  # the TPU compiler can end its process
            report = compile_in_child(plan, packed=packed, should_stop=should_stop)
            if report is None:  # stopped while it compiled
                return result
            checked_s = report.compile_s
            attempt = _refused(plan, rank, report, have)
        else:
            attempt = None
        trainer = compiled = memory = None
        if attempt is None:
            attempt, trainer, compiled, memory = _compile_here(
                plan, rank, devices, packed, have, checked_s, constants, optimizer
            )
        result.attempts.append(attempt)
        if on_attempt is not None:
            on_attempt(attempt)
        if attempt.fits:
            result.trainer, result.compiled, result.memory = trainer, compiled, memory
            return result
        if should_stop is not None and should_stop():
            return result
    raise CpplanError(
        f"none of the planner's first {len(result.attempts)} plans compiles and fits:\n"
        + "\n".join(f"  {a}" for a in result.attempts)
        + "\nPlan a shorter sequence or a smaller batch, or allow more plans (--max-fallbacks)."
    )


def _refused(plan: Plan, rank: int, report, have: int) -> Attempt | None:
    """The attempt a child compile ends, where it ends one (no program, or over HBM); None where the
    step compiled and is to be compiled here, on the devices."""
    if report.failure:
        return Attempt(plan, rank, False, report.compile_s, None, have, report.failure, compiled=False)
    if not report.fits:
        need, have = report.oom_required_bytes, report.available_bytes
        reason = f"the compiler needs {_size(need)}, the device has {_size(have)}"
        return Attempt(plan, rank, False, report.compile_s, need, have, reason)
    return None


def _compile_here(
    plan: Plan, rank: int, devices, packed: bool, have: int, checked_s: float, constants=None, optimizer=None
):
    """Compiles the plan's step on `devices` in this process: `(attempt, trainer, compiled, memory)`,
    the last three None where it does not fit. `checked_s`: seconds its child compile took."""
    import jax

    from runtime.mesh import build_mesh
    from runtime.train import Trainer

    trainer = Trainer(plan, build_mesh(plan, devices), constants=constants, optimizer=optimizer)
    start = time.perf_counter()
    try:
        compiled = trainer.compile_step(packed=packed)
    except jax.errors.JaxRuntimeError as err:
        parsed = parse_hbm_oom(str(err))
        if parsed is None:
            raise
        need, have = parsed
        reason = f"the compiler needs {_size(need)}, the device has {_size(have)}"
        return Attempt(plan, rank, False, checked_s + time.perf_counter() - start, need, have, reason), None, None, None
    memory = CompiledMemory.of(compiled)
    need = None if memory is None else memory.hbm_bytes_per_device
    fits = need is None or need <= have
    reason = "" if fits else f"the compiled step holds {_size(need)}, over {_size(have)}"
    attempt = Attempt(plan, rank, fits, checked_s + time.perf_counter() - start, need, have, reason)
    return (attempt, trainer, compiled, memory) if fits else (attempt, None, None, None)


def _size(nbytes: int) -> str:
    """Bytes in GiB, or in MiB below one GiB (a host's tiny plans)."""
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB else f"{nbytes / MiB:.2f} MiB"
