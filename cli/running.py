"""The commands that run a plan: run (train on the devices present) and compile (deviceless)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import signal
import sys
from pathlib import Path

from cli import engine_maxtext
from cli.args import (
    add_command,
    add_optimizer_options,
    add_search_options,
    at_least,
    directory,
    model_of,
    optimizer_of,
    search_options,
    to_json,
)
from cli.devices import (
    check_data,
    import_runtime,
    note_uncalibrated_host,
    on_a_tpu_vm,
    use_deviceless_tpu,
    use_host_devices,
)
from cli.signals import INTERRUPTS
from cost_models.chips import ChipKind
from cost_models.errors import CpplanError
from cost_models.targets import Target
from cost_models.topology import get_topology
from cost_models.units import GiB, MiB
from planner import api
from planner.explanation import Explanation, backward_text, describe_strategy


def cmd_run(args: argparse.Namespace) -> int:
    """Plans, compiles ahead of time (falling back to the next plan that fits), trains with
    checkpoints and metrics, and prints measured figures next to predicted ones (`--engine maxtext`:
    MaxText trains it, `cli.engine_maxtext`)."""
    if args.engine == "maxtext" and (args.init_from or args.export_hf):
        raise CpplanError(
            "--init-from and --export-hf read and write the weights of cpplan's runtime; drop --engine maxtext "
            "to use them."
        )
    if args.engine == "maxtext":
        return engine_maxtext.run_maxtext(args)
    from runtime.distributed import ProcessGroup

    group = ProcessGroup(args.coordinator, args.num_processes, args.process_id)
    group.check()
    topo = get_topology(args.topology, args.num_slices)
    check_data(args.data)
    profile = profile_steps(args.profile_steps, args.steps)
    optimizer = optimizer_of(args)
    if topo.chip.kind.shares_cores:
        use_host_devices(args.topology, processes=group.count)
    elif not on_a_tpu_vm():
        raise CpplanError(
            f"`cpplan run` runs on the devices present; {topo.name} is a TPU slice and this host has "
            f"no TPU: launch it on every TPU VM of the slice (see the README). Use `cpplan compile` to "
            f"compile for it deviceless, or plan for cpu:8."
        )
    search = api.run_search(model_of(args), args.seq_len, args.topology, **search_options(args))
    explanation = Explanation(search)
    if explanation.best is None:
        raise CpplanError(explanation.nothing_fits_text())
    from runtime.launch import Launch, check_world

    request = Launch(
        steps=args.steps,
        run_dir=Path(args.run_dir),
        data=args.data,
        pack=args.pack,
        data_dtype=args.data_dtype,
        eos_id=args.eos_id,
        seed=args.seed,
        max_fallbacks=args.max_fallbacks,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        resume=args.resume,
        resume_from=args.resume_from,
        join_timeout_s=args.join_timeout,
        profile_steps=profile,
        init_from=None if args.init_from is None else Path(args.init_from),
        rope_theta=args.rope_theta,
        export_hf=None if args.export_hf is None else Path(args.export_hf),
        optimizer=optimizer,
    )
    check_world(search.ranked[0].plan, group, request)
    note_uncalibrated_host(args.topology)  # before the run, which takes a while
    import_runtime()
    from runtime.distributed import is_leader
    from runtime.launch import prepare, train_checked

    notes = sys.stderr if args.json else sys.stdout

    def say(text: str) -> None:  # the leader speaks for every process
        if is_leader():
            print(text, file=notes, flush=True)

    from runtime.compile_cache import use_compile_cache

    say(use_compile_cache(not args.no_compile_cache))

    # a signal during a compile is recorded and acted on between compiles: raised inside the
    # compiler it would not unwind cleanly
    with INTERRUPTS.deferred():
        checked, dataset = prepare(
            [r.plan for r in search.ranked], group, request, say=say, should_stop=lambda: INTERRUPTS.stopped
        )
    if INTERRUPTS.stopped:
        name = signal.Signals(INTERRUPTS.received[-1]).name
        print(f"cpplan: stopped by {name} during the pre-flight compile; nothing was trained", file=sys.stderr)
        return INTERRUPTS.exit_status()
    if args.dry_run:
        return _report_run(args, checked, None, is_leader())
    from planner.estimate import estimate

    say(f"optimizer: {optimizer}")
    with INTERRUPTS.deferred():  # stop after the step in hand and save, rather than raise inside jax
        report = train_checked(
            checked,
            dataset,
            request,
            should_stop=lambda: INTERRUPTS.stopped,
            say=say,
            predicted_step_s=estimate(checked.plan).step_time_s,
        )
    return _report_run(args, checked, report, is_leader())


def _report_run(args: argparse.Namespace, checked, report, leader: bool) -> int:
    """Prints what a run did on the leader: the dry run's verdict (no report), or measured next to predicted."""
    from planner.estimate import estimate

    plan = checked.plan
    if report is None:
        if leader:
            print(
                to_json({"plan": plan.to_dict(), "preflight": [attempt_dict(a) for a in checked.attempts]})
                if args.json
                else f"{plan_line(plan)}\ndry run: plan #{checked.attempts[-1].rank} compiles and fits; "
                f"stopping before the first step"
            )
        return 0
    if report.stopped:
        if leader:
            name = (
                signal.Signals(INTERRUPTS.received[-1]).name if INTERRUPTS.stopped else "a preemption notice (SIGTERM)"
            )
            print(
                f"cpplan: stopped by {name} after step {report.first_step + len(report.losses)}; checkpoint saved "
                f"in {Path(args.run_dir) / 'checkpoints'}; run the same command to resume",
                file=sys.stderr,
            )
        return INTERRUPTS.exit_status(signal.SIGTERM)
    if not leader:
        return 0
    if not report.losses:
        print(
            f"nothing to run: the checkpoint in {args.run_dir} is at step {report.first_step} of {args.steps}; "
            f"give more --steps to train on.",
            file=sys.stderr if args.json else sys.stdout,
            flush=True,
        )
        return 0
    predicted = estimate(plan)
    peak = report.peak_memory_bytes
    measured_hbm = report.hbm_bytes_per_device if peak is None else peak
    if args.json:
        print(
            to_json(
                {
                    "plan": plan.to_dict(),
                    "preflight": [attempt_dict(a) for a in checked.attempts],
                    "first_step": report.first_step,
                    "losses": list(report.losses),
                    "predicted": {
                        "step_time_s": predicted.step_time_s,
                        "mfu": predicted.mfu,
                        "hbm_bytes_per_device": predicted.hbm_bytes_per_device,
                    },
                    "measured": {
                        "step_time_s": report.step_time_s,
                        "best_step_s": report.best_step_s,
                        "mfu": report.mfu,
                        "compile_s": report.compile_s,
                        "hbm_bytes_per_device": report.hbm_bytes_per_device,
                        "peak_memory_bytes": peak,
                    },
                }
            )
        )
        return 0
    print(plan_line(plan))
    print(f"measured:  {report}")
    source = "compiler" if peak is None else "device peak"
    hbm = "n/a" if measured_hbm is None else f"{measured_hbm / MiB:.1f} MiB"
    print(f"{'':10}{'predicted':>14}{'measured':>14}")
    print(f"{'step':10}{predicted.step_time_s * 1e3:>12.1f}ms{report.step_time_s * 1e3:>12.1f}ms")
    print(f"{'MFU':10}{predicted.mfu:>14.1%}{report.mfu:>14.1%}")
    print(f"{'HBM/dev':10}{predicted.hbm_bytes_per_device / MiB:>11.1f}MiB{hbm:>14}  ({source})")
    print(f"metrics in {Path(args.run_dir) / 'metrics.jsonl'}, TensorBoard in {Path(args.run_dir) / 'tensorboard'}")
    return 0


