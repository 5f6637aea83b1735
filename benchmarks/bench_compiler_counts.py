"""Counts against the compiler: compiles 38 small plans deviceless (every strategy, zigzag and
none, the three remat policies, tensor > 1, fsdp > 1 up to 8, the sequential and the parallel decoder
block, local layers and packed documents, v5p and tpu7x) and prints per plan the compiled step's
matmul FLOPs and the link bytes of each collective family next to the price's, and for the plans
with local layers also HBM per device.

    python benchmarks/bench_compiler_counts.py              # all plans (11-20 minutes on the shared 2 cores)
    python benchmarks/bench_compiler_counts.py --only ring  # plans whose label ("ring context=4") matches
    python benchmarks/bench_compiler_counts.py --only parallel  # the parallel-block plans
    python benchmarks/bench_compiler_counts.py --only local     # the plans with local layers
    python benchmarks/bench_compiler_counts.py --hlo-dir D  # keeps each compiled module in D; a later
                                                            # run with D re-prices them without compiling

FLOPs: `validation.compiled_program` counts every convolution and dot of the scheduled module
times its loop trip counts (splash runs as a Mosaic kernel and is left out, as attention is on
the price's side); XLA's `cost_analysis()` flops are printed beside it, but count a while body
once. Bytes: both sides through the `cost_models.collectives` formulas at 1 byte/s (see
`cost_models.counts`). Targets: FLOPs within 3%, each family's bytes within 5%; HBM within 10%.
"""

import argparse
import dataclasses
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

FLOPS_TARGET, BYTES_TARGET, HBM_TARGET = 0.03, 0.05, 0.10
V5P, V5P_8, TPU7X = "v5p:2x2x1", "v5p:2x2x2", "tpu7x:2x2x1"
WINDOW_700 = dict(window=700, layer_pattern="LG")
CHUNKS_512 = dict(window=512, local_kind="chunked")
DOCUMENTS_1K = dict(documents=1024)
FULL, DOTS, MINIMAL = "full", "save_dot_except_mlp", "minimal_with_context"
SEQUENTIAL, PARALLEL = "llama2", "default"  # ModelSpec.decoder_block


class Row(NamedTuple):
    """One plan of the benchmark."""

    topology: str
    strategy: str
    mesh: dict
    zigzag: bool
    remat: str
    batch: int  # sequences per step
    block: str = SEQUENTIAL
    local: dict | None = None  # ModelSpec fields of local layers or packed documents
    local_strategy: str | None = None  # the local layers' own strategy (`Plan.local_strategy`)


PLANS = [
    Row(*row)
    for row in [
        (V5P, "none", dict(fsdp=4), False, FULL, 4),
        (V5P, "none", dict(fsdp=2, tensor=2), False, DOTS, 2),
        (V5P, "all_gather", dict(context=4), True, FULL, 1),
        (V5P, "all_gather", dict(context=2, tensor=2), False, MINIMAL, 1),
        (V5P, "all_gather", dict(context=2, fsdp=2), True, DOTS, 2),
        (V5P, "ring", dict(context=4), True, FULL, 1),
        (V5P, "ring", dict(context=4), False, MINIMAL, 1),
        (V5P, "ring", dict(context=2, tensor=2), True, DOTS, 1),
        (V5P, "ulysses", dict(context_ulysses=4), False, FULL, 1),
        (V5P, "ulysses", dict(context_ulysses=2, fsdp=2), False, MINIMAL, 2),
        (V5P, "usp", dict(context=2, context_ulysses=2), True, FULL, 1),
        (V5P, "usp", dict(context=2, context_ulysses=2), False, DOTS, 1),
        (TPU7X, "none", dict(fsdp=4, tensor=2), False, FULL, 4),
        (TPU7X, "all_gather", dict(context=8), True, FULL, 1),
        (TPU7X, "all_gather", dict(context=4, tensor=2), True, MINIMAL, 1),
        (TPU7X, "ring", dict(context=8), True, DOTS, 1),
        (TPU7X, "ring", dict(context=4, fsdp=2), True, FULL, 2),
        (TPU7X, "ring", dict(context=4, tensor=2), False, FULL, 1),
        (TPU7X, "ulysses", dict(context_ulysses=4, tensor=2), False, FULL, 1),
        (TPU7X, "ulysses", dict(context_ulysses=4, fsdp=2), False, DOTS, 2),
        (TPU7X, "usp", dict(context=4, context_ulysses=2), True, FULL, 1),
        (TPU7X, "usp", dict(context=2, context_ulysses=2, tensor=2), False, MINIMAL, 1),
        # fsdp over 8: the q/k/v projections as windowed einsums (the backward's too where they are kept)
        (V5P_8, "none", dict(fsdp=8), False, FULL, 8),
        (TPU7X, "none", dict(fsdp=8), False, DOTS, 16),
        # a ring of two (one hop) under full remat: the q/k/v weights gathered once in the backward
        (V5P, "ring", dict(context=2, fsdp=2), False, FULL, 2),
        (V5P, "ring", dict(context=2, tensor=2), True, FULL, 1),
        (TPU7X, "ring", dict(context=2, fsdp=4), True, FULL, 4),
        # the parallel block: its tensor collectives (4 per layer, 5 under full remat) are priced from
        # the runtime's traced program; these check them against what XLA compiles
        (V5P, "none", dict(fsdp=2, tensor=2), False, DOTS, 2, PARALLEL),
        (V5P, "ring", dict(context=2, tensor=2), True, FULL, 1, PARALLEL),
        (TPU7X, "all_gather", dict(context=4, tensor=2), True, MINIMAL, 1, PARALLEL),
        # local layers (natural order): a ring block of 1024 (v5p) or 512 (tpu7x) tokens; windows of one
        # and two hops, chunks within a block, every other layer global
        (V5P, "ring", dict(context=4), False, FULL, 1, SEQUENTIAL, WINDOW_700),
        (V5P, "all_gather", dict(context=4), False, DOTS, 1, SEQUENTIAL, WINDOW_700),
        (V5P, "usp", dict(context=2, context_ulysses=2), False, MINIMAL, 1, SEQUENTIAL, DOCUMENTS_1K),
        (TPU7X, "ring", dict(context=8), False, DOTS, 1, SEQUENTIAL, WINDOW_700),
        (TPU7X, "ulysses", dict(context_ulysses=4, fsdp=2), False, FULL, 2, SEQUENTIAL, CHUNKS_512),
        (TPU7X, "none", dict(fsdp=8), False, FULL, 8, SEQUENTIAL, WINDOW_700),
        # the local layers under a strategy of their own: the ring's hops beside all-gather's global layers
        (V5P, "all_gather", dict(context=4), False, FULL, 1, SEQUENTIAL, WINDOW_700, "ring"),
        (TPU7X, "all_gather", dict(context=8), False, DOTS, 1, SEQUENTIAL, WINDOW_700, "ring"),
    ]
]
MODEL, SEQ_LEN, BLOCK = "small", 4096, 256


