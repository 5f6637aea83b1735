"""`cpplan calibrate`, `cpplan validate` and `cpplan validate-memory` (jax is imported inside)."""
from __future__ import annotations

import argparse
import json

from cost_models.errors import CpplanError
from planner.options import parse_seq_len


def _seq_lens(text: str) -> list[int]:
    return [parse_seq_len(w) for w in text.split(",") if w.strip()]


def cmd_calibrate(args) -> int:
    from runtime.calibrate import calibrate

    shape = {}
    if args.model:
        from cost_models.models import get_model

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


def cmd_validate(args) -> int:
    from runtime.validation.measured import read_csv, read_maxtext_log
    from runtime.validation.steptime import compare_measured, validate_step_times

    if args.measured:
        if args.maxtext_flags:
            report = compare_measured([read_maxtext_log(args.measured, args.maxtext_flags)])
        else:
            report = compare_measured(read_csv(args.measured))
    else:
        if not (args.model and args.seq_lens and args.topology):
            raise CpplanError("cpplan validate needs --model, --seq-lens and --topology (or --measured FILE).")
        options = {"compute_dtype": args.compute_dtype, "param_dtype": "float32"}
        if args.strategies:
            options["strategies"] = args.strategies.split(",")
        report = validate_step_times(args.model, _seq_lens(args.seq_lens), args.topology, sequences=args.sequences,
                                     max_plans=args.max_plans, top=args.top, steps=args.steps, seed=args.seed,
                                     data=args.data, **options)
    files = report.write(args.out)
    print(json.dumps({k: v for k, v in report.to_dict().items() if k != "plans"}, indent=2, default=str))
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def cmd_validate_memory(args) -> int:
    from runtime.validation.memory import validate_memory

    report = validate_memory(args.model, _seq_lens(args.seq_lens), args.topologies.split(","), layers=args.layers,
                             per_strategy=args.per_strategy, sequences=args.sequences)
    files = report.write(args.out)
    print(report.markdown())
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Registers calibrate, validate and validate-memory on the cpplan command line."""
    p = sub.add_parser("calibrate", help="measure this machine's devices and write a chip row")
    p.add_argument("--topology", required=True, help="the devices present, e.g. cpu:8")
    p.add_argument("--dtype", default="float32", help="compute dtype measured (float32 on a CPU host)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--model", help="measure attention with this model's heads (default: 8 query, 4 kv heads of 32)")
    p.add_argument("--out", default="cpplan-chips", help="directory (or .json path) for the row")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("validate", help="run plans and compare predicted with measured step time")
    p.add_argument("--model")
    p.add_argument("--seq-lens", help="comma-separated, e.g. 2k,4k,8k")
    p.add_argument("--topology")
    p.add_argument("--strategies")
    p.add_argument("--sequences", type=int, default=1, help="sequences per step at every length")
    p.add_argument("--compute-dtype", default="float32", help="float32 on a CPU host")
    p.add_argument("--max-plans", type=int, default=16, help="plans per sequence length")
    p.add_argument("--top", type=int, default=3, help="of which the planner's top K")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", help="text file for the runs (synthetic tokens by default)")
    p.add_argument("--measured", help="a CSV of plans and step_seconds, or a MaxText log (with --maxtext-flags)")
    p.add_argument("--maxtext-flags", help="the MaxText flags of the logged run (text or a file)")
    p.add_argument("--out", default="validation", help="directory for report.md, report.json and plots")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("validate-memory", help="compile plans deviceless and compare predicted with compiled HBM")
    p.add_argument("--model", required=True)
    p.add_argument("--seq-lens", required=True)
    p.add_argument("--topologies", required=True, help="comma-separated, e.g. v5p:2x2x2,tpu7x:2x2x1")
    p.add_argument("--layers", type=int, default=2, help="decoder layers compiled")
    p.add_argument("--per-strategy", type=int, default=1)
    p.add_argument("--sequences", type=int, default=1, help="sequences per step")
    p.add_argument("--out", default="validation")
    p.set_defaults(func=cmd_validate_memory)
