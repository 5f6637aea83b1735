"""Which collectives MaxText 0.2.5 sends over DCN, read from its train step compiled over several slices.

A small synthetic model (MaxText's own `base.yml` with a few layers) is compiled deviceless by
MaxText's `train_compile` in its Python 3.12 venv (`benchmarks/bench_maxtext.py` makes it) over
N `v5e-16` slices, FSDP inside each slice and data parallelism across them; the compiled module's
text is read for its host transfers to the megascale runtime (XLA's DCN collectives): how many
per loop body and per step, their dtype and bytes. Optionally with the XLA flags of MaxText's
2023 multi-slice scripts (`MaxText/configs/largest_job/*.sh` at e47fa1b5, the v5e table's runs).

Slow for CI (one compile takes 1-3 minutes on a small host). Run from the repository root:

    python benchmarks/maxtext_dcn.py [--layers 4,8] [--slices 2,4] [--flags-2023] [--venv /work/venvs/maxtext]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_maxtext import maxtext_python  # noqa: E402
from cost_models.vocabulary import DTYPE_BYTES  # noqa: E402
from validation.compiled_program import loop_trip_counts  # noqa: E402

# LIBTPU_INIT_ARGS of AI-Hypercomputer/maxtext@e47fa1b5d377ee1043e663f1414024f4d0f12df0
# MaxText/configs/largest_job/16b.sh (the same in 32b, 64b and 128b.sh)
FLAGS_2023 = ("--xla_tpu_enable_data_parallel_all_reduce_opt=true --xla_tpu_data_parallel_opt_different_sized_ops=true "
              "--xla_tpu_enable_async_collective_fusion=true --xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
              "--xla_tpu_enable_async_collective_fusion_multiple_steps=true --xla_tpu_overlap_compute_collective_tc=true "
              "--xla_enable_async_all_gather=true")
# the small model: MaxText's llama2 block, 512 wide, untied embeddings (base.yml's defaults otherwise)
MODEL_FLAGS = ("global_parameter_scale=1 base_emb_dim=512 base_num_query_heads=4 base_num_kv_heads=4 head_dim=128 "
               "base_mlp_dim=2048 vocab_size=32768 per_device_batch_size=1 max_target_length=512 attention=dot_product "
               "remat_policy=full dataset_type=synthetic ici_fsdp_parallelism=-1 dcn_data_parallelism=-1")
TOPOLOGY = "v5e-16"
# runs MaxText's train_compile and writes the compiled module's text where it would save the executable
DRIVER = """
import sys
from absl import app
from maxtext.trainers.pre_train import train_compile
out = sys.argv.pop(1)
def save_text(compiled, _path):
    with open(out, "w") as f:
        f.write(compiled.as_text())
