"""The planning commands: explain, sweep, max-seq-len, export, import (planner/ alone, no jax)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from cli.args import (
    add_command,
    add_html,
    add_search_options,
    add_target,
    at_least,
    html_target,
    model_of,
    plan_of,
    search_options,
    seq_lens,
    to_json,
    write_html,
)
from cost_models.errors import CpplanError
from cost_models.units import GiB
from cost_models.vocabulary import CPStrategy
from planner import api
from planner.explanation import Explanation, describe_strategy
from planner.maxtext import export_maxtext, format_flags, read_maxtext
from planner.options import format_tokens


def cmd_explain(args: argparse.Namespace) -> int:
    """The best plan, why, what came close, what was rejected."""
    html = html_target(args)
    explanation = api.explain(model_of(args), args.seq_len, args.topology, top=args.top, **search_options(args))
    if args.target == "maxtext" and not args.json:
        print("Priced for MaxText 0.2.5 (--target maxtext): its memory, and only plans it accepts.\n")
    print(explanation.to_json() if args.json else explanation)
    if html:
        write_html(explanation.to_dict(), html)
    return 0 if explanation.best else 1


def cmd_sweep(args: argparse.Namespace) -> int:
    """Best strategy and MFU per sequence length."""
    html = html_target(args)
    rows = sweep_rows(args)
    print(to_json(rows) if args.json else sweep_table(rows))
    if html:
        write_html(rows, html, longest=longest_or_none(args), title=f"cpplan sweep: {args.model} on {args.topology}")
    return 0


def sweep_table(rows: list[dict]) -> str:
    """The sweep for people: a line per length, each strategy's MFU beside the best plan."""
    names = [s.value for s in CPStrategy if s is not CPStrategy.NONE]
    width = max([len("best"), *(len(row["plan"]) for row in rows if row["fits"])])  # the longest plan's column
    lines = [
        f"{'seq_len':>8}  {'best':<{width}} {'step':>9} {'MFU':>6} {'HBM':>8}  " + "  ".join(f"{n:>10}" for n in names)
    ]
    for row in rows:
        if not row["fits"]:
            lines.append(f"{format_tokens(row['seq_len']):>8}  nothing fits")
            continue
        per = row["per_strategy"]
        cells = "  ".join(f"{per[n]['mfu']:>10.1%}" if n in per else f"{'—':>10}" for n in names)
        lines.append(
            f"{format_tokens(row['seq_len']):>8}  {row['plan']:<{width}} {row['step_time_s']:>8.2f}s "
            f"{row['mfu']:>6.1%} {row['hbm_gib']:>6.1f}Gi{'*' if row['marginal'] else ' '} {cells}"
        )
    lines.append("(per-strategy columns: MFU of that strategy's best plan)")
    if any(row.get("marginal") for row in rows):  # a length where nothing fits has no plan to mark
        lines.append("(*: fits within the memory price's measured error of the capacity; a compile settles it)")
    return "\n".join(lines)


def sweep_rows(args: argparse.Namespace) -> list[dict]:
    """One row per swept length: its best plan, and each strategy's best step time and MFU."""
    rows, model = [], model_of(args)
    for tokens in seq_lens(args.seq_lens):
        e = Explanation(api.run_search(model, tokens, args.topology, **search_options(args)))
        row = {"seq_len": tokens, "fits": e.best is not None}
        if e.best:
            row.update(
                strategy=e.best.cp_strategy.value,
                plan=describe_strategy(e.best),
                mesh=e.best.mesh_dict,
                remat=e.best.remat.value,
                step_time_s=e.estimate.step_time_s,
                mfu=e.estimate.mfu,
                hbm_gib=e.estimate.hbm_bytes_per_device / GiB,
                marginal=e.estimate.marginal,
                per_strategy={
                    s.value: {"step_time_s": r.estimate.step_time_s, "mfu": r.estimate.mfu}
                    for s, r in e.best_per_strategy().items()
                },
            )
        rows.append(row)
    return rows


def longest_or_none(args: argparse.Namespace) -> dict | None:
    """`max-seq-len`'s answer for the sweep's model and slice (one sequence per step, so the sweep's
    batch options are left out), or None where no length fits."""
    options = {k: v for k, v in search_options(args).items() if k not in ("global_batch_tokens", "global_batch")}
    try:
        return api.max_seq_len(model_of(args), args.topology, **options).to_dict()
    except CpplanError:
        return None