def plan_line(plan) -> str:
    """The plan in one line for people (`--json` gives it whole)."""
    return (
        f"plan: {describe_strategy(plan)}; mesh {plan.mesh_dict}; remat {plan.remat_label}; splash blocks "
        f"{plan.block_q}×{plan.block_kv}, backward {backward_text(plan, Target.CPPLAN)}; {plan.global_batch} × "
        f"{plan.seq_len} tokens on {plan.topology}"
    )


def attempt_dict(attempt) -> dict:
    return {
        "rank": attempt.rank,
        "plan": attempt.plan.to_dict(),
        "fits": attempt.fits,
        "compile_s": attempt.compile_s,
        "required_bytes": attempt.required_bytes,
        "available_bytes": attempt.available_bytes,
        "reason": attempt.reason,
        "compiled": attempt.compiled,
    }


def rope_theta(text: str) -> float:
    """--rope-theta: a finite number above 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 1 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number above 1, e.g. 500000")
    return value


def profile_steps(text: str | None, steps: int) -> tuple[int, int] | None:
    """`A:B` as the first and last steps (counted from 1) to trace, or None."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9]+)\s*:\s*([0-9]+)\s*", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]) <= steps:
        raise CpplanError(
            f"--profile-steps {text!r}: write FIRST:LAST with 1 <= FIRST <= LAST <= --steps ({steps}), e.g. 2:{steps}."
        )
    return int(match[1]), int(match[2])


