"""Regenerates cost_models/data/overlap.json: which collectives XLA's TPU compiler makes
asynchronous and overlaps with compute in cpplan's training step, per chip and collective family.

    python regenerate/fit_overlap.py                       # every chip's plans (about an hour here)
    python regenerate/fit_overlap.py --chip v5e --chip v6e # those chips' rows; the others kept
    python regenerate/fit_overlap.py --dry-run             # prints the table, writes nothing

Each chip's plans are compiled deviceless with libtpu (`runtime.compile.compile_step`), in a
child process per chip started with the compiler flags cpplan's runtime uses on that chip
(`runtime.compile.TPU_COMPILER_FLAGS`) and with the compiler dumping its scheduled module (libtpu
0.0.52 cannot print modules holding SparseCore async updates, which v5p and tpu7x steps have),
and read by `validation.compiled_program`. Two kinds of plan:
- one like a real run's layer (`REPRESENTATIVE`): Llama 3.1 8B's widths (hidden 4096, MLP 14336,
  32 heads, 8 KV heads), 2 layers (the layer loop's trip count is read, so 2 stand for any
  number), 8192 tokens, 4 sequences on fsdp 4 x tensor 2: 8192 tokens per device, as the public
  runs have; its weight gathers, gradient reduce-scatters and tensor all-reduces are the sizes
  those runs move per layer. Every chip has it.
- small plans of each context-parallel strategy (`CONTEXT_PLANS`, v5p and tpu7x), for the
  context families.
Per family (the price's categories; context traffic per strategy) the file records the
collectives' kinds, the fraction of their bytes per step that are asynchronous, and the fraction
asynchronous with matmul or kernel work scheduled between their last operand hand-over and their
done ("overlapped"), summed over the chip's plans by bytes (the representative plan's weights
and tensor sums outweigh the small plans' by two orders of magnitude). The price hides only the
overlapped fraction of a family. Each chip's provenance (plans, flags, libtpu, date) is kept
with its rows.
"""

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
OUT = ROOT / "cost_models" / "data" / "overlap.json"

# chip → its 8-device slice (v5p and tpu7x count 2 TensorCores a chip)
TOPOLOGY = {"v5p": "v5p:2x2x2", "v5e": "v5e:2x4", "v6e": "v6e:2x4", "tpu7x": "tpu7x:2x2x1"}
REPRESENTATIVE = dict(
    model="llama3.1-8b",
    num_layers=2,
    seq_len=8192,
    global_batch=4,
    block=512,
    strategy="none",
    mesh=dict(fsdp=4, tensor=2),
)
# the small model, 4096 tokens, 4 devices (v5p) or 8 (tpu7x): every context family appears and
# each compiles in about a minute here
_SMALL = dict(model="small", num_layers=4, seq_len=4096, global_batch=1, block=256)
CONTEXT_PLANS = {
    "v5p:2x2x1": {
        "all_gather": dict(context=2, tensor=2),
        "ring": dict(context=4),
        "ulysses": dict(context_ulysses=2, tensor=2),
        "usp": dict(context=2, context_ulysses=2),
    },
    "tpu7x:2x2x1": {
        "all_gather": dict(context=4, tensor=2),
        "ring": dict(context=4, tensor=2),
        "ulysses": dict(context_ulysses=4, tensor=2),
        "usp": dict(context=2, context_ulysses=2, tensor=2),
    },
}


def chip_plans(chip: str) -> list[tuple[str, dict]]:
    """(topology, plan settings) of every plan compiled for a chip."""
    plans = [(TOPOLOGY[chip], REPRESENTATIVE)]
    for topology, strategies in CONTEXT_PLANS.items():
        if topology.split(":")[0] == chip:
            plans += [(topology, dict(_SMALL, strategy=s, mesh=m)) for s, m in strategies.items()]
    return plans


def describe(topology: str, settings: dict) -> str:
    mesh = " ".join(f"{a}={n}" for a, n in settings["mesh"].items())
    return (
        f"{topology} {settings['strategy']} [{mesh}] {settings['model']} x{settings['num_layers']} layers, "
        f"seq {settings['seq_len']}, {settings['global_batch']} sequences"
    )


def make_plan(topology: str, settings: dict):
    from cost_models.models import get_model
    from planner.plan import Plan, make_mesh

    base = get_model(settings["model"])
    model = dataclasses.replace(base, num_layers=settings["num_layers"], name=f"{base.name}-{settings['num_layers']}l")
    strategy = settings["strategy"]
    return Plan(
        model=model,
        topology=topology,
        seq_len=settings["seq_len"],
        global_batch=settings["global_batch"],
        mesh=make_mesh(**settings["mesh"]),
        cp_strategy=strategy,
        load_balance="none" if strategy in ("none", "ulysses") else "zigzag",
        block_q=settings["block"],
        block_kv=settings["block"],
        loss_chunk_tokens=256,
    )


