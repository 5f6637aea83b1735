"""The `cpplan` command line: every subcommand, built from the layers below.

Planning (explain, sweep, max-seq-len, export) uses `planner/` alone. The commands that touch
devices (run, compile, calibrate, validate, validate-memory) import `runtime/` and
`validation/` inside their handlers, so `cpplan explain` never imports jax; those that run on a
`cpu:N` host ask XLA for the N virtual devices before jax is imported.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import re
import signal
import sys
import threading
from pathlib import Path

from cost_models.chips import ChipKind
from cost_models.errors import CpplanError
from cost_models.models import ModelSpec, get_model
from cost_models.strategies.base import full_mask_balance_problem, maxtext_mask_problems
from cost_models.topology import get_topology
from cost_models.units import GiB, MiB
from cost_models.vocabulary import DTYPE_BYTES, LoadBalance
from planner import api
from planner.explanation import Explanation, describe_strategy
from planner.maxtext import export_maxtext, format_flags, read_maxtext
from planner.options import DEFAULT_LOSS_CHUNK_TOKENS, format_tokens, parse_seq_len
from runtime.measure import MIN_TIMED_S

RUNTIME_HINT = "install the runtime with pip install -e '.[runtime]'"
FULL_MASK_HELP = ("plan the model with a full (non-causal) attention mask: every query sees every key, as in an "
                  "encoder (a config.json says so with is_causal: false), so attention computes every query-key pair, "
                  "twice a causal model's FLOPs; zigzag load balancing has nothing to even out and is not searched "
                  "(--load-balance zigzag alone is refused), and MaxText runs its decoders causal, so --target "
                  "maxtext and export --format maxtext are refused")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other cpplan error."""

    def error(self, message: str):
        self.exit(2, f"cpplan: error: {message} (see `{self.prog} --help`)\n")


class _HelpWithDefaults(argparse.HelpFormatter):
    """Help that states each flag's default, where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def _at_least(low: int):
    """An argparse type: an integer of at least `low`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
        return value
    parse.__name__ = f"integer ≥ {low}"
    return parse


def _csv(text: str | None) -> list[str] | None:
    return [w.strip() for w in text.split(",") if w.strip()] if text is not None else None


def _seq_lens(text: str) -> list[int]:
    lengths = [parse_seq_len(w) for w in _csv(text) or []]
    if not lengths:
        raise CpplanError(f"--seq-lens {text!r} names no length; give comma-separated lengths, e.g. 2k,8k.")
    return lengths


def _mesh(text: str | None) -> dict[str, int] | None:
    if text is None:
        return None
    mesh = {}
    for word in _csv(text) or [""]:
        axis, _, size = (part.strip() for part in word.partition("="))
        if not re.fullmatch(r"[0-9]+", size):
            raise CpplanError(f"--mesh {word!r}: write AXIS=SIZE pairs separated by commas, e.g. context=16,tensor=2.")
        if axis in mesh:
            raise CpplanError(f"--mesh gives axis {axis!r} twice ({mesh[axis]} and {size}); give each axis once.")
        mesh[axis] = int(size)
    return mesh


def _json(data) -> str:
    """Strict JSON (no NaN or infinity) for --json output."""
    return json.dumps(data, indent=2, allow_nan=False, default=str)


def _add_search_options(p: argparse.ArgumentParser, *, seq_len: bool = True) -> None:
    """The flags every command that plans takes."""
    p.add_argument("--model", required=True, help="model name (e.g. llama3.1-8b) or path to a config.json")
    p.add_argument("--full-mask", action="store_true", help=FULL_MASK_HELP)
    if seq_len:
        p.add_argument("--seq-len", required=True, help="tokens per sequence: 131072, 128k, 4M")
    p.add_argument("--topology", required=True, help="e.g. v5p-256, v5p:4x4x8, tpu7x-128, cpu:8")
    p.add_argument("--strategies", help="allowed strategies: all_gather,ulysses,ring,usp,none")
    p.add_argument("--mesh", help="fixed axis sizes, e.g. context=16,tensor=2")
    p.add_argument("--remat", help="allowed remat policies, MaxText's names (default full,save_dot_except_mlp,"
                                   "minimal_with_context): also minimal, save_dot_with_context_except_mlp, "
                                   "save_dot_except_mlpwi, save_qkv_proj, save_out_proj, qkv_proj_offloaded, "
                                   "minimal_offloaded")
    p.add_argument("--param-dtype", choices=sorted(DTYPE_BYTES), help="weights and gradients (default float32)")
    p.add_argument("--mu-dtype", choices=sorted(DTYPE_BYTES),
                   help="AdamW's first moment (MaxText's mu_dtype; default float32); the second is in --param-dtype")
    p.add_argument("--load-balance", help="allowed load balancing: zigzag,none")
    p.add_argument("--global-batch-tokens", help="tokens per step to aim for: the search picks the number of sequences "
                                                 "nearest it that a plan fits (default max(seq_len, 4M); one sequence on "
                                                 "cpu:N)")
    p.add_argument("--exact-batch", type=_at_least(1),
                   help="exactly this many sequences per step (instead of a target)")
    p.add_argument("--loss-chunk-tokens", type=_at_least(0), help=f"cross-entropy chunk; 0 = full logits "
                                                                  f"(default {DEFAULT_LOSS_CHUNK_TOKENS})")
    p.add_argument("--num-slices", type=_at_least(1), help="slices of --topology joined over DCN (data and fsdp "
                                                           "span them; default 1)")
    p.add_argument("--json", action="store_true", help="machine-readable output: strict JSON alone")