train_compile.save_compiled = save_text
app.run(train_compile.main)
"""
COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$")
DCN_SEND = re.compile(r"= \(?(\w+)\[([\d,]*)\][^=]*\bsend\(.*_xla_megascale_transfer_type=\"(\w+)\"")
ELEMENT_BYTES = {"bf16": DTYPE_BYTES["bfloat16"], "f32": DTYPE_BYTES["float32"], "s32": 4, "u32": 4}


def dcn_sends(hlo_text: str) -> dict[str, list[tuple[str, str, int]]]:
    """Per computation of a compiled module: its DCN sends as (kind, shape, bytes).

    Raises:
        ValueError: a send of an element type whose size is not known here.
    """
    found: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    computation = ""
    for line in hlo_text.splitlines():
        if not line.startswith(" "):
            m = COMPUTATION.match(line)
            if m:
                computation = ("ENTRY " if m.group(1) else "") + m.group(2)
            continue
        m = DCN_SEND.search(line)
        if m:
            dtype, dims, kind = m.groups()
            if dtype not in ELEMENT_BYTES:
                raise ValueError(f"DCN send of {dtype}: element size unknown; add it to ELEMENT_BYTES")
            elements = 1
            for d in filter(None, dims.split(",")):
                elements *= int(d)
            found[computation].append((kind, f"{dtype}[{dims}]", elements * ELEMENT_BYTES[dtype]))
    return dict(found)


def transfer_span(hlo_text: str, computation: str) -> tuple[int, int, int] | None:
    """Where a computation's DCN transfers start and end: the instruction index of its first
    megascale send and of its last recv-done, and its instruction count (None if it has none)."""
    body = re.search(rf"^%?{re.escape(computation)} \(.*\{{\s*$((?:\n .*)*)", hlo_text, re.M)
    if body is None:
        return None
    instructions = [line for line in body.group(1).splitlines() if " = " in line]
    sends = [i for i, line in enumerate(instructions) if "megascale" in line and re.search(r"\bsend\(", line)]
    dones = [i for i, line in enumerate(instructions) if "megascale" in line and "recv-done(" in line]
    return (sends[0], dones[-1], len(instructions)) if sends and dones else None


def compile_text(python: Path, *, layers: int, slices: int, flags_2023: bool, workdir: Path) -> str:
    """The compiled train step's module text."""
    import_dir = subprocess.run([str(python), "-c", "import maxtext, os; print(os.path.dirname(maxtext.__file__))"],
                                capture_output=True, text=True, check=True).stdout.strip()
    out = workdir / f"L{layers}_N{slices}.txt"
    driver = workdir / "driver.py"
    driver.write_text(DRIVER)
    # deviceless: several compiles may load libtpu at once on one host (as runtime/compile.py allows)
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    if flags_2023:
        env["LIBTPU_INIT_ARGS"] = FLAGS_2023
    cmd = [str(python), str(driver), str(out), f"{import_dir}/configs/base.yml", f"compile_topology={TOPOLOGY}",
           f"compile_topology_num_slices={slices}", f"base_num_decoder_layers={layers}",
           f"compiled_trainstep_file={workdir / 'unused'}", *MODEL_FLAGS.split()]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"compile failed ({' '.join(cmd)}):\n{done.stderr[-3000:]}")
    return out.read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", default="4,8", help="decoder layers of each compile, paired with --slices")
    parser.add_argument("--slices", default="2,4", help="slices of each compile, as many as --layers")
    parser.add_argument("--flags-2023", action="store_true", help="LIBTPU_INIT_ARGS of MaxText's 2023 v5e scripts")
    parser.add_argument("--venv", default="/work/venvs/maxtext")
    args = parser.parse_args()
    pairs = list(zip(args.layers.split(","), args.slices.split(",")))
    if len(args.layers.split(",")) != len(args.slices.split(",")) or not all(
            a.strip().isdigit() and b.strip().isdigit() and int(a) > 0 and int(b) > 0 for a, b in pairs):
        raise SystemExit(f"--layers {args.layers!r} and --slices {args.slices!r} must be lists of positive whole "
                         f"numbers of the same length (each pair is one compile), e.g. --layers 4,8 --slices 2,4")
    python = maxtext_python(Path(args.venv))
    with tempfile.TemporaryDirectory() as tmp:
        for layers, slices in ((int(a), int(b)) for a, b in pairs):
            text = compile_text(python, layers=layers, slices=slices, flags_2023=args.flags_2023, workdir=Path(tmp))
            trips = loop_trip_counts(text)
            sends = dcn_sends(text)
            total_count = total_bytes = 0
            print(f"{layers} layers over {slices} x {TOPOLOGY}{' (2023 flags)' if args.flags_2023 else ''}:")
            for computation, rows in sends.items():
                runs = trips.get(computation, 1)
                total_count += runs * len(rows)
                total_bytes += runs * sum(b for _, _, b in rows)
                print(f"  {computation} (runs {runs}x): {len(rows)} DCN sends, {sum(b for _, _, b in rows)} B each "
                      f"run: " + ", ".join(f"{kind} {shape}" for kind, shape, _ in rows))
                span = transfer_span(text, computation) if computation in trips else None
                if span:
                    print(f"    first send at instruction {span[0]}, last recv-done at {span[1]} of {span[2]}")
            print(f"  per step: {total_count} DCN collectives, {total_bytes} B per device")


if __name__ == "__main__":
    main()
