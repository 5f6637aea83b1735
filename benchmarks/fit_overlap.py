"""Regenerates cost_models/data/overlap.json: which collectives XLA's TPU compiler makes
asynchronous and overlaps with compute in cpplan's training step, per chip and collective family.

    python benchmarks/fit_overlap.py            # compiles 8 plans deviceless (about 8 minutes here)
    python benchmarks/fit_overlap.py --dry-run  # prints the table, writes nothing

Each plan (every strategy, with tensor parallelism, on v5p:2x2x1 and tpu7x:2x2x1) is compiled
deviceless with libtpu (`runtime.compile.compile_step`; each chip in a child process, tpu7x's
with the compiler dumping its scheduled module, which libtpu 0.0.52 cannot print) and read by
`validation.compiled_program`. For every family (the price's categories; context traffic per
strategy) the file records the collectives' kinds, the fraction of their bytes per step that
are asynchronous, and the fraction asynchronous with matmul or kernel work scheduled between
their last operand hand-over and their done ("overlapped"). The price hides only the overlapped
fraction of a family.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
OUT = ROOT / "cost_models" / "data" / "overlap.json"

# topology → strategy → mesh; small model, 4096 tokens: every family appears and each compile
# takes about a minute here
PLANS = {
    "v5p:2x2x1": {"all_gather": dict(context=2, tensor=2), "ring": dict(context=4),
                  "ulysses": dict(context_ulysses=2, tensor=2), "usp": dict(context=2, context_ulysses=2)},
    "tpu7x:2x2x1": {"all_gather": dict(context=4, tensor=2), "ring": dict(context=4, tensor=2),
                    "ulysses": dict(context_ulysses=4, tensor=2), "usp": dict(context=2, context_ulysses=2, tensor=2)},
}
MODEL, SEQ_LEN, BLOCK = "small", 4096, 256


def make_plan(topology: str, strategy: str, mesh: dict):
    from cost_models.models import get_model
    from planner.plan import Plan, make_mesh

    return Plan(model=get_model(MODEL), topology=topology, seq_len=SEQ_LEN, global_batch=1,
                mesh=make_mesh(**mesh), cp_strategy=strategy,
                load_balance="none" if strategy == "ulysses" else "zigzag", block_q=BLOCK, block_kv=BLOCK,
                loss_chunk_tokens=256)


def chip_rows(topology: str) -> dict:
    """Compiles one topology's plans and sums each family's bytes: all, asynchronous, overlapped."""
    from runtime.compile import compile_step
    from validation.compiled_program import plan_mesh_axes, read_compiled_program

    totals = defaultdict(lambda: defaultdict(float))
    per_kind = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for strategy, mesh in PLANS[topology].items():
        plan = make_plan(topology, strategy, mesh)
        step = compile_step(plan)
        program = read_compiled_program(step.hlo_text, mesh_axes=plan_mesh_axes(plan))
        for c in program.collectives:
            family = f"context:{strategy}" if c.category == "context" else c.category
            for t in (totals[family], per_kind[family][c.kind]):
                t["bytes"] += c.step_bytes
                t["async"] += c.step_bytes * c.is_async
                t["overlapped"] += c.step_bytes * c.overlapped
        print(f"{topology} {strategy:10s} {mesh}: {len(program.collectives)} collectives, "
              f"compiled in {step.compile_s:.0f} s", flush=True)
    def row(t):
        return {"bytes_per_step": t["bytes"], "async_fraction": round(t["async"] / t["bytes"], 4),
                "overlapped_fraction": round(t["overlapped"] / t["bytes"], 4)}

    return {family: {**row(t), "by_kind": {kind: row(k) for kind, k in sorted(per_kind[family].items()) if k["bytes"]}}
            for family, t in sorted(totals.items()) if t["bytes"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print, do not write the data file")
    parser.add_argument("--topology", help="(child) compile this topology's plans")
    parser.add_argument("--part", help="(child) write its rows to this JSON file")
    args = parser.parse_args(argv)
    if args.topology:
        Path(args.part).write_text(json.dumps(chip_rows(args.topology)))
        return 0
    from runtime.compile import with_hlo_dump

    chips = {}
    for topology in PLANS:
        with tempfile.TemporaryDirectory(prefix="cpplan-hlo-") as work:
            part = os.path.join(work, "part.json")
            dump = os.path.join(work, "dump")
            os.makedirs(dump)
            env = with_hlo_dump(dict(os.environ), dump) if topology.startswith("tpu7x") else dict(os.environ)
            done = subprocess.run([sys.executable, __file__, "--topology", topology, "--part", part], env=env)
            if done.returncode:
                return done.returncode
            chips[topology.split(":")[0]] = json.loads(Path(part).read_text())
    for chip, families in chips.items():
        for family, row in families.items():
            kinds = ", ".join(f"{kind} {k['async_fraction']:.2f}/{k['overlapped_fraction']:.2f}"
                              for kind, k in row["by_kind"].items())
            print(f"{chip:6s} {family:20s} async {row['async_fraction']:.2f} overlapped {row['overlapped_fraction']:.2f}"
                  f"   ({kinds})")
    import jax
    import libtpu

    data = {
        "source": (f"cpplan's own training step compiled deviceless by XLA's TPU compiler (libtpu "
                   f"{getattr(libtpu, '__version__', '0.0.52')}, jax {jax.__version__}, default compiler flags); its "
                   "scheduled module read by validation/compiled_program.py"),
        "derived": ("per chip and family: bytes per step (loop bodies times their trip counts) of the collectives that "
                    "are asynchronous, and of those with matmul or kernel work scheduled between their last operand "
                    "hand-over and their done ('overlapped'), as fractions of the family's bytes; context families "
                    "per strategy. Regenerate with benchmarks/fit_overlap.py"),
        "date": datetime.date.today().isoformat(),
        "model": MODEL, "seq_len": SEQ_LEN, "block": BLOCK,
        "plans": [f"{topology} {strategy} {mesh}" for topology, plans in PLANS.items()
                  for strategy, mesh in plans.items()],
        "chips": chips,
    }
    if not args.dry_run:
        OUT.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