def make_plan(row: Row):
    from cost_models.models import get_model
    from planner.plan import Plan, make_mesh

    model = get_model(MODEL)
    if row.block != SEQUENTIAL:
        model = dataclasses.replace(model, name=f"{MODEL}-{row.block}", decoder_block=row.block)
    if row.local:
        model = dataclasses.replace(model, name=f"{MODEL}-local", **row.local)
    return Plan(
        model=model,
        topology=row.topology,
        seq_len=SEQ_LEN,
        global_batch=row.batch,
        mesh=make_mesh(**row.mesh),
        cp_strategy=row.strategy,
        local_strategy=row.local_strategy,
        load_balance="zigzag" if row.zigzag else "none",
        remat=row.remat,
        block_q=BLOCK,
        block_kv=BLOCK,
        loss_chunk_tokens=256,
    )


def plan_label(row: Row) -> str:
    """A plan row's strategy and mesh, and "parallel" for a parallel block, as `--only` matches
    them: "ring context=2,tensor=2", "ring context=2,tensor=2 parallel"."""
    label = f"{row.strategy} " + ",".join(f"{k}={v}" for k, v in row.mesh.items())
    local = " local " + ",".join(f"{k}={v}" for k, v in row.local.items()) if row.local else ""
    local += f" under {row.local_strategy}" if row.local_strategy else ""
    return label + (" parallel" if row.block == PARALLEL else "") + local