def _search_options(args: argparse.Namespace) -> dict:
    """Planner keyword options from parsed flags (only those given)."""
    opts = {"strategies": _csv(args.strategies), "mesh": _mesh(args.mesh), "remat": _csv(args.remat),
            "load_balance": _csv(args.load_balance), "global_batch_tokens": args.global_batch_tokens,
            "global_batch": args.exact_batch,
            "loss_chunk_tokens": args.loss_chunk_tokens, "num_slices": args.num_slices,
            "param_dtype": args.param_dtype, "mu_dtype": args.mu_dtype}
    if getattr(args, "target", None):
        opts["target"] = args.target
    return {k: v for k, v in opts.items() if v is not None}


def _add_target(p: argparse.ArgumentParser, default_text: str = "cpplan") -> None:
    """The --target flag of the commands that price for a runtime."""
    p.add_argument("--target", choices=["cpplan", "maxtext"],
                   help=f"the runtime priced: cpplan's own, or MaxText 0.2.5 (its memory; only plans it accepts) "
                        f"(default: {default_text})")


def _model(args: argparse.Namespace) -> ModelSpec:
    """The model a command plans: `--model`, with a full (non-causal) mask under `--full-mask`,
    refused up front where another flag asks for what a full mask cannot have.

    Raises:
        CpplanError: an unknown model; a full-mask model with only zigzag balancing allowed, or
            priced or exported for MaxText.
    """
    model, full_mask = get_model(args.model), getattr(args, "full_mask", False)
    if full_mask:
        model = dataclasses.replace(model, causal=False)
    if model.causal:
        return model
    source = "--full-mask" if full_mask else f"--model {args.model} (is_causal: false)"
    balancing = getattr(args, "load_balance", None)
    if balancing is not None and {LoadBalance.parse(w) for w in _csv(balancing)} == {LoadBalance.ZIGZAG}:
        raise CpplanError(f"--load-balance {balancing} with {source}: {full_mask_balance_problem(model, True)}; "
                          f"allow none (--load-balance none, or leave the flag out).")
    for flag, value, fix in (("--format", getattr(args, "format", None), "--format json writes the plan for cpplan's "
                                                                          "runtime"),
                             ("--target", getattr(args, "target", None), "leave out --target maxtext to price it")):
        if value == "maxtext":
            raise CpplanError(f"{flag} maxtext with {source}: {maxtext_mask_problems(model)[0]}; {fix}.")
    return model


def _plan(args: argparse.Namespace):
    return api.plan(_model(args), args.seq_len, args.topology, **_search_options(args))


def _use_host_devices(topology: str, *, processes: int = 1) -> None:
    """For a topology of a host's virtual devices (`cpu:N`), asks XLA for N of them, or for
    N / P in each of P processes that share them.

    Must run before jax is imported; a topology of real devices (a TPU slice) is left alone.
    """
    topo = get_topology(topology)
    if not topo.chip.kind.shares_cores:
        return
    if topo.num_devices % processes:
        raise CpplanError(f"{topo.name} has {topo.num_devices} devices, which do not split over {processes} processes; "
                          f"give a device count that is a multiple of --num-processes.")
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        count = topo.num_devices // processes
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
    os.environ.setdefault("JAX_PLATFORMS", topo.chip.kind.jax_platform)


def _use_deviceless_tpu() -> None:
    """Sets up compiling for abstract TPU devices: no TPU runtime, and libtpu told that this
    process is its only worker, so that on a host it does not print errors looking for others.

    Must run before jax is imported; values already set (on a TPU VM) are kept.
    """
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


def _import_runtime() -> None:
    """Imports jax, or says how to install it."""
    try:
        import jax  # noqa: F401
    except ImportError as err:
        raise CpplanError(f"this command needs the jax runtime ({err}); {RUNTIME_HINT}.") from None


def cmd_explain(args: argparse.Namespace) -> int:
    """The best plan, why, what came close, what was rejected."""
    explanation = Explanation(api.run_search(_model(args), args.seq_len, args.topology, **_search_options(args)),
                              top=args.top)
    if args.target == "maxtext" and not args.json:
        print("Priced for MaxText 0.2.5 (--target maxtext): its memory, and only plans it accepts.\n")
    print(explanation.to_json() if args.json else explanation)
    return 0 if explanation.best else 1


