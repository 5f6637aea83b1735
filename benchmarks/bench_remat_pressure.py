"""Does the TPU compiler recompute more than a remat policy asks when a step nears the HBM limit?

Compiles one MaxText v5p corpus run (`benchmarks/public_runs.csv`) deviceless with MaxText 0.2.5's
own `train_compile` (its Python 3.12 venv, made by `benchmarks/bench_maxtext.py`), once under the
run's remat policy and once under `remat_policy=full` as the control, with every layer (MaxText
scans its layers, so the compile takes about a minute whatever the depth, and the memory the
compiler must fit is the run's own) and the run's own decoder block (a 2023 run's is MaxText's
parallel block, `decoder_block=default`). From each compiled module it reads:
- the memory (`memory_analysis()`: peak, temporaries, arguments) against the chip's HBM;
- the matmul FLOPs one device executes per step, counted from the module text by
  `validation.compiled_program` (the reader bench_compiler_counts uses): every `dot` and
  `convolution` (the TPU compiler rewrites matmuls as convolutions, windowed over the tensor
  axis), times how often its computation runs (while-loop trip counts, nested: the layer scan and
  the windowed einsums inside it). `cost_analysis()` counts a loop body once, so it is no step
  total;
- the instructions XLA's HLO rematerialization pass cloned (their names end in `.remat`,
  `.remat2`, ...), and the FLOPs of the cloned matmuls,
and compares the executed matmul FLOPs with cpplan's (`cost_models.counts.executed_matmul_flops`
for the corpus row's plan).

Too slow for CI (two compiles of about a minute each and a 1.4 MB module text to read). Run from
the repository root:

    python benchmarks/bench_remat_pressure.py [--run v5p-32b-1x128] [--policies minimal,full]
        [--decoder-block llama2] [--venv /work/venvs/maxtext] [--out DIR]

Results: benchmarks/results/remat_pressure/ (one JSON per run, and README.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_maxtext import maxtext_python  # noqa: E402
from cost_models.counts import executed_matmul_flops  # noqa: E402
from cost_models.units import GiB  # noqa: E402
from planner.estimate import candidates_of, estimate  # noqa: E402
from planner.maxtext import BLOCK_FLAG  # noqa: E402
from runtime.compile import parse_hbm_oom  # noqa: E402
from validation.compiled_program import (instruction_flops, loop_trip_counts, one_line_per_instruction,  # noqa: E402
                                         parse_computations)
from validation.corpus import read_corpus, run_flags  # noqa: E402

# MaxText 2023's flag names → 0.2.5's (the corpus rows carry the 2023 names)
RENAMED = {"base_num_heads": ("base_num_query_heads", "base_num_kv_heads")}
# flags 0.2.5 no longer has, or that only place the run (the driver sets the topology itself)
DROPPED = {"enable_flash_attention", "dcn_data_parallelism"}
# runs MaxText's train_compile; where it would save the executable it writes the module's
# analyses and text instead
DRIVER = """
import json, sys
from absl import app
from maxtext.trainers.pre_train import train_compile
out = sys.argv.pop(1)
def save(compiled, _path):
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    memory = compiled.memory_analysis()
    json.dump({"cost_analysis_flops": float(cost["flops"]),
               "memory": {k: getattr(memory, k) for k in dir(memory) if k.endswith("_in_bytes")}},
              open(out + ".json", "w"))
    open(out + ".hlo", "w").write(compiled.as_text())
