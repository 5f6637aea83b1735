"""cpplan's `--target maxtext` HBM prediction against MaxText 0.2.5's own compiler, per exported plan.

Each plan is chosen by cpplan under the MaxText target (a fixed strategy and mesh), exported with
`planner.maxtext.export_maxtext`, and compiled deviceless by MaxText's `train_compile` in its own
Python 3.12 venv (created here when absent: `pip install 'maxtext[tpu]==0.2.5'`). The compiled
HBM per device is arguments + outputs − aliased + temporaries + code (`runtime.compile.
CompiledMemory`); where MaxText runs out of memory, the figure its error gives (it says "HLO
temporaries", but the arguments are in it: checked against a dump's buffer assignment, in `main`).
Targets: within 10% and the same fit verdict on each plan.

Eight plans offload to the host (MaxText's `minimal_offloaded` at 128K and 144K, `qkv_proj_offloaded` at 64K
and just over the HBM limit at 384K, a `custom` one, and the search's own `custom` plans at 128K), compiled as
exported: without the `HOST_OFFLOAD_FLAGS`
MaxText's own recipes put in LIBTPU_INIT_ARGS (the export's note says so). Their compiles hold what
the target's offload traits price (`cost_models.targets`), read from the buffers live at the peak
of the 128K `minimal_offloaded` compile and its `remat_policy=full` twin (`XLA_FLAGS=--xla_dump_to=
DIR`, `validation/peak_buffers.py DIR --module jit_train_step`).

Too slow for CI (MaxText's compiles take minutes on a small host; its all-gather and Ulysses
masks grow as S², so those lengths stay short). Run from the repository root:

    python benchmarks/bench_maxtext.py [--only NAME,...] [--venv DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_models.remat import custom_placements  # noqa: E402
from cost_models.units import GiB  # noqa: E402
from cost_models.vocabulary import Placement, RematPolicy  # noqa: E402
from planner import api  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.maxtext import export_maxtext, format_flags  # noqa: E402
from runtime.compile import CompiledMemory, parse_hbm_oom  # noqa: E402

PYTHON_312 = ["env", "PYENV_VERSION=3.12.1", "python3.12"]
# where the MaxText 0.2.5 venv lives unless --venv says otherwise
DEFAULT_VENV = Path(os.environ.get("CPPLAN_MAXTEXT_VENV", Path.home() / ".cache" / "cpplan" / "maxtext-0.2.5-venv"))
MAXTEXT_REQUIREMENT = "maxtext[tpu]==0.2.5"
TOLERANCE = 0.10
MODEL = "llama3.1-8b"

# (name, topology, seq_len, strategy, fixed mesh, extra options): all four strategies, v5p and
# tpu7x, lengths that compile in minutes, plans that do not fit, and plans that offload to the host
PLANS = [
    ("v5p-8 all_gather 4 × 32K", "v5p-8", "32k", "all_gather", {"context": 4}, {}),
    ("v5p-8 ulysses 4 × 32K", "v5p-8", "32k", "ulysses", {"context_ulysses": 4}, {}),
    ("v5p-8 ring 4 × 64K", "v5p-8", "64k", "ring", {"context": 4}, {}),
    ("tpu7x-8 usp 4×2 × 64K zigzag", "tpu7x-8", "64k", "usp", {"context": 2, "context_ulysses": 4}, {}),
    ("tpu7x-8 ring 8 × 64K, 2 vocab tiles", "tpu7x-8", "64k", "ring", {"context": 8}, {"loss_chunk_tokens": 4096}),
    # the ring's dq partials rolled into dq_reduction_steps=3 (the export's since 2026-12-06): 256K fits, 384K not
    ("v5p-8 ring 4 × 256K", "v5p-8", "256k", "ring", {"context": 4}, {}),
    ("tpu7x-8 usp 4×2 × 256K", "tpu7x-8", "256k", "usp", {"context": 2, "context_ulysses": 4}, {}),
    ("v5p-8 ring 4 × 384K (does not fit)", "v5p-8", "384k", "ring", {"context": 4}, {}),
    # host offload (MaxText's own presets), one just over the HBM limit
    ("v5p-8 ring 4 × 128K minimal_offloaded", "v5p-8", "128k", "ring", {"context": 4}, {"remat": "minimal_offloaded"}),
    (
        "v5p-8 ring 4 × 144K minimal_offloaded zigzag",
        "v5p-8",
        "144k",
        "ring",
        {"context": 4},
        {"remat": "minimal_offloaded", "load_balance": ["zigzag"]},
    ),
    (
        "v5p-8 ring 4 × 384K qkv_proj_offloaded zigzag (does not fit)",
        "v5p-8",
        "384k",
        "ring",
        {"context": 4},
        {"remat": "qkv_proj_offloaded", "load_balance": ["zigzag"]},
    ),
    (
        "tpu7x-8 usp 4×2 × 64K qkv_proj_offloaded",
        "tpu7x-8",
        "64k",
        "usp",
        {"context": 2, "context_ulysses": 4},
        {"remat": "qkv_proj_offloaded"},
    ),
    (
        "v5p-8 ring 4 × 64K custom: layer input, q/k/v, mlpwi offloaded",
        "v5p-8",
        "64k",
        "ring",
        {"context": 4},
        {"custom": {"decoder_layer_input": "offload", "qkv_proj": "offload", "mlpwi": "offload"}},
    ),
    # the search's own custom plans at 128K (the layer input and the attention output offloaded, many
    # sequences a step): the MLP recomputed first, its weight gradients after the attention's backward
    (
        "tpu7x-16 all_gather 8 × fsdp 2 × 128K custom, 30 sequences",
        "tpu7x-16",
        "128k",
        "all_gather",
        {"fsdp": 2, "context": 8},
        {"remat": "custom", "global_batch": 30, "loss_chunk_tokens": 8192},
    ),
    (
        "v5p-16 ring 2 × tensor 4 × 128K custom zigzag, 14 sequences",
        "v5p-16",
        "128k",
        "ring",
        {"context": 2, "tensor": 4},
        {"remat": "custom", "global_batch": 14, "loss_chunk_tokens": 8192, "load_balance": ["zigzag"]},
    ),
    (
        "v5p-16 ring 4 × tensor 2 × 128K custom zigzag, 14 sequences",
        "v5p-16",
        "128k",
        "ring",
        {"context": 4, "tensor": 2},
        {"remat": "custom", "global_batch": 14, "loss_chunk_tokens": 8192, "load_balance": ["zigzag"]},
    ),
]


def maxtext_python(venv: Path) -> Path:
    """The MaxText venv's python, creating the venv and installing MaxText 0.2.5 when absent."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} with {MAXTEXT_REQUIREMENT} (minutes) ...", flush=True)
        subprocess.run([*PYTHON_312, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", MAXTEXT_REQUIREMENT], check=True)
    return python


def exported(topology: str, seq_len: str, strategy: str, mesh: dict, extra: dict):
    """The best MaxText-target plan of one strategy on a fixed mesh (one sequence and remat full unless
    `extra` names a global batch or a policy), exported. `extra["custom"]` (MaxText's per-name placements) makes the
    plan `remat_policy=custom` with them, as a user edits a plan: the search cannot offer `custom`."""
    full = {"data": 1, "fsdp": 1, "context": 1, "context_ulysses": 1, "tensor": 1, **mesh}
    options = {"remat": "full", "loss_chunk_tokens": 0, "global_batch": 1, **extra}
    custom = options.pop("custom", None)
    result = api.run_search(MODEL, seq_len, topology, target="maxtext", mesh=full, strategies=[strategy], **options)
    ranked = list(result.ranked[:1]) or result.best_infeasible[:1]
    if not ranked:
        reasons = "; ".join(sorted({r.reason for r in result.rejections}))
        raise SystemExit(f"{strategy} on {topology} at {seq_len}: no candidate ({reasons})")
    plan = ranked[0].plan
    if custom:
        plan = dataclasses.replace(
            plan,
            remat=RematPolicy.CUSTOM,
            remat_custom=custom_placements(
                {name: Placement.parse(where) for name, where in custom.items()}, maxtext_names=True
            ),
        )
    return export_maxtext(plan)


def command_line(export) -> str:
    """An export's compile as the bench runs it and its log names it: its LIBTPU_INIT_ARGS, then the
    training flags and the `compile_topology*` flags."""
    env = f"LIBTPU_INIT_ARGS={shlex.quote(export.libtpu_init_args)}"
    return f"{env} {format_flags(export.flags)} {format_flags(export.compile_flags)}"


def compile_with_maxtext(python: Path, export, out_dir: Path, name: str, *, reuse: bool = False):
    """(compiled memory or None, out-of-memory (required, available) or None, seconds, log path) of an
    export compiled as it asks (its flags, and its LIBTPU_INIT_ARGS in the environment).

    With `reuse`, a log of the same command line from an earlier run is read instead of compiling again.
    """
    tag = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    env_words = [f"LIBTPU_INIT_ARGS={export.libtpu_init_args}"]
    words = [f"{k}={v}" for k, v in {**export.flags, **export.compile_flags}.items()]
    log = out_dir / f"{tag}.log"
    if reuse and log.exists() and log.read_text().startswith(" ".join(env_words + words) + "\n"):
        text = log.read_text()
        seconds = float(re.search(r"^compile_s=([0-9.]+)$", text, re.M).group(1))
        return (*_memory_of(text), seconds, log)
    base_yml = subprocess.run(
        [
            str(python),
            "-c",
            "import maxtext, os; print(os.path.join(os.path.dirname(maxtext.__file__), 'configs', 'base.yml'))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    extra = ["dataset_type=synthetic", f"run_name={tag}", f"base_output_directory={out_dir / 'maxtext'}"]
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "TPU_WORKER_HOSTNAMES": "localhost",
        "LIBTPU_INIT_ARGS": export.libtpu_init_args,
    }
    start = time.time()
    run = subprocess.run(
        [str(python), "-m", "maxtext.trainers.pre_train.train_compile", base_yml, *words, *extra],
        capture_output=True,
        text=True,
        env=env,
    )
    seconds = time.time() - start
    text = run.stdout + run.stderr
    log.write_text(f"{' '.join(env_words + words)}\ncompile_s={seconds:.1f}\n{text}")
    return (*_memory_of(text), seconds, log)


def _memory_of(text: str):
    """(compiled memory, None) from MaxText's output, or (None, the out-of-memory figures or None)."""
    stats = re.search(r"CompiledMemoryStats\(([^)]*)\)", text)
    if stats:
        fields = dict(re.findall(r"(\w+)=(\d+)", stats.group(1)))
        memory = CompiledMemory(
            argument_bytes=int(fields["argument_size_in_bytes"]),
            output_bytes=int(fields["output_size_in_bytes"]),
            alias_bytes=int(fields["alias_size_in_bytes"]),
            temp_bytes=int(fields["temp_size_in_bytes"]),
            code_bytes=int(fields["generated_code_size_in_bytes"]),
        )
        return memory, None
    return None, parse_hbm_oom(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--venv",
        default=str(DEFAULT_VENV),
        help="the MaxText 0.2.5 venv (created when absent; default $CPPLAN_MAXTEXT_VENV or the user's cache)",
    )
    parser.add_argument("--out", default="benchmarks/results/maxtext", help="logs and results.json")
    parser.add_argument("--only", help="comma-separated substrings of plan names to run")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="read the logs of earlier runs of the same flags instead of compiling again (re-prices them)",
    )
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    python = maxtext_python(Path(args.venv))
    chosen = [p for p in PLANS if not args.only or any(s in p[0] for s in args.only.split(","))]
    rows = []
    for name, topology, seq_len, strategy, mesh, extra in chosen:
        export = exported(topology, seq_len, strategy, mesh, extra)
        predicted = estimate(export.plan, target="maxtext")
        print(f"== {name}\n   {command_line(export)}", flush=True)
        for note in export.notes:
            print(f"   note: {note}")
        memory, oom, seconds, log = compile_with_maxtext(python, export, out_dir, name, reuse=args.reuse)
        capacity = predicted.hbm_capacity_bytes
        if memory is not None:
            compiled, fits = memory.hbm_bytes_per_device, True
        elif oom is not None:
            # the figure the error calls "HLO temporaries" is all the step needs, the arguments
            # included: its dump's buffer assignment (validation/peak_buffers.py) holds 160.64 GiB of
            # temporaries for the v5p-8 ring 4 × 256K row, whose error says 183.08G, 22.44 GiB more,
            # the fp32 weights and AdamW moments exactly (and 77.43 + 22.44 = 99.87G at 144K offloaded)
            compiled, fits = oom[0], False
        else:
            print(f"   MaxText failed without a memory figure; see {log}")
            rows.append({"name": name, "error": str(log)})
            continue
        ratio = predicted.hbm_bytes_per_device / compiled
        row = {
            "name": name,
            "predicted_gib": predicted.hbm_bytes_per_device / GiB,
            "compiled_gib": compiled / GiB,
            "ratio": ratio,
            "predicted_fits": predicted.fits,
            "compiled_fits": fits,
            "within_tolerance": abs(ratio - 1) <= TOLERANCE,
            "same_verdict": predicted.fits == fits,
            "compile_s": seconds,
            "capacity_gib": capacity / GiB,
            "predicted_parts_gib": {k: v / GiB for k, v in predicted.hbm_bytes.items()},
        }
        rows.append(row)
        print(
            f"   cpplan {row['predicted_gib']:.1f} GiB ({'fits' if predicted.fits else 'does not fit'}) vs "
            f"MaxText {row['compiled_gib']:.1f} GiB ({'fits' if fits else 'does not fit'}) of "
            f"{row['capacity_gib']:.1f}: ratio {ratio:.3f}; compiled in {seconds:.0f} s",
            flush=True,
        )
    (out_dir / "results.json").write_text(json.dumps(rows, indent=2))
    good = [r for r in rows if r.get("within_tolerance") and r.get("same_verdict")]
    print(f"\n{'plan':<64} {'cpplan':>8} {'MaxText':>8} {'ratio':>6}  verdicts")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<64} MaxText failed: {r['error']}")
            continue
        verdicts = f"{'fits' if r['predicted_fits'] else 'no'}/{'fits' if r['compiled_fits'] else 'no'}"
        print(f"{r['name']:<64} {r['predicted_gib']:>7.1f}G {r['compiled_gib']:>7.1f}G {r['ratio']:>6.3f}  {verdicts}")
    print(f"{len(good)} of {len(rows)} within {TOLERANCE:.0%} with the same verdict")
    return 0 if len(good) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