def cmd_compile(args: argparse.Namespace) -> int:
    """Plans, compiles the best plan deviceless for the TPU slice (in a child process: the next-ranked
    plan where the compiler makes none of it, aborting or refusing), and prints memory against the
    prediction."""
    if get_topology(args.topology).chip.kind is not ChipKind.TPU:
        raise CpplanError(
            f"cpplan compile compiles for TPU slices (deviceless, with libtpu); {args.topology} is not one: "
            f"`cpplan run --topology {args.topology}` runs a plan on a host's devices."
        )
    use_deviceless_tpu()
    search = api.run_search(model_of(args), args.seq_len, args.topology, **search_options(args))
    if search.best is None:
        raise CpplanError(Explanation(search).nothing_fits_text())
    from planner.estimate import estimate
    from runtime.compile import compile_in_child
    from runtime.preflight import Attempt

    plans = [r.plan for r in search.ranked[: args.max_fallbacks]]
    notes = sys.stderr if args.json else sys.stdout
    failed = []
    for rank, plan in enumerate(plans, start=1):
        report = compile_in_child(plan)
        if not report.failure:
            break
        failed.append(Attempt(plan, rank, False, report.compile_s, None, report.available_bytes, report.failure, False))
        after = f"; compiling plan #{rank + 1}" if rank < len(plans) else ""
        print(f"  {failed[-1]}{after}", file=notes, flush=True)
    else:
        print(
            f"cpplan: the TPU compiler made no program of the planner's first {len(plans)} plans (each failure "
            f"above); allow more plans (--max-fallbacks), or plan another remat policy or strategy "
            f"(--remat, --strategies).",
            file=sys.stderr,
        )
        return 1
    predicted = estimate(plan)
    if args.json:
        compiled = {f.name: getattr(report, f.name) for f in dataclasses.fields(report) if f.name != "plan"}
        print(
            to_json(
                {
                    "plan": plan.to_dict(),
                    "rank": rank,
                    "failed": [attempt_dict(a) for a in failed],
                    "compiled": {**compiled, "required_bytes": report.required_bytes},
                    "predicted": predicted.to_dict(),
                }
            )
        )
        return 0 if report.fits else 1
    if failed:
        print(f"plan #{rank} compiled in their place")
    print(plan_line(plan))
    print(f"compiled:  {report}")
    print(
        f"predicted: {predicted.hbm_bytes_per_device / GiB:.2f} GiB per device "
        f"({predicted.verdict}); compiler: {report.required_gib:.2f} GiB "
        f"({'fits' if report.fits else 'does not fit'})"
    )
    for note in predicted.notes:
        print(f"not priced: {note}")
    return 0 if report.fits else 1