def chip_rows(chip: str) -> dict:
    """Compiles one chip's plans and sums each family's bytes: all, asynchronous, overlapped."""
    from runtime.compile import compile_step
    from validation.compiled_program import read_plan_program

    totals = defaultdict(lambda: defaultdict(float))
    per_kind = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for topology, settings in chip_plans(chip):
        plan = make_plan(topology, settings)
        step = compile_step(plan)
        program = read_plan_program(step.hlo_text, plan)
        for c in program.collectives:
            family = f"context:{plan.cp_strategy.value}" if c.category == "context" else c.category
            for t in (totals[family], per_kind[family][c.kind]):
                t["bytes"] += c.step_bytes
                t["async"] += c.step_bytes * c.is_async
                t["overlapped"] += c.step_bytes * c.overlapped
        print(
            f"{describe(topology, settings)}: {len(program.collectives)} collectives, compiled in "
            f"{step.compile_s:.0f} s",
            flush=True,
        )

    def row(t):
        return {
            "bytes_per_step": t["bytes"],
            "async_fraction": round(t["async"] / t["bytes"], 4),
            "overlapped_fraction": round(t["overlapped"] / t["bytes"], 4),
        }

    return {
        family: {**row(t), "by_kind": {kind: row(k) for kind, k in sorted(per_kind[family].items()) if k["bytes"]}}
        for family, t in sorted(totals.items())
        if t["bytes"]
    }


def compile_chip(chip: str) -> dict:
    """A chip's rows, compiled in a child process with the runtime's flags for it and a dump."""
    from runtime.compile import TPU_COMPILER_FLAGS, with_compiler_flags, with_hlo_dump

    with tempfile.TemporaryDirectory(prefix="cpplan-hlo-") as work:
        part, dump = os.path.join(work, "part.json"), os.path.join(work, "dump")
        os.makedirs(dump)
        env = with_hlo_dump(with_compiler_flags(dict(os.environ), chip), dump)
        done = subprocess.run([sys.executable, __file__, "--child", chip, "--part", part], env=env)
        if done.returncode:
            raise SystemExit(done.returncode)
        rows = json.loads(Path(part).read_text())
    import jax
    import libtpu

    provenance = {
        "plans": [describe(t, s) for t, s in chip_plans(chip)],
        "compiler_flags": TPU_COMPILER_FLAGS.get(chip, "") or "libtpu's defaults",
        "libtpu": getattr(libtpu, "__version__", "0.0.52"),
        "jax": jax.__version__,
        "date": datetime.date.today().isoformat(),
    }
    return {"rows": rows, "provenance": provenance}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--chip",
        action="append",
        choices=sorted(TOPOLOGY),
        help="regenerate this chip's rows (repeatable; default every chip), keeping the others",
    )
    parser.add_argument("--dry-run", action="store_true", help="print, do not write the data file")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # compile this chip's plans in this process
    parser.add_argument("--part", help=argparse.SUPPRESS)  # (child) write its rows to this JSON file
    args = parser.parse_args(argv)
    if args.child:
        Path(args.part).write_text(json.dumps(chip_rows(args.child)))
        return 0
    start = time.perf_counter()
    data = json.loads(OUT.read_text()) if OUT.exists() else {"chips": {}, "provenance": {}}
    for chip in args.chip or sorted(TOPOLOGY):
        compiled = compile_chip(chip)
        data["chips"][chip], data["provenance"][chip] = compiled["rows"], compiled["provenance"]
        for family, row in compiled["rows"].items():
            kinds = ", ".join(
                f"{kind} {k['async_fraction']:.2f}/{k['overlapped_fraction']:.2f}" for kind, k in row["by_kind"].items()
            )
            print(
                f"{chip:6s} {family:20s} async {row['async_fraction']:.2f} overlapped "
                f"{row['overlapped_fraction']:.2f}   ({kinds})"
            )
    data["source"] = (
        "cpplan's own training step compiled deviceless by XLA's TPU compiler with the flags cpplan's "
        "runtime uses on the chip (runtime/compile.py TPU_COMPILER_FLAGS); its scheduled module read by "
        "validation/compiled_program.py. Per chip: the plans, flags, libtpu and date under provenance"
    )
    data["derived"] = (
        "per chip and family: bytes per step (loop bodies times their trip counts) of the collectives "
        "that are asynchronous, and of those with matmul or kernel work scheduled between their last "
        "operand hand-over and their done ('overlapped'), as fractions of the family's bytes summed "
        "over the chip's plans; context families per strategy. Regenerate with "
        "regenerate/fit_overlap.py"
    )
    data = {key: data[key] for key in ("source", "derived", "provenance", "chips")}
    print(f"compiled in {time.perf_counter() - start:.0f} s")
    if not args.dry_run:
        OUT.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