def _pct(error) -> str:
    if error is None:
        return "    –"
    return "  only priced" if math.isinf(error) else f"{100 * error:+6.1f}%"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", help='run plans whose label, strategy then mesh ("ring context=2,tensor=2"), contains this text'
    )
    parser.add_argument(
        "--topology",
        help="run this topology's plans in this process (the script runs each "
        "topology in a child whose TPU compiler dumps its modules)",
    )
    parser.add_argument(
        "--hlo-dir",
        help="folder of compiled modules: a plan's module found there is read "
        "instead of compiled, one compiled is written there",
    )
    args = parser.parse_args(argv)
    if args.topology is None:
        return run_children(args)
    from validation.compiled_program import COMPARED, count_check, read_plan_program

    worst_flops, worst_hbm, worst_bytes, over_bytes, compared, misses = 0.0, 0.0, {}, {}, {}, []
    rows = [row for row in PLANS if (not args.only or args.only in plan_label(row)) and row.topology == args.topology]
    for row in rows:
        plan = make_plan(row)
        step = compiled_module(plan, row, args.hlo_dir)
        check = count_check(plan, read_plan_program(step["hlo_text"], plan))
        name = f"{row.topology} {plan_label(row)}"
        print(
            f"\n{name} {'zigzag' if row.zigzag else 'none'} {row.remat} batch {row.batch} "
            f"(compiled in {step['compile_s']:.0f} s)"
        )
        print(
            f"  matmul FLOPs  compiled {check.compiled_flops:.4g}  priced {check.priced_flops:.4g}  "
            f"{_pct(check.flops_error)}   (cost_analysis, loop bodies once: {step['cost_flops']:.4g})"
        )
        worst_flops = max(worst_flops, abs(check.flops_error), key=abs)
        if abs(check.flops_error) > FLOPS_TARGET:
            misses.append(f"{name} {row.remat}: FLOPs {_pct(check.flops_error)}")
        for category in COMPARED:
            error = check.bytes_error(category)
            if error is None:
                continue
            print(
                f"  {category:20s} compiled {check.compiled_bytes.get(category, 0.0):12.0f}  priced "
                f"{check.priced_bytes.get(category, 0.0):12.0f}  {_pct(error)}"
            )
            compared[category] = compared.get(category, 0) + 1
            if not math.isinf(error):
                worst_bytes[category] = max(worst_bytes.get(category, 0.0), abs(error))
            if math.isinf(error) or abs(error) > BYTES_TARGET:
                over_bytes[category] = over_bytes.get(category, 0) + 1
                misses.append(f"{name} {row.remat}: {category} {_pct(error)}")
        if row.local:
            from planner.estimate import estimate

            priced = estimate(plan).hbm_bytes_per_device
            hbm_error = priced / step["hbm_bytes"] - 1
            print(
                f"  HBM per device    compiled {step['hbm_bytes'] / 2**30:.3f} GiB  priced {priced / 2**30:.3f} GiB  "
                f"{_pct(hbm_error)}"
            )
            worst_hbm = max(worst_hbm, abs(hbm_error))
            if abs(hbm_error) > HBM_TARGET:
                misses.append(f"{name} {row.remat}: HBM {_pct(hbm_error)}")
        if check.wasted_bytes or check.other_bytes:
            print(
                f"  beyond the price: {check.wasted_bytes:.0f} B of weight gradients all-reduced whole (a "
                f"reduce-scatter moves half), {check.other_bytes:.0f} B uncategorised"
            )
    print(f"\n{len(rows)} plans; worst FLOPs error {100 * worst_flops:.2f}% (target {100 * FLOPS_TARGET:.0f}%)")
    print(
        f"bytes per family (target {100 * BYTES_TARGET:.0f}%): "
        + ", ".join(
            f"{k} worst {100 * v:.1f}%, {over_bytes.get(k, 0)} of {compared[k]} plans over"
            for k, v in worst_bytes.items()
        )
    )
    if any(row.local for row in rows):
        print(f"HBM of the plans with local layers: worst {100 * worst_hbm:.1f}% (target {100 * HBM_TARGET:.0f}%)")
    print(f"{len(misses)} misses" + "".join(f"\n  {m}" for m in misses))
    return 0


def compiled_module(plan, row: Row, hlo_dir: str | None) -> dict:
    """The plan's scheduled module, compile time and cost-analysis FLOPs: read from `hlo_dir`
    where an earlier run kept them, else compiled (and kept there when `hlo_dir` is given)."""
    import gzip
    import json

    name = "_".join(
        [
            row.topology.replace(":", "-"),
            row.strategy,
            *(f"{k}{v}" for k, v in row.mesh.items()),
            "zigzag" if row.zigzag else "none",
            row.remat,
            f"batch{row.batch}",
            *([] if row.block == SEQUENTIAL else [row.block]),
            *(f"{k}{v}" for k, v in (row.local or {}).items()),
            *([f"local{row.local_strategy}"] if row.local_strategy else []),
        ]
    )
    path = Path(hlo_dir, name + ".json.gz") if hlo_dir else None
    if path is not None and path.exists():
        with gzip.open(path, "rt") as f:
            return json.load(f)
    from runtime.compile import compile_step

    step = compile_step(plan)
    clear_dump()
    module = {
        "hlo_text": step.hlo_text,
        "compile_s": step.compile_s,
        "cost_flops": step.cost_flops,
        "hbm_bytes": step.memory.hbm_bytes_per_device,
    }
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            json.dump(module, f)
    return module


def clear_dump() -> None:
    """Empties the compiler's dump directory (thousands of files per compile) once it is read."""
    import re

    match = re.search(r"--xla_jf_dump_to=(\S+)", os.environ.get("LIBTPU_INIT_ARGS", ""))
    if match and os.path.isdir(match.group(1)):
        shutil.rmtree(match.group(1))
        os.makedirs(match.group(1))


def run_children(args) -> int:
    """Runs each topology's plans in a child process: libtpu 0.0.52 cannot print tpu7x steps
    (`as_text` fails), so a tpu7x child's compiler dumps its scheduled modules to a temporary folder."""
    from runtime.compile import with_hlo_dump

    status = 0
    for topology in dict.fromkeys(row.topology for row in PLANS):
        with tempfile.TemporaryDirectory(prefix="cpplan-hlo-") as dump:
            command = (
                [sys.executable, __file__, "--topology", topology]
                + (["--only", args.only] if args.only else [])
                + (["--hlo-dir", args.hlo_dir] if args.hlo_dir else [])
            )
            env = with_hlo_dump(dict(os.environ), dump) if topology.startswith("tpu7x") else dict(os.environ)
            status |= subprocess.run(command, env=env).returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
