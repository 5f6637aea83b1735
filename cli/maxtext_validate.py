"""`cpplan validate --engine maxtext`: the plans validate chooses, priced as MaxText runs them, each trained by
MaxText 0.2.5 and its logged step times compared with that price.

The plans are `validation.steptime.choose_plans`' (the planner's top K, the best of each strategy, a seeded
sample) searched with `--target maxtext` (on a `cpu:N` host, all-gather only: `cli.engine_maxtext.search_args`).
Each is written as a MaxText config under `--out`/maxtext/plan-NN/ and trained for `--steps` steps by
`cli.engine_maxtext.train`, as `cpplan run --engine maxtext` trains its plan, without its pre-flight compile:
the plans are priced to fit, and a plan whose compile or run MaxText ends with an error (out of memory among
them) is that plan's failure, recorded with its reason, and the next one runs. Of the step times MaxText logs
the first (its compile) is skipped and the median of the rest is the measurement: MaxText times a step from its
host loop, which dispatches ahead, so a step's wait can land on the next one (0.405 s then 0.055 s on a host),
and the fastest would understate the step (validate takes the fastest of cpplan's runtime, whose harness blocks
on each step). Each plan becomes a `StepResult`, a line of
measurements.jsonl and a line said, and the report is validate's own (MAPE, Spearman, regret).

SIGTERM or Ctrl-C is passed on to the MaxText trainer in hand, which is waited for; its plan is recorded as
abandoned unless its steps were all logged, and no further plan runs.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from cli import engine_maxtext
from cli.args import model_of, seq_lens
from cost_models.errors import CpplanError
from cost_models.targets import Target
from cost_models.topology import get_topology

PLAN_DIR = "plan-{number:02d}"  # under --out/maxtext: one plan's config, logs, metrics.jsonl and MaxText's outputs
# the engine's own flags of every plan's run: no checkpoints, which a plan's run would otherwise resume from when
# validate runs again into the same --out
RUN_FLAGS = {"enable_checkpointing": False}
# the line of a failed MaxText's log that says why: an out-of-memory or scoped-VMEM error, or a raised exception's
ERROR_LINE = re.compile(r"RESOURCE_EXHAUSTED|ScopedVmem|[Oo]ut of memory|^\S*(Error|Exception)\b")


def refuse_flags(args: argparse.Namespace) -> None:
    """Refuses the validate flags that mean nothing to MaxText, each saying why and what to do instead.

    Raises:
        CpplanError: such a flag given.
    """
    if args.measured is not None:
        raise CpplanError(
            "--measured with --engine maxtext: --measured reads step times measured elsewhere and runs nothing, so "
            "there is nothing for MaxText to run; drop --engine maxtext (a MaxText log is read with --measured LOG "
            "--maxtext-flags FLAGS)."
        )
    if args.maxtext_flags is not None:
        raise CpplanError(
            "--maxtext-flags with --engine maxtext: it describes the run of a log read with --measured; here each "
            "plan's flags are cpplan's, and flags of your own go in --maxtext-arg KEY=VALUE."
        )
    if args.data is not None:
        raise CpplanError(
            f"--data with --engine maxtext: it is read by cpplan's own data loader, which MaxText does not use; "
            f"MaxText has {engine_maxtext.MAXTEXT_EQUIVALENTS['data']} (synthetic tokens by default)."
        )
    if args.compile_ahead != "auto":
        raise CpplanError(
            f"--compile-ahead {args.compile_ahead} with --engine maxtext: MaxText compiles each plan inside its own "
            f"trainer's process, one plan after another, so nothing compiles ahead in this one; drop --compile-ahead."
        )
    host = args.topology is not None and get_topology(args.topology).chip.kind.shares_cores
    if host and (args.blocks is not None or args.both_backwards):
        flag = "--blocks" if args.blocks is not None else "--both-backwards"
        raise CpplanError(
            f"{flag} with --engine maxtext on {args.topology}: on a host MaxText runs attention as dot_product, "
            f"which has no splash blocks or backward kernels to choose; drop {flag}, or validate on a TPU slice "
            f"(where MaxText's sa_block_* and sa_use_fused_bwd_kernel carry them)."
        )


def validate_on_maxtext(args: argparse.Namespace):
    """Runs the plans validate chooses on MaxText and compares each with its MaxText price.

    Returns:
        `(out_dir, StepTimeReport)`; an interrupted run keeps what was measured (``interrupted=True``).
    Raises:
        CpplanError: bad input (the flags refused, a model or flag MaxText cannot take, no MaxText), or no plan fits.
    """
    from cli.devices import note_uncalibrated_host, use_host_devices
    from cli.signals import INTERRUPTS
    from cli.validating import validated_plans
    from planner.maxtext import export_maxtext
    from validation.outputs import prepare_out_dir, write_atomic
    from validation.report import MEASUREMENTS_FILE, STEP_REPORT_FILES, StepTimeReport

    refuse_flags(args)
    if not (args.model and args.seq_lens and args.topology):
        raise CpplanError("cpplan validate --engine maxtext needs --model, --seq-lens and --topology.")
    _, host = engine_maxtext.engine_topology(args)
    searched = engine_maxtext.search_args(args, host)
    lengths, model = seq_lens(args.seq_lens), model_of(searched)  # refused where MaxText runs no strategy of it
    plans = validated_plans(args, model, lengths, searched.strategies, target=Target.MAXTEXT.value)
    python = engine_maxtext.maxtext_python(args)
    words = args.maxtext_arg or []
    for ranked in plans:  # before any work: every plan as MaxText has it, and the user's flags against each
        engine_maxtext.user_flags(words, engine_maxtext.owned_flags(export_maxtext(ranked.plan), host))
    outdir = prepare_out_dir(args.out, STEP_REPORT_FILES)
    if host:
        use_host_devices(args.topology)  # XLA_FLAGS and JAX_PLATFORMS, which MaxText's processes inherit
    note_uncalibrated_host(args.topology)
    notes = sys.stderr if args.json else sys.stdout

    def say(text: str) -> None:
        print(text, file=notes, flush=True)

    note = engine_maxtext.attention_note(plans[0].plan)
    if note:
        say(f"note: {note}")
    journal = write_atomic(outdir / MEASUREMENTS_FILE, "")  # this run's measurements only
    first = plans[0].plan
    report = StepTimeReport(
        f"Step-time validation on MaxText {engine_maxtext.MAXTEXT_VERSION}: {first.model.name} on {first.topology}"
    )
    with INTERRUPTS.deferred():  # a signal is passed on to the trainer in hand, not raised here
        for number, ranked in enumerate(plans, start=1):
            if INTERRUPTS.stopped:  # it came between two plans
                report.interrupted = True
                break
            abandoned = _run_plan(
                ranked,
                number=number,
                total=len(plans),
                work=outdir / engine_maxtext.MAXTEXT_DIR / PLAN_DIR.format(number=number),
                args=args,
                host=host,
                python=python,
                report=report,
                journal=journal,
                say=say,
                interrupts=INTERRUPTS,
            )
            if INTERRUPTS.stopped:
                report.interrupted = abandoned or number < len(plans)  # only if plans were left unmeasured
                break
    return outdir, report


def _run_plan(ranked, *, number, total, work: Path, args, host, python, report, journal, say, interrupts) -> bool:
    """Trains one plan on MaxText and records it in `report` and `journal`; True when a signal abandoned it."""
    from validation.steptime import PlanTiming, record_plan

    work.mkdir(parents=True, exist_ok=True)
    prepared = engine_maxtext.prepare(
        ranked.plan,
        host=host,
        steps=args.steps,
        work=work,
        words=args.maxtext_arg or [],
        flags=RUN_FLAGS,
        cache=not args.no_compile_cache,
    )
    begin = time.perf_counter()
    measured = engine_maxtext.train(
        prepared,
        run_dir=work,
        steps=args.steps,
        python=python,
        say=say,
        interrupts=interrupts,
        label=f"plan {number}/{total}",
    )
    result, abandoned = step_result(ranked, measured, args.steps)
    timing = PlanTiming(run_s=time.perf_counter() - begin, step_times_s=measured.report.step_times_s)
    extra = {
        "engine": "maxtext",
        "maxtext_config": str(prepared.config),
        "maxtext_log": str(measured.log),
        "maxtext_tflops_per_s_per_device": measured.maxtext_tflops_per_device,
        "losses": list(measured.report.losses),
    }
    record_plan(report, result, timing, number=number, total=total, say=say, journal=journal, extra=extra)
    return abandoned


def step_result(ranked, measured, steps: int):
    """A plan's `StepResult` from what MaxText's trainer did (`engine_maxtext.Measured`): measured where it logged
    `steps` steps (the median after the first), else a failure that says why; and whether a signal abandoned it."""
    from validation.report import StepResult
    from validation.steptime import measured_mfu

    result = StepResult(ranked.plan, ranked.estimate)
    run = measured.report
    logged = len(run.step_times_s)
    abandoned = run.stopped and logged < steps
    if measured.failure is not None:
        result.failure = failure_of(measured)
    elif abandoned:
        result.failure = f"abandoned: interrupted after {logged} of {steps} steps"
    elif logged < steps:
        result.failure = f"MaxText's trainer logged {logged} of {steps} steps (its log: {measured.log})"
    else:
        result.measured_step_s = run.step_time_s
        result.measured_median_s = run.step_time_s
        result.measured_mfu = measured_mfu(ranked.estimate, run.step_time_s)
    return result, abandoned


def failure_of(measured) -> str:
    """Why MaxText's trainer failed, in one line: its log's last error line, classed as validate classes its own
    runtime's failures (`validation.steptime.failure_text`), and where the log is."""
    from validation.steptime import failure_text

    lines = [line.strip() for line in measured.log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if ERROR_LINE.search(line)]
    line = (errors or lines or ["no output"])[-1]
    what = f"MaxText's trainer exited with status {measured.returncode}"
    return f"{failure_text(line, what)} (its log: {measured.log})"