def cmd_sweep(args: argparse.Namespace) -> int:
    """Best strategy and MFU per sequence length."""
    rows, model = [], _model(args)
    for tokens in _seq_lens(args.seq_lens):
        e = Explanation(api.run_search(model, tokens, args.topology, **_search_options(args)))
        row = {"seq_len": tokens, "fits": e.best is not None}
        if e.best:
            row.update(strategy=e.best.cp_strategy.value, plan=describe_strategy(e.best), mesh=e.best.mesh_dict,
                       remat=e.best.remat.value, step_time_s=e.estimate.step_time_s, mfu=e.estimate.mfu,
                       hbm_gib=e.estimate.hbm_bytes_per_device / GiB,
                       per_strategy={s.value: {"step_time_s": r.estimate.step_time_s, "mfu": r.estimate.mfu}
                                     for s, r in e.best_per_strategy().items()})
        rows.append(row)
    if args.json:
        print(_json(rows))
        return 0
    names = ["all_gather", "ulysses", "ring", "usp"]
    print(f"{'seq_len':>8}  {'best':<42} {'step':>9} {'MFU':>6} {'HBM':>8}  " + "  ".join(f"{n:>10}" for n in names))
    for row in rows:
        if not row["fits"]:
            print(f"{format_tokens(row['seq_len']):>8}  nothing fits")
            continue
        per = row["per_strategy"]
        cells = "  ".join(f"{per[n]['mfu']:>10.1%}" if n in per else f"{'—':>10}" for n in names)
        print(f"{format_tokens(row['seq_len']):>8}  {row['plan']:<42} {row['step_time_s']:>8.2f}s {row['mfu']:>6.1%} "
              f"{row['hbm_gib']:>6.1f}Gi  {cells}")
    print("(per-strategy columns: MFU of that strategy's best plan)")
    return 0