def register(sub) -> None:
    """Adds run and compile to the subparsers `sub`."""
    p = add_command(
        sub,
        "run",
        cmd_run,
        "plan, pre-flight compile, train with checkpoints and metrics, report (cpu:N "
        "host or TPU pod, one or many processes)",
    )
    add_search_options(p)
    engine_maxtext.add_arguments(p)
    add_optimizer_options(p)
    p.add_argument(
        "--steps",
        type=at_least(2),
        default=5,
        help="train until this many steps are done (a resumed run does the rest; the median skips the first)",
    )
    p.add_argument("--seed", type=at_least(0), default=0, help="parameter and data seed")
    p.add_argument(
        "--pack",
        action="store_true",
        help="keep the documents of a row apart (segment ids through splash); needs --eos-id or ArrayRecord --data",
    )
    p.add_argument(
        "--run-dir",
        type=directory,
        default="cpplan-run",
        help="directory for metrics.jsonl, TensorBoard events, checkpoints/ and profile/",
    )
    p.add_argument(
        "--checkpoint-every",
        type=at_least(0),
        help="save a checkpoint every this many steps (0: only at the end and when stopped; default: as often as "
        "keeps a save under 2%% of the step time, from the checkpoint's bytes at a TPU VM boot disk's write "
        "bandwidth and the plan's predicted step time, then from the first save, timed)",
    )
    p.add_argument("--keep-checkpoints", type=at_least(1), default=3, help="checkpoints kept, newest first")
    p.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="continue from the newest checkpoint in --run-dir when there is one; --no-resume refuses a "
        "directory that has one",
    )
    p.add_argument(
        "--resume-from",
        type=at_least(1),
        metavar="STEP",
        help="resume from the checkpoint of this step rather than the newest that reads whole (an unreadable "
        "newer one is set aside)",
    )
    p.add_argument("--dry-run", action="store_true", help="stop after the pre-flight compile and print its report")
    p.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="compile afresh: no persistent compilation cache (by default one in $JAX_COMPILATION_CACHE_DIR, else "
        "$XDG_CACHE_HOME/cpplan/jax or ~/.cache/cpplan/jax)",
    )
    p.add_argument(
        "--max-fallbacks", type=at_least(1), default=4, help="plans to pre-flight, best first, before giving up"
    )
    p.add_argument(
        "--profile-steps", help="FIRST:LAST steps (from 1) to trace with the jax profiler into --run-dir/profile"
    )
    p.add_argument(
        "--init-from",
        type=directory,
        metavar="DIR",
        help="start from a Hugging Face llama or mistral checkpoint (config.json and safetensors), with its RoPE "
        "and norm epsilon; plan its own config (--model DIR/config.json). A resumed run continues its checkpoint",
    )
    p.add_argument(
        "--rope-theta",
        type=rope_theta,
        metavar="THETA",
        help="RoPE's base frequency, in place of the --init-from config's (default there) or Llama 3's 500000",
    )
    p.add_argument(
        "--export-hf",
        type=directory,
        metavar="DIR",
        help="after the last step, write the weights as Hugging Face safetensors and a config.json transformers loads",
    )
    p.add_argument(
        "--coordinator", help="host:port of process 0, for several processes off a TPU VM (on TPU VMs jax finds it)"
    )
    p.add_argument(
        "--join-timeout",
        type=at_least(1),
        default=120,
        metavar="SECONDS",
        help="how long a process waits for the coordinator and its peers before it gives up with one line",
    )
    p.add_argument("--num-processes", type=at_least(1), help="processes in the run (with --coordinator)")
    p.add_argument("--process-id", type=at_least(0), help="this process's index (with --coordinator)")
    p = add_command(sub, "compile", cmd_compile, "plan, then compile deviceless for a TPU slice")
    add_search_options(p)
    p.add_argument(
        "--max-fallbacks",
        type=at_least(1),
        default=4,
        help="plans to compile, best first, while the compiler makes no program of them (aborts or refuses)",
    )