train_compile.save_compiled = save
app.run(train_compile.main)
"""
REMAT = re.compile(r"\.remat\d*(?:\.|$)")  # the names XLA's rematerialization gives its clones


def module_matmuls(hlo_text: str) -> dict:
    """Matmul FLOPs one device executes per step in a compiled module, all and those of
    instructions XLA's rematerialization cloned (by name and shape), with how often each runs
    (`validation.compiled_program`: its FLOPs of a dot or convolution and its loop trip counts).

    Args:
        hlo_text: the compiled module's text (`compiled.as_text()`).
    Returns:
        `matmul_flops`, `remat_matmul_flops`, `remat_matmuls` (clone, shape and runs → FLOPs),
        `remat_instructions` (how many instructions the pass cloned) and `loop_trip_counts`.
    """
    hlo_text = one_line_per_instruction(hlo_text)
    computations, entry = parse_computations(hlo_text)
    trips = loop_trip_counts(hlo_text)
    runs: dict[str, int] = defaultdict(int)
    caller_name = {}  # a fusion's matmul takes the name of the instruction that calls it

    def visit(name: str, times: int) -> None:
        runs[name] += times
        for instruction in computations[name].instructions if name in computations else ():
            for callee in instruction.called:
                caller_name.setdefault(callee, instruction.name)
                visit(callee, times * (trips.get(callee, 1) if instruction.opcode == "while" else 1))

    visit(entry, 1)
    total, cloned = 0.0, defaultdict(float)
    remat_names = [i.name for c in computations.values() for i in c.instructions if REMAT.search(i.name)]
    for name, computation in computations.items():
        for instruction in computation.instructions:
            flops = instruction_flops(instruction, computation.shapes) * runs[name]
            if not flops:
                continue
            total += flops
            owner = caller_name.get(name, instruction.name)
            if REMAT.search(owner) or REMAT.search(instruction.name):
                shape = instruction.shape.split("{")[0]
                cloned[f"{owner} {shape} × {runs[name]}"] += flops
    return {"matmul_flops": total, "remat_matmul_flops": sum(cloned.values()), "remat_matmuls": dict(cloned),
            "remat_instructions": len(remat_names), "loop_trip_counts": trips}


def compile_run(python: Path, flags: list[str], policy: str, workdir: Path) -> dict:
    """Compile the run under `policy`: the driver's analyses and the module's matmul count, or,
    where it does not fit even after XLA's rematerialization, the temporaries the compiler asked
    for and the HBM it had."""
    base_yml = subprocess.run([str(python), "-c", "import maxtext, os; print(os.path.join("
                               "os.path.dirname(maxtext.__file__), 'configs', 'base.yml'))"],
                              check=True, capture_output=True, text=True).stdout.strip()
    out = workdir / policy
    driver = workdir / "driver.py"
    driver.write_text(DRIVER)
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_WORKER_HOSTNAMES="localhost")
    cmd = [str(python), str(driver), str(out), base_yml, *flags, f"remat_policy={policy}",
           "run_name=remat_pressure", f"base_output_directory={workdir / 'maxtext'}",
           f"compiled_trainstep_file={workdir / 'unused'}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    oom = parse_hbm_oom(done.stderr) if done.returncode else None
    if oom is not None:
        return {"oom_required_bytes": oom[0], "oom_available_bytes": oom[1]}
    if done.returncode:
        raise SystemExit(f"compile failed ({' '.join(cmd)}):\n{done.stderr[-3000:]}")
    result = json.loads(Path(f"{out}.json").read_text())
    result.update(module_matmuls(Path(f"{out}.hlo").read_text()))
    return result


def maxtext_025_flags(run, *, decoder_block: str | None = None) -> list[str]:
    """The run's flags (its own over the 2023 defaults) in MaxText 0.2.5's names, with the decoder
    block the run had (or `decoder_block`): a 2023 run names none and ran MaxText's parallel block
    (`validation.corpus`), which 0.2.5 calls `default` (its own default is `llama2`, sequential)."""
    flags = run_flags(run.row, run.run_id)
    block = decoder_block or flags.pop(BLOCK_FLAG, None) or candidates_of(run.plan).model.decoder_block.value
    words = [f"{BLOCK_FLAG}={block}"]
    for key, value in flags.items():
        if key in DROPPED or key == "remat_policy":
            continue
        if key == "mlp_activations":
            value = f"[{value}]"
        words += [f"{new}={value}" for new in RENAMED.get(key, (key,))]
    return words


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="v5p-32b-1x128", help="the corpus row to compile")
    parser.add_argument("--venv", default="/work/venvs/maxtext", help="the MaxText 0.2.5 venv")
    parser.add_argument("--policies", help="comma-separated remat policies to compile (default: the run's own "
                                           "and full, the control)")
    parser.add_argument("--decoder-block", help="compile this decoder block instead of the run's (default, llama2)")
    parser.add_argument("--out", default="benchmarks/results/remat_pressure", help="writes <run>.json there")
    args = parser.parse_args()
    runs = {run.run_id: run for run in read_corpus("benchmarks/public_runs.csv")}
    if args.run not in runs:
        raise SystemExit(f"--run {args.run!r} is no row of benchmarks/public_runs.csv; the rows are: "
                         f"{', '.join(sorted(runs))}")
    run = runs[args.run]
    if args.decoder_block:  # price the block that is compiled
        run = dataclasses.replace(run, plan=dataclasses.replace(
            run.plan, model=dataclasses.replace(run.plan.model, decoder_block=args.decoder_block)))
    flags = maxtext_025_flags(run, decoder_block=args.decoder_block)
    python = maxtext_python(Path(args.venv))
    print(f"{args.run}: {' '.join(flags)}")
    report = {"run": args.run, "flags": flags, "policies": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for policy in args.policies.split(",") if args.policies else (run.plan.remat.value, "full"):
            compiled = compile_run(python, flags, policy, Path(tmp))
            plan = dataclasses.replace(run.plan, remat=type(run.plan.remat)(policy))
            predicted = float(executed_matmul_flops(candidates_of(plan))[0])
            priced = estimate(plan)
            if "oom_required_bytes" in compiled:
                row = {**compiled, "cpplan_hbm_gib": priced.hbm_bytes_per_device / GiB,
                       "capacity_gib": priced.hbm_capacity_bytes / GiB}
                report["policies"][policy] = row
                print(f"== remat_policy={policy}\n   does not fit: the compiler's temporaries need "
                      f"{compiled['oom_required_bytes'] / GiB:.2f} GiB of {compiled['oom_available_bytes'] / GiB:.2f} "
                      f"(after its rematerialization); cpplan prices the whole step at "
                      f"{row['cpplan_hbm_gib']:.1f} GiB of {row['capacity_gib']:.1f}", flush=True)
                continue
            memory = compiled["memory"]
            row = {"compiled_matmul_flops": compiled["matmul_flops"], "cpplan_matmul_flops": predicted,
                   "remat_matmul_flops": compiled["remat_matmul_flops"], "remat_matmuls": compiled["remat_matmuls"],
                   "remat_instructions": compiled["remat_instructions"],
                   "peak_gib": memory["peak_memory_in_bytes"] / GiB, "temp_gib": memory["temp_size_in_bytes"] / GiB,
                   "argument_gib": memory["argument_size_in_bytes"] / GiB,
                   "cpplan_hbm_gib": priced.hbm_bytes_per_device / GiB, "capacity_gib": priced.hbm_capacity_bytes / GiB,
                   "cpplan_step_s": priced.step_time_s, "cost_analysis_flops": compiled["cost_analysis_flops"],
                   "loop_trip_counts": compiled["loop_trip_counts"]}
            report["policies"][policy] = row
            print(f"== remat_policy={policy}\n"
                  f"   memory: peak {row['peak_gib']:.1f} GiB (temporaries {row['temp_gib']:.1f}, arguments "
                  f"{row['argument_gib']:.1f}) of {row['capacity_gib']:.1f}; cpplan prices {row['cpplan_hbm_gib']:.1f}\n"
                  f"   matmul FLOPs per device per step: compiled {row['compiled_matmul_flops']:.4e}, cpplan "
                  f"{predicted:.4e} (compiled/cpplan {row['compiled_matmul_flops'] / predicted:.4f})\n"
                  f"   XLA rematerialization: {row['remat_instructions']} cloned instructions, "
                  f"{row['remat_matmul_flops']:.4e} FLOPs in cloned matmuls "
                  f"({row['remat_matmul_flops'] / predicted:.2%} of cpplan's count)", flush=True)
            for what, flops in sorted(row["remat_matmuls"].items()):
                print(f"     {what}: {flops:.4e}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    suffix = f"-{args.decoder_block}-block" if args.decoder_block else ""
    (Path(args.out) / f"{args.run}{suffix}.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