def cmd_max_seq_len(args: argparse.Namespace) -> int:
    """The longest sequence any plan fits."""
    longest = api.max_seq_len(_model(args), args.topology, **_search_options(args))
    print(_json(longest.to_dict()) if args.json else longest)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """The best plan as MaxText flags (priced for MaxText), or plan JSON."""
    if args.format == "maxtext":
        if args.target == "cpplan":
            raise CpplanError("--format maxtext exports a plan for MaxText, so it is chosen and priced for MaxText; "
                              "drop --target cpplan (or use --format json).")
        args.target = "maxtext"
    plan = _plan(args)
    if args.format == "json":
        print(plan.to_json())
        return 0
    exported = export_maxtext(plan)
    if args.json:
        print(_json({"flags": exported.flags, "compile_flags": exported.compile_flags, "notes": list(exported.notes)}))
        return 0
    print(format_flags(exported.flags))
    if exported.compile_flags:  # train_compile's ahead-of-time flags, on their own line
        print(format_flags(exported.compile_flags))
    for note in exported.notes:
        print(f"cpplan: note: {note}", file=sys.stderr)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """MaxText flags read into a plan, priced as MaxText runs it; every flag not read named."""
    from planner.estimate import estimate

    text = args.flags
    if os.path.isfile(text):
        with open(text, encoding="utf-8") as handle:
            text = handle.read()
    found = read_maxtext(text, topology=args.topology)
    predicted = estimate(found.plan, target="maxtext")
    if args.json:
        print(_json({"plan": found.plan.to_dict(), "estimate": predicted.to_dict(), "unread": list(found.unread),
                     "notes": list(found.notes)}))
        return 0
    print(f"{describe_strategy(found.plan)}; mesh {found.plan.mesh_dict}; remat {found.plan.remat.value}; "
          f"{found.plan.global_batch} × {found.plan.seq_len} tokens on {found.plan.topology}")
    print(f"MaxText needs {predicted.hbm_bytes_per_device / GiB:.1f} GiB of {predicted.hbm_capacity_bytes / GiB:.1f} "
          f"GiB HBM per device ({'fits' if predicted.fits else 'does not fit'}); a step takes "
          f"{predicted.step_time_s:.2f} s, MFU {predicted.mfu:.1%}")
    for note in found.notes:
        print(f"note: {note}")
    print(f"not read ({len(found.unread)}): {', '.join(found.unread) if found.unread else 'none'}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Plans, compiles ahead of time (falling back to the next plan that fits), trains with
    checkpoints and metrics, and prints measured figures next to predicted ones."""
    from runtime.distributed import ProcessGroup

    group = ProcessGroup(args.coordinator, args.num_processes, args.process_id)
    group.check()
    topo = get_topology(args.topology, args.num_slices)
    _check_data(args.data)
    profile = _profile_steps(args.profile_steps, args.steps)
    if topo.chip.kind.shares_cores:
        _use_host_devices(args.topology, processes=group.count)
    elif not _on_a_tpu_vm():
        raise CpplanError(f"`cpplan run` runs on the devices present; {topo.name} is a TPU slice and this host has "
                          f"no TPU: launch it on every TPU VM of the slice (see the README). Use `cpplan compile` to "
                          f"compile for it deviceless, or plan for cpu:8.")
    search = api.run_search(_model(args), args.seq_len, args.topology, **_search_options(args))
    explanation = Explanation(search)
    if explanation.best is None:
        raise CpplanError(explanation.nothing_fits_text())
    _import_runtime()
    from runtime.distributed import initialize, is_leader

    _use_tpu_compiler_flags(topo, [r.plan for r in search.ranked[:args.max_fallbacks]])
    initialize(group, platform=topo.chip.kind.jax_platform)
    import jax

    from planner.estimate import estimate
    from runtime.data import open_dataset
    from runtime.loop import Checkpointing, train
    from runtime.preflight import preflight

    best = explanation.best  # every ranked plan has its model and sequence length
    dataset = open_dataset(args.data, seq_len=best.seq_len, vocab=best.model.vocab, seed=args.seed, pack=args.pack,
                           dtype=args.data_dtype, eos_id=args.eos_id)
    leader = is_leader()
    notes = sys.stderr if args.json else sys.stdout
    say = (lambda text: print(text, file=notes, flush=True)) if leader else (lambda text: None)
    say(f"{jax.process_count()} process(es), {jax.device_count()} {jax.devices()[0].platform} devices; "
        f"pre-flight compile of the planner's plans, best first:")
    checked = preflight([r.plan for r in search.ranked[:args.max_fallbacks]], devices=jax.devices(), packed=args.pack,
                        max_attempts=args.max_fallbacks, on_attempt=lambda attempt: say(f"  {attempt}"))
    plan = checked.plan
    if args.dry_run:
        if leader:
            print(_json({"plan": plan.to_dict(), "preflight": [_attempt_dict(a) for a in checked.attempts]})
                  if args.json else f"{plan.to_json()}\ndry run: plan #{checked.attempts[-1].rank} compiles and fits; "
                                    f"stopping before the first step")
        return 0
    checkpointing = Checkpointing(every=args.checkpoint_every, keep=args.keep_checkpoints, resume=args.resume)
    _RAISE_ON_INTERRUPT[0] = False  # stop after the step in hand and save, rather than raise inside jax
    try:
        report = train(checked.trainer, checked.compiled, steps=args.steps, dataset=dataset, seed=args.seed,
                       run_dir=Path(args.run_dir), checkpointing=checkpointing, profile_steps=profile,
                       should_stop=lambda: bool(_INTERRUPTED_BY), memory=checked.memory,
                       compile_s=sum(a.compile_s for a in checked.attempts), on_note=say)
    finally:
        _RAISE_ON_INTERRUPT[0] = True
    if report.stopped:
        if leader:
            name = signal.Signals(_INTERRUPTED_BY[-1]).name if _INTERRUPTED_BY else "a preemption notice (SIGTERM)"
            print(f"cpplan: stopped by {name} after step {report.first_step + len(report.losses)}; checkpoint saved "
                  f"in {Path(args.run_dir) / 'checkpoints'}; run the same command to resume", file=sys.stderr)
        return 128 + (_INTERRUPTED_BY[-1] if _INTERRUPTED_BY else signal.SIGTERM)
    if not leader:
        return 0
    if not report.losses:
        say(f"nothing to run: the checkpoint in {args.run_dir} is at step {report.first_step} of {args.steps}; "
            f"give more --steps to train on.")
        return 0
    predicted = estimate(plan)
    peak = report.peak_memory_bytes
    measured_hbm = report.hbm_bytes_per_device if peak is None else peak
    if args.json:
        print(_json({"plan": plan.to_dict(), "preflight": [_attempt_dict(a) for a in checked.attempts],
                     "first_step": report.first_step, "losses": list(report.losses),
                     "predicted": {"step_time_s": predicted.step_time_s, "mfu": predicted.mfu,
                                   "hbm_bytes_per_device": predicted.hbm_bytes_per_device},
                     "measured": {"step_time_s": report.step_time_s, "best_step_s": report.best_step_s,
                                  "mfu": report.mfu, "compile_s": report.compile_s,
                                  "hbm_bytes_per_device": report.hbm_bytes_per_device,
                                  "peak_memory_bytes": peak}}))
        return 0
    print(plan.to_json())
    print(f"measured:  {report}")
    source = "compiler" if peak is None else "device peak"
    hbm = "n/a" if measured_hbm is None else f"{measured_hbm / MiB:.1f} MiB"
    print(f"{'':10}{'predicted':>14}{'measured':>14}")
    print(f"{'step':10}{predicted.step_time_s * 1e3:>12.1f}ms{report.step_time_s * 1e3:>12.1f}ms")
    print(f"{'MFU':10}{predicted.mfu:>14.1%}{report.mfu:>14.1%}")
    print(f"{'HBM/dev':10}{predicted.hbm_bytes_per_device / MiB:>11.1f}MiB{hbm:>14}  ({source})")
    print(f"metrics in {Path(args.run_dir) / 'metrics.jsonl'}, TensorBoard in {Path(args.run_dir) / 'tensorboard'}")
    return 0


def _attempt_dict(attempt) -> dict:
    return {"rank": attempt.rank, "plan": attempt.plan.to_dict(), "fits": attempt.fits,
            "compile_s": attempt.compile_s, "required_bytes": attempt.required_bytes,
            "available_bytes": attempt.available_bytes, "reason": attempt.reason}


def _profile_steps(text: str | None, steps: int) -> tuple[int, int] | None:
    """`A:B` as the first and last steps (counted from 1) to trace, or None."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9]+)\s*:\s*([0-9]+)\s*", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]) <= steps:
        raise CpplanError(f"--profile-steps {text!r}: write FIRST:LAST with 1 <= FIRST <= LAST <= --steps ({steps}), "
                          f"e.g. 3:5.")
    return int(match[1]), int(match[2])


