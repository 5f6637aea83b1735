"""The `cpplan` command line: explain, sweep, max-seq-len, export (and run/compile from runtime/)."""
from __future__ import annotations

import argparse
import json
import sys

from cost_models.errors import CpplanError
from planner import api
from planner.explanation import Explanation, describe_strategy
from planner.maxtext import format_flags
from planner.options import format_tokens, parse_seq_len


def _csv(text: str | None) -> list[str] | None:
    return [w.strip() for w in text.split(",") if w.strip()] if text else None


def _mesh(text: str | None) -> dict[str, int] | None:
    if not text:
        return None
    mesh = {}
    for word in _csv(text):
        axis, _, size = word.partition("=")
        if not size.strip().isdigit():
            raise CpplanError(f"--mesh {word!r}: write AXIS=SIZE pairs separated by commas, e.g. context=16,tensor=2.")
        mesh[axis.strip()] = int(size)
    return mesh


def add_search_options(p: argparse.ArgumentParser, *, seq_len: bool = True) -> None:
    """The flags every planning command takes (the runtime's commands reuse them)."""
    p.add_argument("--model", required=True, help="model name (e.g. llama3.1-8b) or path to a config.json")
    if seq_len:
        p.add_argument("--seq-len", required=True, help="tokens per sequence: 131072, 128k, 4M")
    p.add_argument("--topology", required=True, help="e.g. v5p-256, v5p:4x4x8, tpu7x-128, cpu:8")
    p.add_argument("--strategies", help="allowed strategies: all_gather,ulysses,ring,usp,none")
    p.add_argument("--mesh", help="fixed axis sizes, e.g. context=16,tensor=2")
    p.add_argument("--remat", help="allowed remat policies: full,save_dot_except_mlp,minimal_with_context")
    p.add_argument("--load-balance", help="allowed load balancing: zigzag,none")
    p.add_argument("--global-batch-tokens", help="tokens per step (default max(seq_len, 4M))")
    p.add_argument("--loss-chunk-tokens", type=int, help="cross-entropy chunk; 0 = full logits")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def search_options(args) -> dict:
    """Planner keyword options from parsed flags (only those given)."""
    opts = {"strategies": _csv(args.strategies), "mesh": _mesh(args.mesh), "remat": _csv(args.remat),
            "load_balance": _csv(args.load_balance)}
    if getattr(args, "global_batch_tokens", None):
        opts["global_batch_tokens"] = args.global_batch_tokens
    if args.loss_chunk_tokens is not None:
        opts["loss_chunk_tokens"] = args.loss_chunk_tokens
    return {k: v for k, v in opts.items() if v is not None}


def cmd_explain(args) -> int:
    explanation = Explanation(api.run_search(args.model, args.seq_len, args.topology, **search_options(args)), top=args.top)
    print(explanation.to_json() if args.json else explanation)
    return 0 if explanation.best else 1


def cmd_sweep(args) -> int:
    rows = []
    for text in _csv(args.seq_lens):
        tokens = parse_seq_len(text)
        e = Explanation(api.run_search(args.model, tokens, args.topology, **search_options(args)))
        row = {"seq_len": tokens, "fits": e.best is not None}
        if e.best:
            row.update(strategy=e.best.cp_strategy.value, plan=describe_strategy(e.best), mesh=e.best.mesh_dict,
                       remat=e.best.remat.value, step_time_s=e.estimate.step_time_s, mfu=e.estimate.mfu,
                       hbm_gib=e.estimate.hbm_bytes_per_device / 2**30,
                       per_strategy={s.value: {"step_time_s": r.estimate.step_time_s, "mfu": r.estimate.mfu}
                                     for s, r in e.best_per_strategy().items()})
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
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


def cmd_max_seq_len(args) -> int:
    tokens, plan = api.max_seq_len(args.model, args.topology, **search_options(args))
    if args.json:
        print(json.dumps({"max_seq_len": tokens, "plan": plan.to_dict()}, indent=2))
    else:
        print(f"{plan.model.name} on {plan.topology}: up to {format_tokens(tokens)} tokens ({tokens}) per sequence, "
              f"with {describe_strategy(plan)}, remat {plan.remat.value}")
    return 0


def cmd_export(args) -> int:
    plan = api.plan(args.model, args.seq_len, args.topology, **search_options(args))
    if args.format == "json":
        print(plan.to_json())
        return 0
    flags = plan.to_maxtext()
    print(json.dumps(flags, indent=2) if args.json else format_flags(flags))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cpplan", description="Plan context parallelism for long-context training.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("explain", help="the best plan, why, what came close, what was rejected")
    add_search_options(p)
    p.add_argument("--top", type=int, default=5, help="alternatives to show")
    p.set_defaults(func=cmd_explain)
    p = sub.add_parser("sweep", help="best strategy and MFU per sequence length")
    add_search_options(p, seq_len=False)
    p.add_argument("--seq-lens", required=True, help="comma-separated lengths, e.g. 128k,512k,1M,4M")
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser("max-seq-len", help="the longest sequence any plan fits")
    add_search_options(p, seq_len=False)
    p.set_defaults(func=cmd_max_seq_len)
    p = sub.add_parser("export", help="the best plan as MaxText flags (or plan JSON)")
    add_search_options(p)
    p.add_argument("--format", choices=["maxtext", "json"], default="maxtext")
    p.set_defaults(func=cmd_export)
    for name, text in RUNTIME_COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


# Commands that need the jax runtime; only they import it, so planning stays fast and jax-free.
RUNTIME_COMMANDS = {
    "run": "plan and run on this machine's devices; measured vs predicted (needs the runtime extra)",
    "compile": "compile a plan for a TPU topology without a TPU; memory vs predicted (needs libtpu)",
    "calibrate": "measure this machine's devices and write a chip row",
    "validate": "run plans (or read measured step times) and compare with predictions",
    "validate-memory": "compile plans deviceless and compare predicted HBM with the compiler's",
}


def _runtime_parser() -> argparse.ArgumentParser:
    try:
        from runtime.cli import add_subcommands as add_run_commands
        from runtime.validation.cli import add_subcommands as add_validation_commands
    except ImportError as err:
        raise CpplanError(f"this command needs the jax runtime ({err}); install it with "
                          "pip install -e '.[runtime]'.") from None
    parser = argparse.ArgumentParser(prog="cpplan")
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_commands(sub)
    add_validation_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = _runtime_parser() if argv and argv[0] in RUNTIME_COMMANDS else build_parser()
        args = parser.parse_args(argv)
        return args.func(args)
    except CpplanError as err:
        print(f"cpplan: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
