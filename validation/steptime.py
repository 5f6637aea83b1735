"""Step-time validation: price the feasible plans, run a selection of them, compare.

The selection: the planner's top K, the best plan of every strategy, then a seeded sample of
the rest, up to `max_plans` per sequence length, each also with the splash blocks and attention
backwards asked for (`plan_variants`). Runs go one after another under a progress
bar, each result appended to a journal file as it finishes with how long its compile and its steps
took; Ctrl-C (and SIGTERM, which the CLI turns into it) stops them keeping what was measured.

Compiling takes much of the time (on a TPU v5e chip 12–16 s per plan's step at the compiler's default
scoped VMEM, about three times that at the raised limit blocks of 2048 need, and 18 s for the first
plan's initialisers, against 1–30 s of steps), so on an accelerator plans compile in waves: the first
plan not yet compiled compiles beside the next `AHEAD_COMPILES` in threads (compiling only, their arrays
are allocated when their turn comes, after the plan before has freed its own). A plan's steps wait for
its wave's compiles to end: with compiles beside them, a step that offloads to host memory took up to
30 times as long as alone.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial

from tqdm import tqdm

from cost_models.errors import CpplanError
from cost_models.units import mfu
from planner.api import run_search
from planner.estimate import estimate
from planner.search import Ranked
from validation.measured import MeasuredStep
from validation.outputs import append_record
from validation.report import StepResult, StepTimeReport

# Plans compiled beside the first of a wave. On the v5e VM (13 host cores) one compile ahead left validation
# waiting on each next compile; XLA's compiles run beside each other in threads: four at once took 18–23 s
# each against 12–15 s alone (benchmarks/results/tpu_v5e/speed/compile_phases.jsonl).
AHEAD_COMPILES = 3
COMPILE_AHEAD_THREAD = "cpplan-compile-ahead"  # `compiles_in_flight` finds the threads by it
QUIET_POLL_S = 1.0  # how often a plan waiting for its wave's compiles asks whether to stop


def select_plans(ranked: Sequence[Ranked], *, max_plans: int, top: int, seed: int) -> list[Ranked]:
    """The plans to run at one length.

    Args:
        ranked: feasible plans, best predicted first.
        max_plans: at most this many.
        top: the planner's top K first.
        seed: seeds the sample of the rest.
    Returns:
        Top `top`, then the best of each strategy not yet in, then a seeded random sample.
    """
    chosen: list[Ranked] = list(ranked[:top])
    for r in ranked:
        if r.plan.cp_strategy not in {c.plan.cp_strategy for c in chosen}:
            chosen.append(r)
    rest = [r for r in ranked if r not in chosen]
    random.Random(seed).shuffle(rest)
    chosen += rest[: max(0, max_plans - len(chosen))]
    return chosen[:max_plans]


def plan_variants(
    ranked: Ranked, *, blocks: Sequence[int] = (), both_backwards: bool = False, target=None
) -> list[Ranked]:
    """`ranked` and the same plan with each of `blocks` as its splash blocks and, where `both_backwards`,
    with the other attention backward (splash's fused kernel or its dq and dK/dV kernels): each that its
    strategy runs and the price for `target` (None: cpplan's runtime) says fits, priced as it is, `ranked`
    first."""
    plan = ranked.plan
    out = [ranked]
    backwards = (plan.fused_attention_backward, not plan.fused_attention_backward)[: 2 if both_backwards else 1]
    for block in dict.fromkeys((plan.block_q, *blocks)):
        for fused in backwards:
            if (block, fused) == (plan.block_q, plan.fused_attention_backward):
                continue
            try:
                variant = dataclasses.replace(plan, block_q=block, block_kv=block, fused_attention_backward=fused)
                priced = estimate(variant, target=target)
            except CpplanError:  # a block the lengths or the chip's memories refuse
                continue
            if priced.fits:
                out.append(Ranked(variant, priced))
    return out


def choose_plans(
    model,
    seq_lens: Sequence,
    topology: str,
    *,
    sequences: int = 1,
    max_plans: int = 16,
    top: int = 3,
    seed: int = 0,
    blocks: Sequence[int] = (),
    both_backwards: bool = False,
    **options,
) -> list[Ranked]:
    """The plans `validate_step_times` runs, chosen without jax: a TPU's compiler flags (the scoped VMEM
    the chosen splash blocks need) must be set before jax starts its backend. Each chosen plan is run
    with its `plan_variants` too, priced for the runtime `options` names as `target` (cpplan's by default).

    Raises:
        CpplanError: no plan fits at one of the lengths.
    """
    plans = []
    for seq_len in seq_lens:
        result = run_search(model, seq_len, topology, global_batch=sequences, **options)
        if not result.ranked:
            raise CpplanError(
                f"no plan fits {result.model.name} at {seq_len} tokens on {result.topology.name}; "
                "see `cpplan explain` for why."
            )
        for ranked in select_plans(result.ranked, max_plans=max_plans, top=top, seed=seed):
            plans += plan_variants(ranked, blocks=blocks, both_backwards=both_backwards, target=options.get("target"))
    return plans


def validate_step_times(
    model,
    seq_lens: Sequence,
    topology: str,
    *,
    sequences: int = 1,
    max_plans: int = 16,
    top: int = 3,
    steps: int = 3,
    seed: int = 0,
    data=None,
    journal=None,
    stop: "Callable[[], bool] | None" = None,
    plans: "Sequence[Ranked] | None" = None,
    compile_ahead: bool | None = None,
    say: Callable[[str], None] = tqdm.write,
    **options,
) -> StepTimeReport:
    """Runs a selection of feasible plans per sequence length and compares with their prices.

    Args:
        model, topology, **options: as for `planner.explain` (but global_batch_tokens).
        seq_lens: lengths to validate.
        sequences: sequences per step at every length.
        max_plans / top / seed: the selection (see `select_plans`).
        steps: steps per run; the measured step time is the fastest after the first (the median is kept too).
        data: text file for the runs (synthetic tokens when None).
        journal: a file each plan's result is appended to (one JSON line) as soon as it is
            measured, so that a killed run keeps them; None keeps them in memory only.
        stop: asked after each step; True abandons the plan in hand (kept as a failure that says so)
            unless its steps are all done (then it is measured), and ends the run as an interrupt does
            (the CLI's signal handler sets it rather than raising inside jax).
        plans: the plans to run (`choose_plans`' answer); None chooses them here.
        compile_ahead: compile the next `AHEAD_COMPILES` plans, each in a thread, beside the first plan of a
            wave, and time each plan's steps once its wave's compiles have ended; None: on an accelerator,
            not on CPU devices, whose steps the compiles would slow by sharing their cores.
        say: gets a line per plan (`plan_line`) as it is done.
    Returns:
        A `StepTimeReport`; interrupted runs keep what was measured (``interrupted=True``).
    Raises:
        CpplanError: no plan fits at one of the lengths.
    """
    import jax

    from runtime import run
    from runtime.runner import compile_plan

    if plans is None:
        plans = choose_plans(
            model, seq_lens, topology, sequences=sequences, max_plans=max_plans, top=top, seed=seed, **options
        )
    if compile_ahead is None:
        compile_ahead = jax.default_backend() != "cpu"
    report = StepTimeReport(f"Step-time validation: {plans[0].plan.model.name} on {plans[0].plan.topology}")
    progress = tqdm(plans, desc="validate", unit="plan")
    ahead: dict[int, PlanCompile] = {}  # the later plans of this plan's wave, compiled in threads
    try:
        for index, ranked in enumerate(progress):
            progress.set_postfix_str(f"{ranked.plan.strategy_label} seq {ranked.plan.seq_len}")
            result = StepResult(ranked.plan, ranked.estimate)
            abandoned = False
            job = ahead.pop(index, None)
            if job is None:  # the first plan of a wave
                job = PlanCompile(partial(compile_plan, ranked.plan, steps=steps))
                if compile_ahead:
                    for later in range(index + 1, min(len(plans), index + 1 + AHEAD_COMPILES)):
                        ahead[later] = PlanCompile(partial(compile_plan, plans[later].plan, steps=steps), ahead=True)
            # its compile's failure, raised in `run`, is this plan's; its steps start once the wave's compiles end
            compiled = partial(job.result, then_wait_for=tuple(ahead.values()), stop=stop)

            begin = time.perf_counter()
            measured = None
            try:
                measured = run(
                    ranked.plan,
                    steps=steps,
                    data=data,
                    seed=seed,
                    should_stop=stop or (lambda: False),
                    compiled=compiled,
                )
                abandoned = measured.stopped  # the plan in hand is abandoned, not measured on fewer steps
                if abandoned:
                    result.failure = f"abandoned: interrupted after {len(measured.step_times_s)} of {steps} steps"
                else:
                    result.measured_step_s = measured.best_step_s
                    result.measured_median_s = measured.step_time_s
                    result.measured_mfu = measured_mfu(ranked.estimate, measured.best_step_s)
            except StoppedBeforeSteps as err:
                abandoned = True
                result.failure = str(err)
            except Exception as err:  # one plan's failure (a compile, HBM) is its result; the next is measured
                result.failure = failure_reason(err)
                gc.collect()  # the failed plan's arrays and executables, before the next plan allocates
            timing = PlanTiming.of(job, time.perf_counter() - begin, measured)
            record_plan(report, result, timing, number=index + 1, total=len(plans), say=say, journal=journal)
            if stop is not None and stop():
                # interrupted only if plans were left unmeasured
                report.interrupted = abandoned or len(report.results) < len(plans)
                break
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        progress.close()
    return report


def compiles_in_flight() -> bool:
    """Whether a compile-ahead thread is still compiling (a plan an interrupted validation will not run)."""
    return any(t.name == COMPILE_AHEAD_THREAD and t.is_alive() for t in threading.enumerate())


class StoppedBeforeSteps(CpplanError):
    """Told to stop while its wave compiled: the plan is abandoned before a step runs beside the compiles."""


class PlanCompile:
    """One plan's `compile_plan`, in a thread of its own (`ahead`) or in the caller's when its result is
    first asked for; `result()` gives the compiled plan or raises the compile's error."""

    def __init__(self, compile_fn: Callable[[], object], *, ahead: bool = False):
        self.ahead = ahead
        self.seconds: float | None = None  # the compile's own wall time, in whichever thread it ran
        self.waited_s = 0.0  # how long `result` waited for it
        self.quiet_wait_s = 0.0  # how long `result` then waited for the other compiles it was given
        self._fn, self._value, self._error = compile_fn, None, None
        self._done = threading.Event()
        if ahead:
            # a daemon: an interrupted validation exits without waiting for a plan it will not run
            threading.Thread(target=self._compile, name=COMPILE_AHEAD_THREAD, daemon=True).start()

    def _compile(self) -> None:
        begin = time.perf_counter()
        try:
            self._value = self._fn()
        except BaseException as err:  # raised again, in the caller's thread, by `result`
            self._error = err
        finally:
            self.seconds = time.perf_counter() - begin
            self._done.set()

    @property
    def compiles(self):
        """The compiled plan's `runtime.compile_cache.Compiles`, None until it compiled (or if it failed)."""
        return getattr(self._value, "compiles", None)

    def result(self, then_wait_for: Sequence["PlanCompile"] = (), stop: "Callable[[], bool] | None" = None):
        """The compiled plan, once the compiles `then_wait_for` have ended too, so that its steps share the
        host with none.

        Raises:
            StoppedBeforeSteps: `stop` said to stop while it waited for them.
        """
        begin = time.perf_counter()
        if not self.ahead and not self._done.is_set():
            self._compile()
        self._done.wait()
        self.waited_s += time.perf_counter() - begin
        if self._error is not None:
            raise self._error
        pending = [other for other in then_wait_for if not other._done.is_set()]
        if not pending:
            return self._value
        begin = time.perf_counter()
        try:
            for other in pending:
                while not other._done.wait(QUIET_POLL_S):
                    if stop is not None and stop():
                        raise StoppedBeforeSteps("abandoned: interrupted before its steps, while its wave compiled")
        finally:
            self.quiet_wait_s += time.perf_counter() - begin
        return self._value


@dataclasses.dataclass
class PlanTiming:
    """Where one plan's time went: its compile (ahead or not, how long validation waited for it, how
    many programs and how many the persistent cache answered) and its run (initialising and steps)."""

    compile_s: float | None = None  # None: not compiled (the run failed before it asked)
    compile_wait_s: float = 0.0
    quiet_wait_s: float = 0.0  # how long its steps waited for the rest of its wave's compiles to end
    compiled_ahead: bool = False
    compiles: int | None = None  # None: not compiled, or the compile failed
    compile_cache_hits: int | None = None
    compile_cache: str | None = None  # `Compiles.describe`
    run_s: float = 0.0  # the run's wall time but the waits for compiles: initialising, batches, steps
    step_times_s: tuple[float, ...] = ()

    @classmethod
    def of(cls, job: PlanCompile, total_s: float, measured) -> "PlanTiming":
        """The figures of a plan whose `job` compiled it and whose run took `total_s` in all and reported
        `measured` (None: it failed)."""
        counts = job.compiles
        return cls(
            compile_s=job.seconds,
            compile_wait_s=job.waited_s,
            quiet_wait_s=job.quiet_wait_s,
            compiled_ahead=job.ahead,
            compiles=None if counts is None else counts.compiled,
            compile_cache_hits=None if counts is None else counts.cache_hits,
            compile_cache=None if counts is None else counts.describe(),
            run_s=total_s - job.waited_s - job.quiet_wait_s,
            step_times_s=() if measured is None else tuple(measured.step_times_s),
        )

    def to_dict(self) -> dict:
        fields = dataclasses.asdict(self)
        fields["step_times_s"] = list(self.step_times_s)
        fields["steps"] = len(self.step_times_s)
        fields["steps_s"] = sum(self.step_times_s)
        return fields


def record_plan(
    report: StepTimeReport,
    result: StepResult,
    timing: PlanTiming,
    *,
    number: int,
    total: int,
    say: Callable[[str], None],
    journal=None,
    extra: dict | None = None,
) -> dict:
    """Adds one plan's `result` to `report`, says its `plan_line` (it is plan `number` of `total`) and appends
    its record (the result, its `timing`, and `extra` fields) to the `journal` file, where there is one.
    Returns:
        The record.
    """
    report.results.append(result)
    record = result.to_dict() | timing.to_dict() | (extra or {})
    say(plan_line(number, total, record))
    if journal is not None:
        append_record(journal, record)
    return record


def plan_line(number: int, total: int, record: dict) -> str:
    """One plan's line from its journal `record`: what it is, how long its compile and its steps took,
    and its failure if any; e.g. `plan 3/12 ring [context=4] full, blocks 512 at 2048 tokens: compile
    41.2 s (cache hit), steps 3 in 2.46 s (best 0.612 s)`."""
    parts = [f"plan {number}/{total} {record['label']} at {record['seq_len']} tokens:"]
    if record["compile_s"] is not None:
        how = record["compile_cache"] or "failed"
        if record["compiled_ahead"]:
            how += f"; ahead, waited {record['compile_wait_s']:.1f} s"
        if record["quiet_wait_s"] >= 0.05:
            how += f"; then {record['quiet_wait_s']:.1f} s for its wave's other compiles"
        parts.append(f"compile {record['compile_s']:.1f} s ({how})")
    if record["steps"]:
        times = record["step_times_s"]
        best = min(times[1:] or times)
        parts.append(f"steps {record['steps']} in {record['steps_s']:.2f} s (best {best:.3g} s)")
    line = parts[0] + " " + ", ".join(parts[1:])
    if record["failure"]:
        line += f"; {record['failure']}"
    return line


def measured_mfu(predicted, step_s: float) -> float:
    """MFU of a measured step against the same chip row's peak the prediction used."""
    return mfu(predicted.model_flops, step_s, predicted.num_devices, predicted.peak_flops_per_device)


def compare_measured(steps: Sequence[MeasuredStep]) -> StepTimeReport:
    """Predictions for step times measured elsewhere (a CSV, or a MaxText run).

    Args:
        steps: the imported measurements.
    Returns:
        A `StepTimeReport` with one row per measurement.
    """
    report = StepTimeReport("Predicted vs imported measurements")
    for s in steps:
        e = estimate(s.plan)
        report.results.append(StepResult(s.plan, e, s.step_seconds, measured_mfu(e, s.step_seconds), source=s.source))
    return report


FAILURE_CHARS = 400  # a compiler's message runs to pages; the report keeps its gist


def failure_reason(err: BaseException) -> str:
    """Why a plan was not measured, in one line: cpplan's own refusal as it stands, or the compiler's
    or runtime's error classed as scoped VMEM, HBM or another failure, with its first line."""
    if isinstance(err, CpplanError):
        return str(err)
    return failure_text(str(err).strip(), type(err).__name__)


def failure_text(text: str, name: str) -> str:
    """`failure_reason` of an error's `text`: classed as scoped VMEM, HBM or another failure (`name` says what
    failed), with its first line."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), name)
    if "ScopedVmem" in text or "scoped allocation" in text.lower():
        kind = "does not compile: splash's scoped VMEM exceeds the compiler's limit"
    elif "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower() or "HbmOom" in text:
        kind = "out of memory"
    else:
        kind = f"failed ({name})"
    detail = first if len(first) <= FAILURE_CHARS else first[: FAILURE_CHARS - 1] + "…"
    return f"{kind}: {detail}"