def _on_a_tpu_vm() -> bool:
    """Whether this host has TPU chips (their device files), judged without importing jax."""
    return any(Path("/dev").glob("accel*")) or any(Path("/dev/vfio").glob("[0-9]*"))


def cmd_compile(args: argparse.Namespace) -> int:
    """Plans, compiles deviceless for the TPU slice, and prints memory against the prediction."""
    _use_deviceless_tpu()
    plan = _plan(args)
    _import_runtime()
    from planner.estimate import estimate
    from jax.errors import JaxRuntimeError

    from runtime.compile import compile_for

    try:
        report = compile_for(plan)
    except JaxRuntimeError as err:  # refused for another reason than HBM (e.g. a kernel over its VMEM)
        print(f"cpplan: the XLA TPU compiler refused the plan: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    predicted = estimate(plan)
    print(plan.to_json())
    print(f"compiled:  {report}")
    print(f"predicted: {predicted.hbm_bytes_per_device / GiB:.2f} GiB per device "
          f"({'fits' if predicted.fits else 'does not fit'}); compiler: {report.required_gib:.2f} GiB "
          f"({'fits' if report.fits else 'does not fit'})")
    return 0 if report.fits else 1


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measures this machine's devices and writes a chip row."""
    from validation.calibration import row_path
    from validation.outputs import prepare_out_dir

    topo = get_topology(args.topology)
    out = row_path(args.out, topo.chip.name)
    prepare_out_dir(out.parent, (out.name,))
    _use_host_devices(args.topology)
    _import_runtime()
    _check_devices(topo, "calibrate")
    from validation.calibration import calibrate

    shape = {}
    if args.model:
        m = get_model(args.model)
        shape = dict(attention_heads=m.num_heads, attention_kv_heads=m.num_kv_heads, attention_head_dim=m.head_dim)
    result = calibrate(args.topology, dtype=args.dtype, repeats=args.repeats, **shape)
    path = result.write(args.out)
    chip = result.chip
    print(f"wrote {path}: peak {chip.peak_bf16_flops_per_s / 1e9:.1f} GFLOP/s per chip, attention efficiency "
          f"{chip.attention_efficiency:.2f} (+ {chip.attention_block_overhead_s * 1e6:.1f} µs per grid step, "
          f"{chip.attention_step_s_per_operand_byte * 1e12:.1f} ps per operand byte per step, "
          f"{chip.attention_masked_element_s * 1e9:.2f} ns per masked logit), memory "
          f"{chip.hbm_bw_bytes_per_s / 1e9:.2f} GB/s, link "
          f"{(chip.core_link_bw_bytes_per_s or chip.ici_link_bw_bytes_per_s) / 1e9:.2f} GB/s, "
          f"hop latency {chip.ici_hop_latency_s * 1e6:.1f} µs")
    for kind, bw, lat in chip.host_collectives:
        print(f"  {kind}: {bw / 1e9:.2f} GB/s + {lat * 1e6:.0f} µs")
    print(f"use it: export CPPLAN_CHIP_DIR={path.parent}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Runs plans (or reads measured step times) and compares them with predictions."""
    from validation.outputs import prepare_out_dir, write_atomic
    from validation.report import MEASUREMENTS_FILE, STEP_REPORT_FILES

    if args.measured:
        if args.full_mask:
            raise CpplanError("--full-mask sets the mask of the --model that validate runs; the runs of --measured are "
                              "priced with their own models: drop --full-mask.")
        from validation.corpus import compare_corpus, is_corpus, read_corpus
        from validation.measured import read_csv, read_maxtext_log
        from validation.report import CORPUS_REPORT_FILES
        from validation.steptime import compare_measured

        if not args.maxtext_flags and is_corpus(args.measured):  # published runs, each with its MaxText flags
            runs = read_corpus(args.measured)
            outdir = prepare_out_dir(args.out, CORPUS_REPORT_FILES)
            report = compare_corpus(runs, title=f"cpplan vs the published TPU runs of {os.path.basename(args.measured)}")
        else:
            steps = [read_maxtext_log(args.measured, args.maxtext_flags)] if args.maxtext_flags else read_csv(args.measured)
            outdir = prepare_out_dir(args.out, STEP_REPORT_FILES)
            report = compare_measured(steps)
    else:
        if not (args.model and args.seq_lens and args.topology):
            raise CpplanError("cpplan validate needs --model, --seq-lens and --topology (or --measured FILE).")
        seq_lens, model = _seq_lens(args.seq_lens), _model(args)
        topo = get_topology(args.topology)
        _check_data(args.data)
        outdir = prepare_out_dir(args.out, STEP_REPORT_FILES)
        _use_host_devices(args.topology)
        _import_runtime()
        _check_devices(topo, "validate")
        from validation.steptime import validate_step_times

        options = {"compute_dtype": args.compute_dtype, "param_dtype": "float32"}
        if args.strategies is not None:
            options["strategies"] = _csv(args.strategies)
        journal = write_atomic(outdir / MEASUREMENTS_FILE, "")  # this run's measurements only
        _RAISE_ON_INTERRUPT[0] = False
        try:
            report = validate_step_times(model, seq_lens, args.topology, sequences=args.sequences,
                                         max_plans=args.max_plans, top=args.top, steps=args.steps, seed=args.seed,
                                         data=args.data, journal=journal, stop=lambda: bool(_INTERRUPTED_BY),
                                         **options)
        finally:
            _RAISE_ON_INTERRUPT[0] = True
    files = report.write(outdir, plots=not args.no_plots)
    if not args.measured:
        files.append(outdir / MEASUREMENTS_FILE)
    summary = report.to_dict()
    print(_json({k: v for k, v in summary.items() if k != "plans"}))
    print("wrote " + ", ".join(str(f) for f in files))
    if report.interrupted:
        print(f"cpplan: interrupted after {summary['summary']['plans_measured']} measured plans; "
              f"their results are in {outdir}", file=sys.stderr)
        return 128 + (_INTERRUPTED_BY[-1] if _INTERRUPTED_BY else signal.SIGINT)
    return 0 if summary["summary"]["plans_measured"] else 1


def cmd_validate_memory(args: argparse.Namespace) -> int:
    """Compiles plans deviceless and compares predicted HBM with the compiler's."""
    from validation.outputs import prepare_out_dir
    from validation.report import MEMORY_REPORT_FILES

    seq_lens, model = _seq_lens(args.seq_lens), _model(args)
    topologies = _csv(args.topologies) or []
    if not topologies:
        raise CpplanError(f"--topologies {args.topologies!r} names no topology; give TPU slices, e.g. v5p:2x2x2.")
    for name in topologies:
        if not get_topology(name).chip.kind.has_torus:
            raise CpplanError(f"validate-memory compiles for TPU slices with the TPU compiler; {name!r} is not one. "
                              f"Give TPU slices, e.g. v5p:2x2x2,tpu7x:2x2x1.")
    outdir = prepare_out_dir(args.out, MEMORY_REPORT_FILES)
    _use_deviceless_tpu()
    _import_runtime()
    from validation.memory import validate_memory

    report = validate_memory(model, seq_lens, topologies, layers=args.layers,
                             per_strategy=args.per_strategy, sequences=args.sequences)
    files = report.write(outdir)
    print(report.markdown())
    print("wrote " + ", ".join(str(f) for f in files))
    return 0 if report.summary()["compared"] else 1


def _check_data(path: str | None) -> None:
    """Refuses, before any work, --data that cannot be read: a file, or a glob of ArrayRecord shards."""
    if path is None or path == "synthetic":
        return
    import glob

    files = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
    if not files or not all(os.path.isfile(f) and os.access(f, os.R_OK) for f in files):
        raise CpplanError(f"--data {path!r} is not a readable file (or a glob of readable ArrayRecord shards); give a "
                          f"token file (.npy, raw with --data-dtype, .array_record) or a text file, or leave --data out "
                          f"for synthetic tokens.")


def _use_tpu_compiler_flags(topo, plans=()) -> None:
    """On a TPU, the compiler flags the price's overlap data was read with, set before jax starts
    the backend (`runtime.compile.use_compiler_flags`; the user's own LIBTPU_INIT_ARGS win), and
    the scoped VMEM the splash blocks of any of `plans` (those a run may fall back to) need."""
    if topo.chip.kind is ChipKind.TPU:
        from runtime.compile import scoped_vmem_flag, use_compiler_flags

        limits = [p.scoped_vmem_limit_kib for p in plans if p.scoped_vmem_limit_kib is not None]
        use_compiler_flags(topo.chip.name, scoped_vmem_flag(max(limits) if limits else None))


def _check_devices(topo, command: str) -> None:
    """Refuses, before any work, a topology whose devices this process does not have."""
    _use_tpu_compiler_flags(topo)
    import jax

    devices = jax.devices()
    platform = topo.chip.kind.jax_platform
    if devices[0].platform != platform or len(devices) < topo.num_devices:
        raise CpplanError(f"`cpplan {command}` measures the devices present; {topo.name} needs {topo.num_devices} "
                          f"{platform} devices, this process has {len(devices)} {devices[0].platform} device(s). "
                          f"Run it on that slice, or measure this host's devices with --topology cpu:8.")


def _add(sub, name: str, handler, help_text: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False,
                       formatter_class=_HelpWithDefaults)
    p.set_defaults(func=handler)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The `cpplan` parser with every subcommand.

    Returns:
        An `ArgumentParser` whose parsed namespace carries the handler as `func`.
    """
    parser = _Parser(prog="cpplan", allow_abbrev=False, description="Plan context parallelism for long-context "
                     "training: price, choose, explain, run and validate.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _add(sub, "explain", cmd_explain, "the best plan, why, what came close, what was rejected")
    _add_search_options(p)
    _add_target(p)
    p.add_argument("--top", type=_at_least(0), default=5, help="alternatives to show")
    p = _add(sub, "sweep", cmd_sweep, "best strategy and MFU per sequence length")
    _add_search_options(p, seq_len=False)
    p.add_argument("--seq-lens", required=True, help="comma-separated lengths, e.g. 128k,512k,1M,4M")
    p = _add(sub, "max-seq-len", cmd_max_seq_len, "the longest sequence any plan fits")
    _add_search_options(p, seq_len=False)
    _add_target(p)
    p = _add(sub, "export", cmd_export, "the best plan as MaxText flags (or plan JSON)")
    _add_search_options(p)
    p.add_argument("--format", choices=["maxtext", "json"], default="maxtext",
                   help="MaxText flags (training flags, then train_compile's compile_topology flags on their own "
                        "line; the plan chosen and priced for MaxText), or the plan as JSON")
    _add_target(p, "maxtext with --format maxtext, else cpplan")
    p = _add(sub, "import", cmd_import, "MaxText flags read into a plan, priced as MaxText runs it")
    p.add_argument("--flags", required=True, help="MaxText flags: key=value text, or a file holding them")
    p.add_argument("--topology", help="the slice, where the flags have no compile_topology")
    p.add_argument("--json", action="store_true", help="machine-readable output: strict JSON alone")

    p = _add(sub, "run", cmd_run, "plan, pre-flight compile, train with checkpoints and metrics, report (cpu:N "
                                  "host or TPU pod, one or many processes)")
    _add_search_options(p)
    p.add_argument("--steps", type=_at_least(2), default=5, help="train until this many steps are done (a resumed "
                                                                 "run does the rest; the median skips the first)")
    p.add_argument("--data", help="tokens to train on: a text file (bytes), a .npy or raw token file, ArrayRecord; "
                                  "default synthetic tokens")
    p.add_argument("--seed", type=_at_least(0), default=0, help="parameter and data seed")
    p.add_argument("--data-dtype", choices=["uint16", "uint32"], help="token type of raw and ArrayRecord --data")
    p.add_argument("--eos-id", type=_at_least(0), help="the token that ends each document of --data")
    p.add_argument("--pack", action="store_true", help="keep the documents of a row apart (segment ids through "
                                                       "splash); needs --eos-id or ArrayRecord --data")
    p.add_argument("--run-dir", default="cpplan-run", help="directory for metrics.jsonl, TensorBoard events, "
                                                           "checkpoints/ and profile/")
    p.add_argument("--checkpoint-every", type=_at_least(0), default=100,
                   help="save a checkpoint every this many steps (0: only at the end and when stopped)")
    p.add_argument("--keep-checkpoints", type=_at_least(1), default=3, help="checkpoints kept, newest first")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from the newest checkpoint in --run-dir when there is one; --no-resume refuses a "
                        "directory that has one")
    p.add_argument("--dry-run", action="store_true", help="stop after the pre-flight compile and print its report")
    p.add_argument("--max-fallbacks", type=_at_least(1), default=4,
                   help="plans to pre-flight, best first, before giving up")
    p.add_argument("--profile-steps", help="FIRST:LAST steps (from 1) to trace with the jax profiler into "
                                           "--run-dir/profile")
    p.add_argument("--coordinator", help="host:port of process 0, for several processes off a TPU VM (on TPU VMs "
                                         "jax finds it)")
    p.add_argument("--num-processes", type=_at_least(1), help="processes in the run (with --coordinator)")
    p.add_argument("--process-id", type=_at_least(0), help="this process's index (with --coordinator)")
    p = _add(sub, "compile", cmd_compile, "plan, then compile deviceless for a TPU slice")
    _add_search_options(p)

    p = _add(sub, "calibrate", cmd_calibrate, "measure this machine's devices and write a chip row")
    p.add_argument("--topology", required=True, help="the devices present, e.g. cpu:8")
    p.add_argument("--dtype", default="float32", help="compute dtype measured (float32 on a CPU host)")
    p.add_argument("--repeats", type=_at_least(1), default=5,
                   help=f"timed repetitions per figure, at least: more while their total is under {MIN_TIMED_S:g} s; "
                        "the fastest is kept")
    p.add_argument("--model", help="measure attention with this model's heads (default: 8 query, 4 kv heads of 32)")
    p.add_argument("--out", default="cpplan-chips", help="directory (or .json path) for the row")

    p = _add(sub, "validate", cmd_validate, "predicted vs measured step times (runs or imports)")
    p.add_argument("--model", help="model name or config.json path (with --seq-lens and --topology)")
    p.add_argument("--full-mask", action="store_true", help=FULL_MASK_HELP)
    p.add_argument("--seq-lens", help="comma-separated, e.g. 2k,4k,8k")
    p.add_argument("--topology", help="the devices present, e.g. cpu:8")
    p.add_argument("--strategies", help="allowed strategies, e.g. ring,usp (default all)")
    p.add_argument("--sequences", type=_at_least(1), default=1, help="sequences per step at every length")
    p.add_argument("--compute-dtype", default="float32", help="float32 on a CPU host")
    p.add_argument("--max-plans", type=_at_least(1), default=16, help="plans per sequence length")
    p.add_argument("--top", type=_at_least(0), default=3, help="of which the planner's top K")
    p.add_argument("--steps", type=_at_least(2), default=3, help="steps per run (the first is not timed)")
    p.add_argument("--seed", type=_at_least(0), default=0, help="seeds the sample of plans beyond the top K")
    p.add_argument("--data", help="text file for the runs (synthetic tokens by default)")
    p.add_argument("--measured", help="a CSV with columns model, topology, seq_len, global_batch, strategy, data, "
                                      "fsdp, context, context_ulysses, tensor, remat, load_balance, step_seconds "
                                      "(the first five and the last required), a corpus of published runs "
                                      "(benchmarks/public_runs.csv: MaxText flags and citations per run), or a "
                                      "MaxText log (with --maxtext-flags)")
    p.add_argument("--maxtext-flags", help="the MaxText flags of the logged run: key=value text, or a file holding "
                                           "them")
    p.add_argument("--out", default="validation-report", help="directory for report.md, report.json, plots and "
                                                              "measurements.jsonl (each plan as it is measured)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots (no matplotlib needed)")

    p = _add(sub, "validate-memory", cmd_validate_memory, "predicted vs compiled HBM per device")
    p.add_argument("--model", required=True, help="model name or config.json path")
    p.add_argument("--full-mask", action="store_true", help=FULL_MASK_HELP)
    p.add_argument("--seq-lens", required=True, help="comma-separated, e.g. 32k,128k")
    p.add_argument("--topologies", required=True, help="comma-separated TPU slices, e.g. v5p:2x2x2,tpu7x:2x2x1")
    p.add_argument("--layers", type=_at_least(1), default=2, help="decoder layers compiled")
    p.add_argument("--per-strategy", type=_at_least(1), default=1, help="plans of each strategy, best first")
    p.add_argument("--sequences", type=_at_least(1), default=1, help="sequences per step")
    p.add_argument("--out", default="validation-report", help="directory for memory.md and memory.json")
    return parser


# the signals that interrupted this process (SIGTERM is handled as Ctrl-C is: keep, write, exit)
_INTERRUPTED_BY: list[int] = []
# whether an interrupt raises KeyboardInterrupt at once; `validate` turns it off while it measures
# and stops after the plan in hand instead, because a KeyboardInterrupt raised inside jax (its
# garbage-collection callback, say) is swallowed with a traceback on stderr
_RAISE_ON_INTERRUPT = [True]


def _interrupt(signum: int, frame) -> None:
    _INTERRUPTED_BY.append(signum)
    if not _RAISE_ON_INTERRUPT[0]:
        return
    if _in_gc_callback(frame):
        # Python swallows an exception a garbage-collection callback raises (jax registers one),
        # printing its traceback: deliver the interrupt again once the callback has returned
        _deliver_again(signum)
        return
    raise KeyboardInterrupt


def _in_gc_callback(frame) -> bool:
    """Whether `frame` runs inside one of the garbage collector's callbacks (`gc.callbacks`)."""
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks:
            return True
        frame = frame.f_back
    return False


def _deliver_again(signum: int) -> None:
    """Sends `signum` to this process again shortly, from another thread, so that its handler runs
    at the main thread's next instruction outside the callback."""
    threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def main(argv: list[str] | None = None) -> int:
    """Runs one `cpplan` command.

    Args:
        argv: the arguments (default: the process's).
    Returns:
        The exit status: 0 done, 1 nothing fits / does not fit / nothing measured, 2 bad input,
        128 + the signal's number when interrupted (Ctrl-C or SIGTERM).
    """
    args = build_parser().parse_args(argv)
    _INTERRUPTED_BY.clear()
    # Ctrl-C gets the same handler as SIGTERM, so that every interrupt is recorded even where a
    # library swallows the KeyboardInterrupt it raises; a SIGINT the parent ignores stays ignored
    handled = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN else [])
    previous = {s: signal.signal(s, _interrupt) for s in handled} if _in_main_thread() else {}
    try:
        return args.func(args)
    except CpplanError as err:
        print(f"cpplan: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cpplan: interrupted", file=sys.stderr)
        return 128 + (_INTERRUPTED_BY[-1] if _INTERRUPTED_BY else signal.SIGINT)
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