def cmd_max_seq_len(args: argparse.Namespace) -> int:
    """The longest sequence any plan fits."""
    longest = api.max_seq_len(model_of(args), args.topology, **search_options(args))
    print(to_json(longest.to_dict()) if args.json else longest)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """The best plan as MaxText flags (priced for MaxText), or plan JSON."""
    if args.format == "maxtext":
        if args.target == "cpplan":
            raise CpplanError(
                "--format maxtext exports a plan for MaxText, so it is chosen and priced for MaxText; "
                "drop --target cpplan (or use --format json)."
            )
        args.target = "maxtext"
    plan = plan_of(args)
    if args.format == "json":
        print(plan.to_json())
        return 0
    exported = export_maxtext(plan)
    if args.json:
        print(
            to_json(
                {
                    "flags": exported.flags,
                    "compile_flags": exported.compile_flags,
                    "libtpu_init_args": exported.libtpu_init_args,
                    "notes": list(exported.notes),
                }
            )
        )
        return 0
    print(format_flags(exported.flags))
    if exported.compile_flags:  # train_compile's ahead-of-time flags, on their own line
        print(format_flags(exported.compile_flags))
    print(f"cpplan: run it with LIBTPU_INIT_ARGS={shlex.quote(exported.libtpu_init_args)}", file=sys.stderr)
    for note in exported.notes:
        print(f"cpplan: note: {note}", file=sys.stderr)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """MaxText flags read into a plan, priced as MaxText runs it; every flag not read named."""
    from planner.estimate import estimate

    if not os.path.isfile(args.flags) and "=" not in args.flags:
        raise CpplanError(
            f"--flags {args.flags!r} is neither a file nor MaxText key=value flags; give the flags file's "
            f'path, or the flags themselves, e.g. --flags "model_name=llama3.1-8b compile_topology=v5p-16".'
        )
    text = read_flags_file(args.flags) if os.path.isfile(args.flags) else args.flags
    found = read_maxtext(text, topology=args.topology)
    predicted = estimate(found.plan, target="maxtext")
    if args.json:
        print(
            to_json(
                {
                    "plan": found.plan.to_dict(),
                    "estimate": predicted.to_dict(),
                    "unread": list(found.unread),
                    "notes": list(found.notes),
                }
            )
        )
        return 0 if predicted.fits else 1
    print(
        f"{describe_strategy(found.plan)}; mesh {found.plan.mesh_dict}; remat {found.plan.remat_label}; "
        f"{found.plan.global_batch} × {found.plan.seq_len} tokens on {found.plan.topology}"
    )
    print(
        f"MaxText needs {predicted.hbm_bytes_per_device / GiB:.1f} GiB of {predicted.hbm_capacity_bytes / GiB:.1f} "
        f"GiB HBM per device ({predicted.verdict}); a step takes "
        f"{predicted.step_time_s:.2f} s, MFU {predicted.mfu:.1%}"
    )
    if predicted.marginal:
        print(f"marginal: {predicted.marginal_reason}")
    for note in predicted.notes:
        print(f"not priced: {note}")
    for note in found.notes:
        print(f"note: {note}")
    print(f"not read ({len(found.unread)}): {', '.join(found.unread) if found.unread else 'none'}")
    return 0 if predicted.fits else 1


# a MaxText command line or flags file is a few KiB; more is not one
MAX_FLAGS_FILE_BYTES = 1 << 20


def read_flags_file(path: str) -> str:
    """The text of a file of MaxText flags, refused when it is not text or too long to be one."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_FLAGS_FILE_BYTES + 1)
    if len(data) > MAX_FLAGS_FILE_BYTES:
        raise CpplanError(
            f"--flags {path!r} is over {MAX_FLAGS_FILE_BYTES >> 20} MiB: not a file of MaxText flags; "
            f"give the key=value text of a MaxText command line."
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CpplanError(
            f"--flags {path!r} is not UTF-8 text (byte {err.start}); give the key=value text of a MaxText command line."
        ) from None


def register(sub) -> None:
    """Adds explain, sweep, max-seq-len, export and import to the subparsers `sub`."""
    p = add_command(sub, "explain", cmd_explain, "the best plan, why, what came close, what was rejected")
    add_search_options(p)
    add_target(p)
    add_html(p)
    p.add_argument("--top", type=at_least(0), default=5, help="alternatives to show")
    p = add_command(sub, "sweep", cmd_sweep, "best strategy and MFU per sequence length")
    add_search_options(p, seq_len=False)
    p.add_argument("--seq-lens", required=True, help="comma-separated lengths, e.g. 128k,512k,1M,4M")
    add_html(p)
    p = add_command(sub, "max-seq-len", cmd_max_seq_len, "the longest sequence any plan fits")
    add_search_options(p, seq_len=False, batch=False)  # it chooses the sequences per step itself
    add_target(p)
    p = add_command(sub, "export", cmd_export, "the best plan as MaxText flags (or plan JSON)")
    add_search_options(p)
    p.add_argument(
        "--format",
        choices=["maxtext", "json"],
        default="maxtext",
        help="MaxText flags (training flags, then train_compile's compile_topology flags on their own "
        "line; the plan chosen and priced for MaxText), or the plan as JSON",
    )
    add_target(p, "maxtext with --format maxtext, else cpplan")
    p = add_command(sub, "import", cmd_import, "MaxText flags read into a plan, priced as MaxText runs it")
    p.add_argument("--flags", required=True, help="MaxText flags: key=value text, or a file holding them")
    p.add_argument("--topology", help="the slice, where the flags have no compile_topology")
    p.add_argument("--json", action="store_true", help="machine-readable output: strict JSON alone")
