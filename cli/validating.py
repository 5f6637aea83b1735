"""The measuring commands: calibrate (a chip row of this machine), validate (step times) and
validate-memory (HBM against the deviceless compiler)."""

from __future__ import annotations

import argparse
import os
import sys

from tqdm import tqdm

from cli import engine_maxtext
from cli.args import (
    FULL_MASK_HELP,
    add_command,
    add_html,
    at_least,
    block_sizes,
    csv_words,
    html_target,
    model_of,
    seq_lens,
    to_json,
    write_html,
)
from cli.devices import check_data, check_devices, import_runtime, use_deviceless_tpu, use_host_devices
from cli.signals import INTERRUPTS
from cost_models.errors import CpplanError
from cost_models.models import get_model
from cost_models.remat import SEARCHED_POLICIES
from cost_models.topology import get_topology
from cost_models.vocabulary import DTYPE_BYTES
from runtime.measure import MIN_TIMED_S
from validation.steptime import AHEAD_COMPILES


def validated_plans(args: argparse.Namespace, model, lengths, strategies: "str | None", **options):
    """The plans `cpplan validate` runs (on cpplan's runtime or MaxText): `validation.steptime.choose_plans`
    with the selection flags of `args`, `strategies` (a comma list; None: every one) and the search `options`."""
    from validation.steptime import choose_plans

    options = {"compute_dtype": args.compute_dtype, "param_dtype": "float32", **options}
    if strategies is not None:
        options["strategies"] = csv_words(strategies)
    if args.remat is not None:
        options["remat"] = csv_words(args.remat)
    return choose_plans(
        model,
        lengths,
        args.topology,
        sequences=args.sequences,
        max_plans=args.max_plans,
        top=args.top,
        seed=args.seed,
        blocks=block_sizes(args.blocks),
        both_backwards=args.both_backwards,
        **options,
    )


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measures this machine's devices and writes a chip row."""
    from validation.calibration import row_path
    from validation.outputs import prepare_out_dir

    topo = get_topology(args.topology)
    out = row_path(args.out, topo.chip.name)
    prepare_out_dir(out.parent, (out.name,))
    use_host_devices(args.topology)
    # on a TPU the kernels are timed with blocks up to 2048, which need the most scoped VMEM the chip grants
    check_devices(topo, "calibrate", scoped_vmem_kib=topo.chip.scoped_vmem_max_bytes // 1024)
    from validation.calibration import NO_LINKS, calibrate, timings_path

    shape = {}
    if args.model:
        m = get_model(args.model)
        shape = dict(
            attention_heads=m.num_heads, attention_kv_heads=m.num_kv_heads, attention_head_dim=m.head_dim, model=m
        )
    result = calibrate(args.topology, dtype=args.dtype, repeats=args.repeats, **shape)
    path = result.write(args.out)
    print(f"raw timings in {timings_path(path)}")
    chip = result.chip
    print(
        f"wrote {path}: peak {chip.peak_bf16_flops_per_s / 1e9:.1f} GFLOP/s per chip, attention efficiency "
        f"{chip.attention_efficiency:.2f} (+ {chip.attention_block_overhead_s * 1e6:.1f} µs per grid step, "
        f"{chip.attention_step_s_per_operand_byte * 1e12:.1f} ps per operand byte per step, "
        f"{chip.attention_masked_element_s * 1e9:.2f} ns per masked logit), memory "
        f"{chip.hbm_bw_bytes_per_s / 1e9:.2f} GB/s"
        + (
            f", link {(chip.core_link_bw_bytes_per_s or chip.ici_link_bw_bytes_per_s) / 1e9:.2f} GB/s, "
            f"hop latency {chip.ici_hop_latency_s * 1e6:.1f} µs"
            if result.raw["links_measured"]
            else ""
        )
    )
    if not result.raw["links_measured"]:
        print(f"links: not measured: {topo.name} has {NO_LINKS}; the row keeps the cited link figures")
    for kind, bw, lat in chip.host_collectives:
        print(f"  {kind}: {bw / 1e9:.2f} GB/s + {lat * 1e6:.0f} µs")
    print(f"use it: export CPPLAN_CHIP_DIR={path.parent}")
    return 0


COMPILE_AHEAD = {"auto": None, "on": True, "off": False}  # --compile-ahead, as validate_step_times takes it


def cmd_validate(args: argparse.Namespace) -> int:
    """Runs plans (or reads measured step times) and compares them with predictions."""
    from validation.outputs import prepare_out_dir, write_atomic
    from validation.report import MEASUREMENTS_FILE, STEP_REPORT_FILES

    html = html_target(args)
    if args.engine == "maxtext":
        from cli.maxtext_validate import validate_on_maxtext

        outdir, report = validate_on_maxtext(args)
    elif args.measured:
        if args.full_mask:
            raise CpplanError(
                "--full-mask sets the mask of the --model that validate runs; the runs of --measured are "
                "priced with their own models: drop --full-mask."
            )
        from validation.corpus import compare_corpus, is_corpus, read_corpus
        from validation.measured import read_csv, read_maxtext_log
        from validation.report import CORPUS_REPORT_FILES
        from validation.steptime import compare_measured

        if not args.maxtext_flags and is_corpus(args.measured):  # published runs, each with its MaxText flags
            runs = read_corpus(args.measured)
            outdir = prepare_out_dir(args.out, CORPUS_REPORT_FILES)
            report = compare_corpus(
                runs, title=f"cpplan vs the published TPU runs of {os.path.basename(args.measured)}"
            )
        else:
            steps = (
                [read_maxtext_log(args.measured, args.maxtext_flags)] if args.maxtext_flags else read_csv(args.measured)
            )
            outdir = prepare_out_dir(args.out, STEP_REPORT_FILES)
            report = compare_measured(steps)
    else:
        if not (args.model and args.seq_lens and args.topology):
            raise CpplanError("cpplan validate needs --model, --seq-lens and --topology (or --measured FILE).")
        lengths, model = seq_lens(args.seq_lens), model_of(args)
        topo = get_topology(args.topology)
        check_data(args.data)
        outdir = prepare_out_dir(args.out, STEP_REPORT_FILES)
        from validation.steptime import validate_step_times

        chosen = validated_plans(args, model, lengths, args.strategies)
        use_host_devices(args.topology)
        # Every plan runs in this one process: jax starts once with the chip's flags, and each plan's
        # programs compile with the scoped VMEM its own splash blocks need (`plan_compiler_options`), as
        # `cpplan run` compiles them. A process per plan costs a backend start (~15 s on a TPU) per plan
        # and the chip can refuse a process that opens it just after another closed it; a plan that
        # fails to compile or runs out of memory is recorded with its reason and the next one measured.
        from runtime.compile_cache import use_compile_cache

        notes = sys.stderr if args.json else sys.stdout
        # before the plans compile: where their programs are kept between runs
        print(use_compile_cache(not args.no_compile_cache), file=notes, flush=True)
        check_devices(topo, "validate")
        journal = write_atomic(outdir / MEASUREMENTS_FILE, "")  # this run's measurements only
        with INTERRUPTS.deferred():
            report = validate_step_times(
                model,
                lengths,
                args.topology,
                steps=args.steps,
                seed=args.seed,
                data=args.data,
                journal=journal,
                stop=lambda: INTERRUPTS.stopped,
                plans=chosen,
                compile_ahead=COMPILE_AHEAD[args.compile_ahead],
                say=lambda line: tqdm.write(line, file=notes),
            )
    files = report.write(outdir, plots=not args.no_plots)
    if not args.measured:
        files.append(outdir / MEASUREMENTS_FILE)
    summary = report.to_dict()
    if args.json:
        print(to_json({k: v for k, v in summary.items() if k != "plans"}))
    else:
        print("\n".join(_summary_lines(summary)))
    for result in getattr(report, "impossible", []):
        print(
            f"cpplan: warning: {result.plan.topology} {result.plan.strategy_label} at {result.plan.seq_len} "
            f"tokens measured {result.measured_step_s:g} s, MFU {result.measured_mfu:.0%}: faster than the chip's "
            f"peak allows; left out of the statistics (check the figure)",
            file=sys.stderr,
        )
    print("wrote " + ", ".join(str(f) for f in files), file=sys.stderr if args.json else sys.stdout)
    if html:
        write_html(summary, html)
    if report.interrupted:
        print(
            f"cpplan: interrupted after {summary['summary']['plans_measured']} measured plans; "
            f"their results are in {outdir}",
            file=sys.stderr,
        )
        return INTERRUPTS.exit_status()
    if INTERRUPTS.stopped:  # the signal came with the last plan: nothing was left unmeasured
        print(f"cpplan: stopped after the last plan; every plan was measured, results in {outdir}", file=sys.stderr)
        return INTERRUPTS.exit_status()
    return 0 if summary["summary"]["plans_measured"] else 1


def _summary_lines(report: dict) -> list[str]:
    """A validation report's figures for people (the JSON has them all: --json, report.json)."""
    s = report["summary"]
    shown = lambda value, spec: "n/a" if value is None else format(value, spec)  # noqa: E731
    lines = [report["title"], f"  plans measured   {s.get('plans_measured', s.get('runs'))}"]
    lines.append(f"  step-time MAPE   {shown(report.get('mape'), '.1%')} (mean |predicted / measured − 1|)")
    if "spearman" in report:
        lines.append(f"  Spearman         {shown(report['spearman'], '.3f')} (rank correlation of the step times)")
    if report.get("regret") is not None:
        lines.append(
            f"  regret           {report['regret']:.3f} (measured time of the plan ranked first ÷ the fastest)"
        )
    if s.get("plans_impossible"):
        lines.append(f"  left out         {s['plans_impossible']} measured faster than the chip's peak allows")
    if s.get("interrupted"):
        lines.append("  interrupted: partial results")
    return lines


def cmd_validate_memory(args: argparse.Namespace) -> int:
    """Compiles plans deviceless and compares predicted HBM with the compiler's."""
    from validation.outputs import prepare_out_dir
    from validation.report import MEMORY_REPORT_FILES

    lengths, model = seq_lens(args.seq_lens), model_of(args)
    topologies = csv_words(args.topologies) or []
    if not topologies:
        raise CpplanError(f"--topologies {args.topologies!r} names no topology; give TPU slices, e.g. v5p:2x2x2.")
    for name in topologies:
        if not get_topology(name).chip.kind.has_torus:
            raise CpplanError(
                f"validate-memory compiles for TPU slices with the TPU compiler; {name!r} is not one. "
                f"Give TPU slices, e.g. v5p:2x2x2,tpu7x:2x2x1."
            )
    outdir = prepare_out_dir(args.out, MEMORY_REPORT_FILES)
    use_deviceless_tpu()
    import_runtime()
    from validation.memory import validate_memory

    report = validate_memory(
        model, lengths, topologies, layers=args.layers, per_strategy=args.per_strategy, sequences=args.sequences
    )
    files = report.write(outdir)
    print(report.markdown())
    print("wrote " + ", ".join(str(f) for f in files))
    return 0 if report.summary()["compared"] else 1


def register(sub) -> None:
    """Adds calibrate, validate and validate-memory to the subparsers `sub`."""
    p = add_command(sub, "calibrate", cmd_calibrate, "measure this machine's devices and write a chip row")
    p.add_argument("--topology", required=True, help="the devices present, e.g. cpu:8")
    p.add_argument(
        "--dtype", default="float32", choices=sorted(DTYPE_BYTES), help="compute dtype measured (float32 on a CPU host)"
    )
    p.add_argument(
        "--repeats",
        type=at_least(1),
        default=5,
        help=f"timed repetitions per figure, at least: more while their total is under {MIN_TIMED_S:g} s; "
        "the fastest is kept",
    )
    p.add_argument(
        "--model",
        help="measure with this model's shapes (default on a host: attention of 8 query, 4 kv heads of 32; on a "
        "TPU: a layer of hidden 2048, 16 query, 8 kv heads of 128, intermediate 8192)",
    )
    p.add_argument("--out", default="cpplan-chips", help="directory (or .json path) for the row")

    p = add_command(sub, "validate", cmd_validate, "predicted vs measured step times (runs or imports)")
    engine_maxtext.add_arguments(
        p,
        "what runs the plans: cpplan's runtime, or MaxText 0.2.5, a process per plan (the plans priced as MaxText "
        "runs them, --target maxtext; the step times its trainer logs compared with that price; under "
        "--out/maxtext/plan-NN each plan's config, logs and metrics.jsonl)",
    )
    p.add_argument("--model", help="model name or config.json path (with --seq-lens and --topology)")
    p.add_argument("--full-mask", action="store_true", help=FULL_MASK_HELP)
    p.add_argument("--seq-lens", help="comma-separated, e.g. 2k,4k,8k")
    p.add_argument("--topology", help="the devices present, e.g. cpu:8")
    p.add_argument("--strategies", help="allowed strategies, e.g. ring,usp (default all)")
    p.add_argument(
        "--remat",
        help=f"allowed remat policies, MaxText's names (default {','.join(p.value for p in SEARCHED_POLICIES)})",
    )
    p.add_argument("--sequences", type=at_least(1), default=1, help="sequences per step at every length")
    p.add_argument("--compute-dtype", default="float32", help="float32 on a CPU host")
    p.add_argument("--max-plans", type=at_least(1), default=16, help="plans per sequence length")
    p.add_argument("--top", type=at_least(0), default=3, help="of which the planner's top K")
    p.add_argument("--steps", type=at_least(2), default=3, help="steps per run (the first is not timed)")
    p.add_argument("--seed", type=at_least(0), default=0, help="seeds the sample of plans beyond the top K")
    p.add_argument(
        "--blocks",
        help="comma-separated splash blocks, e.g. 1024,2048: each chosen plan is run with these too, where it fits",
    )
    p.add_argument(
        "--both-backwards",
        action="store_true",
        help="each chosen plan is run with the other attention backward too (splash's fused kernel, or its dq "
        "and dK/dV kernels), where it fits",
    )
    p.add_argument("--data", help="text file for the runs (synthetic tokens by default)")
    p.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="compile every plan afresh: no persistent compilation cache (by default one in "
        "$JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/cpplan/jax or ~/.cache/cpplan/jax)",
    )
    p.add_argument(
        "--compile-ahead",
        choices=sorted(COMPILE_AHEAD),
        default="auto",
        help=f"compile plans in waves, the next {AHEAD_COMPILES} in threads beside the first, each plan's steps "
        "once its wave has compiled (auto: on an accelerator; not on CPU devices, whose steps the compiles would "
        "slow by sharing their cores)",
    )
    p.add_argument(
        "--measured",
        help="a CSV with columns model, topology, seq_len, global_batch, strategy, data, "
        "fsdp, context, context_ulysses, tensor, remat, load_balance, step_seconds "
        "(the first five and the last required), a corpus of published runs "
        "(benchmarks/public_runs.csv: MaxText flags and citations per run), or a "
        "MaxText log (with --maxtext-flags)",
    )
    p.add_argument(
        "--maxtext-flags", help="the MaxText flags of the logged run: key=value text, or a file holding them"
    )
    p.add_argument(
        "--out",
        default="validation-report",
        help="directory for report.md, report.json, plots and measurements.jsonl (each plan as it is measured)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output: the report's summary as strict JSON")
    p.add_argument("--no-plots", action="store_true", help="skip the plots (no matplotlib needed)")
    add_html(p)

    p = add_command(sub, "validate-memory", cmd_validate_memory, "predicted vs compiled HBM per device")
    p.add_argument("--model", required=True, help="model name or config.json path")
    p.add_argument("--full-mask", action="store_true", help=FULL_MASK_HELP)
    p.add_argument("--seq-lens", required=True, help="comma-separated, e.g. 32k,128k")
    p.add_argument("--topologies", required=True, help="comma-separated TPU slices, e.g. v5p:2x2x2,tpu7x:2x2x1")
    p.add_argument("--layers", type=at_least(1), default=2, help="decoder layers compiled")
    p.add_argument("--per-strategy", type=at_least(1), default=1, help="plans of each strategy, best first")
    p.add_argument("--sequences", type=at_least(1), default=1, help="sequences per step")
    p.add_argument("--out", default="validation-report", help="directory for memory.md and memory.json")
