"""Bundles per grid step of jax's splash attention kernels, from the TPU compiler's static schedule.

For the forward, dq and dk/dv kernels and the fused backward's one kernel: bundles per computed
and per masked grid step, µs per computed step, the grid steps a core runs and whether cores
other than 0 skip the kernel.

Compiles `jit(value_and_grad(sum(splash(q, k, v))))` deviceless (q, k, v bf16 [8, 8192, 128],
causal, every block size B; with `--batch N`, vmapped over N such sequences, as MaxText calls it),
once with jax's default unfused backward and once fused
(`use_fused_bwd_kernel=True`), each compile in a child process with
`LIBTPU_INIT_ARGS=--xla_jf_dump_to=<temporary folder>` (deleted once read), and reads each Mosaic
kernel's `*-final_bundles.txt` (the bundle listing: loop markers, branches and their target
regions, the loop's exit test) and `*-final_hlo-static-per-bundle-utilization.txt` (the units
each bundle uses). Each kernel is one loop run once per grid step: a prologue, the first-step
init, the compute region (skipped for a masked block; it holds the MXU work), the last-step
finalize. A computed interior step is the loop less init and finalize; a masked step also less
the compute region. µs at the clock the chip row's peak implies (`CLOCK_DERIVATION`). A block
the chip's default scoped VMEM refuses (at 2048: v5p's both backwards, tpu7x's fused) is compiled
again with `VMEM_FLAG`, and the output says so. It prints and writes nothing: the chip rows
(`ROW_FIELDS`) cite docs/measurements.md ("The splash kernel's static schedule") for these
figures; benchmarks/results/kernels/splash_schedule.txt holds a run.

    python regenerate/splash_schedule.py                        # v5p and tpu7x, B = 512, 1024, 2048 (about 15 min)
    python regenerate/splash_schedule.py --chips v5p --blocks 512  # 2 compiles, 15-40 s each (100-180 s at 2048)
    python regenerate/splash_schedule.py --chips v5p --blocks 512 --batch 1 2 3  # which cores the backward runs on
    python regenerate/splash_schedule.py --chips v5p --blocks 512 --runtime-cores 1 2  # cpplan's runtime's call
"""

import argparse
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

CHIP_DIR = Path(__file__).resolve().parents[1] / "cost_models" / "data" / "chips"
TOPOLOGIES = {"v5p": "v5p:2x2x1", "tpu7x": "tpu7x:2x2x1", "v5e": "v5e:1x1"}
HEADS, SEQ = 8, 8192
HEAD_DIM = 128  # the default; `--head-dim` compiles another
# the kernels each backward compiles to: jax's default dq and dk/dv kernels, or the fused one (a dk/dv kernel
# forming dq too, `use_fused_bwd_kernel=True`), which MaxText runs and the chip rows' figures compare with
BACKWARDS = {"unfused": ("dq", "dkv"), "fused": ("dkv",)}
KERNELS = ("fwd", "dq", "dkv", "fused")  # as printed: "fused" is the fused backward's dk/dv kernel
# MXUs per TensorCore and LHS rows each takes per cycle: peak = cores × MXUs × rows × tile² × 2 × clock
MXUS = {"v5p": 4, "tpu7x": 2, "v5e": 4}
ROWS_PER_CYCLE = {"v5p": 1, "tpu7x": 2, "v5e": 1}
CLOCK_DERIVATION = {
    "v5p": "4 MXUs per TensorCore (Cloud TPU v5p docs, https://cloud.google.com/tpu/docs/v5p-training: 'Each "
    "TensorCore has four Matrix Multiply Units (MXU)'), one row per cycle; the schedule issues one 8-row f32 "
    "vmatmul per MXU every 8 bundles",
    "tpu7x": "2 MXUs per TensorCore (the bundles use mxu0 and mxu1 only, MATMUL capacity 2; jax's tpu_info.py TPU_7X "
    "num_mxus=2), 2 rows per cycle: in steady state (dk/dv) the schedule issues one 16-row vmatmul per MXU "
    "every 8 bundles; one row per cycle would give twice this clock",
    "v5e": "4 MXUs per TensorCore (Cloud TPU v5e docs, https://cloud.google.com/tpu/docs/v5e: 'Each TensorCore has "
    "4 matrix-multiply units (MXUs)'), one row per cycle, as v5p",
}
# the chip-row figures these numbers back, printed beside them
ROW_FIELDS = ("attention_backward_over_forward", "attention_unfused_backward_factor")
VMEM_FLAG = "--xla_tpu_scoped_vmem_limit_kib=49152"  # where the chip's default scoped VMEM refuses the block
DELAY_SLOTS = 8  # at most this many empty bundles after a branch are its delay slots
BUNDLE = re.compile(r"^\s*(0x[0-9a-f]+|\d+)\s+(?:[A-Z]{2})?\s*:\s*(>*)\s*\{")
BRANCH = re.compile(r"sbr\.rel \(!?%(\w+)\) target = \$region(\d+)")
REGION_START = re.compile(r"Start(?:/End empty)? region (\d+)\b")
EMPTY = re.compile(r"\{\s*\}")
EXIT_TEST = re.compile(r"scmp\.ge\.s32\S* %\w+, (\d+) /\* loop exit test")


class Bundle(NamedTuple):
    """One VLIW bundle of a kernel's listing."""

    in_loop: bool
    text: str
    matmul: int  # MXUs the compiler counts busy in it


class Branch(NamedTuple):
    """A forward branch: when taken it skips bundles `first` to `last`."""

    at: int
    first: int
    last: int
    test: str  # the compare that sets its predicate


class KernelSchedule(NamedTuple):
    """A kernel's per-step bundle counts."""

    computed_step: int  # bundles per computed interior step
    masked_step: int
    steps_per_core: int  # grid steps one core runs (the loop's exit bound less its 2 pipeline iterations)
    core0_only: bool  # cores other than 0 branch to the exit before the loop


def load_kernel(listing: Path, utilization: Path) -> list[Bundle]:
    """A kernel's bundles in address order, with the MATMUL column of its utilization file."""
    lines = utilization.read_text().splitlines()
    column = [u.strip() for u in lines[lines.index("== CAPACTIY:") + 1].split(",")].index("MATMUL")
    matmul = [int(row.split()[column]) for row in lines[lines.index("== UTILIZATION:") + 1 :] if row.strip()]
    starts, texts = [], []
    for line in listing.read_text().splitlines():
        match = BUNDLE.match(line)
        if match:
            assert int(match.group(1), 0) == len(texts), line[:40]
            starts.append(bool(match.group(2)))
            texts.append(line)
        elif texts:
            texts[-1] += "\n" + line
    assert len(texts) == len(matmul), (listing, len(texts), len(matmul))
    return [Bundle(*b) for b in zip(starts, texts, matmul)]


def forward_branches(bundles: list[Bundle]) -> list[Branch]:
    """Every branch to a later region, with the bundles it skips past its delay slots."""
    region = {}
    for address, bundle in enumerate(bundles):
        for match in REGION_START.finditer(bundle.text):
            region.setdefault(int(match.group(1)), address)
    branches = []
    for at, bundle in enumerate(bundles):
        for match in BRANCH.finditer(bundle.text):
            target = region.get(int(match.group(2)), len(bundles))  # an unlabelled region: the exit bundle
            if target <= at:
                continue
            delay = 0
            while delay < DELAY_SLOTS and at + delay + 1 < len(bundles) and EMPTY.search(bundles[at + delay + 1].text):
                delay += 1
            branches.append(Branch(at, at + delay + 1, target - 1, predicate_test(bundles, at, match.group(1))))
    return branches


def predicate_test(bundles: list[Bundle], at: int, predicate: str) -> str:
    """The instruction that sets `predicate`, searched back from the branch at `at`."""
    for bundle in reversed(bundles[max(0, at - 40) : at + 1]):
        match = re.search(rf"%{predicate} = ([^;}}]*)", bundle.text)
        if match:
            return match.group(1).strip()
    return ""


def schedule(bundles: list[Bundle], last_block: int) -> KernelSchedule:
    """Per-step counts: the compute region is the innermost branch around MXU work, the init the
    branches before it on `index != 0`, the finalize those after it on `index != last_block`."""
    loop = [a for a, b in enumerate(bundles) if b.in_loop]
    first, last = loop[0], loop[-1]
    branches = forward_branches(bundles)
    inside = [b for b in branches if first <= b.at <= last]
    busy = [b for b in inside if sum(x.matmul for x in bundles[b.first : b.last + 1])]
    compute = min(busy, key=lambda b: b.last - b.first)
    idle = [b for b in inside if b not in busy]
    init = [b for b in idle if b.at < compute.at and re.search(r"scmp\.ne\S* %\w+, 0$", b.test)]
    final = [b for b in idle if b.at > compute.at and re.search(rf"scmp\.ne\S* %\w+, {last_block}$", b.test)]
    step = last - first + 1 - sum(b.last - b.first + 1 for b in init + final)
    bounds = [int(m.group(1)) for b in bundles for m in [EXIT_TEST.search(b.text)] if m]
    core = re.search(r"(%\w+) = sld \S+ /\* megacore core id", bundles[0].text)
    core0_only = core is not None and any(
        b.at < first and b.last >= last and b.test.startswith("scmp.ne") and b.test.endswith(f"{core.group(1)}, 0")
        for b in branches
    )
    return KernelSchedule(step, step - (compute.last - compute.first + 1), bounds[-1] - 2, core0_only)


def kernel_files(dump: Path) -> dict[str, tuple[Path, Path]]:
    """Each splash kernel's bundle listing and utilization file in a compiler dump."""
    files = {}
    for utilization in dump.glob("*splash_mha_*-final_hlo-static-per-bundle-utilization.txt"):
        kernel = re.search(r"splash_mha_([a-z]+)_", utilization.name).group(1)
        prefix = utilization.name.split("-splash_mha_")[0]
        [listing] = [
            p
            for p in dump.glob(f"{prefix}-splash_mha_{kernel}_*-final_bundles.txt")
            if re.search(r"-\d+-final_bundles\.txt$", p.name)
        ]
        assert kernel not in files, f"two {kernel} kernels in {dump}"
        files[kernel] = (listing, utilization)
    return files


def _one_device(topology: str):
    """The first abstract TPU device of `topology` (deviceless) and an unsharded placement on it."""
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    device = topologies.get_topology_desc(topology_name=topology, platform="tpu").devices[0]
    return NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())


def compile_runtime(topology: str, block: int, cores: int) -> None:
    """In a child whose TPU compiler dumps its kernels: compiles cpplan's runtime's splash call
    (`runtime.splash.attend`, its own dq and dK/dV kernels) of one sequence of HEADS query and HEADS / 2
    KV heads for a device of `cores` TensorCores (`KernelConfig.cores`: the rows split in that many groups)."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from runtime import splash

    config = splash.KernelConfig(block, block, interpret=False, smem_bytes=1 << 20, cores=cores)
    kernel = splash.causal_kernel(SEQ, SEQ, config)
    sharding = _one_device(topology)
    q = jax.ShapeDtypeStruct((HEADS, SEQ, HEAD_DIM), jnp.bfloat16, sharding=sharding)
    kv = jax.ShapeDtypeStruct((HEADS // 2, SEQ, HEAD_DIM), jnp.bfloat16, sharding=sharding)
    loss = lambda q, k, v: jnp.sum(splash.attend(kernel, q, k, v).astype(jnp.float32))
    jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv).compile()


def runtime_cores(chips: list[str], blocks: list[int], cores_list: list[int]) -> int:
    """Prints, per chip, block and `KernelConfig.cores`, the steps each of cpplan's runtime's kernels runs on
    a core and whether cores other than 0 exit: which cores its backward keeps busy."""
    print(f"cpplan's runtime: one sequence, q bf16 [{HEADS}, {SEQ}, {HEAD_DIM}], k and v [{HEADS // 2}, ...], causal")
    for chip, block, cores in ((c, b, n) for c in chips for b in blocks for n in cores_list):
        with tempfile.TemporaryDirectory(prefix="cpplan-splash-") as dump:
            flags = f"{os.environ.get('LIBTPU_INIT_ARGS', '')} --xla_jf_dump_to={dump}".strip()
            child = subprocess.run(
                [sys.executable, __file__, "--compile-runtime", TOPOLOGIES[chip], str(block), str(cores)],
                env=dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1", LIBTPU_INIT_ARGS=flags),
                capture_output=True,
                text=True,
            )
            if child.returncode:
                raise RuntimeError(f"{chip} B={block} cores={cores} failed to compile:\n{child.stderr[-3000:]}")
            for name, files in sorted(kernel_files(Path(dump)).items()):
                k = schedule(load_kernel(*files), SEQ // block - 1)
                exits = "yes" if k.core0_only else "no"
                print(
                    f"{chip:6s} {block:5d} cores={cores}  {name:4s} steps on a core {k.steps_per_core:5d}, "
                    f"cores != 0 exit: {exits}",
                    flush=True,
                )
    return 0


def compile_splash(topology: str, block: int, backward: str, batch: int, head_dim: int) -> None:
    """In a child whose TPU compiler dumps its kernels: compiles the splash step deviceless, vmapped over
    `batch` sequences (0: one sequence, not vmapped), heads of `head_dim`."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from runtime.splash import KernelConfig

    # the blocks cpplan's runtime gives splash: every kernel B, no dq blocks for the fused backward
    sizes = KernelConfig(block, block, interpret=False, fused_backward=backward == "fused").block_sizes(SEQ, SEQ)
    splash = kernel.make_splash_mha(
        mask.MultiHeadMask([mask.CausalMask((SEQ, SEQ))] * HEADS), head_shards=1, q_seq_shards=1, block_sizes=sizes
    )
    sharding = _one_device(topology)
    qkv = jax.ShapeDtypeStruct((batch,) * bool(batch) + (HEADS, SEQ, head_dim), jnp.bfloat16, sharding=sharding)
    splash = jax.vmap(splash) if batch else splash
    step = jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(splash(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))
    step.lower(qkv, qkv, qkv).compile()


def dumped_schedules(
    chip: str, block: int, backward: str, flags: str, batch: int, head_dim: int
) -> tuple[dict[str, KernelSchedule] | None, str, float]:
    """Compiles in a child with `flags` and its kernels dumped to a temporary folder: the kernels'
    schedules (None when the compile fails), the child's stderr and the seconds it took."""
    with tempfile.TemporaryDirectory(prefix="cpplan-splash-") as dump:
        args = f"{os.environ.get('LIBTPU_INIT_ARGS', '')} --xla_jf_dump_to={dump} {flags}".strip()
        started = time.perf_counter()
        child = subprocess.run(
            [sys.executable, __file__, "--compile", TOPOLOGIES[chip], str(block), backward, str(batch), str(head_dim)],
            env=dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1", LIBTPU_INIT_ARGS=args),
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        if child.returncode:
            return None, child.stderr, seconds
        files = kernel_files(Path(dump))
        kernels = BACKWARDS[backward] + (("fwd",) if backward == "unfused" else ())  # one forward is enough
        return {k: schedule(load_kernel(*files[k]), SEQ // block - 1) for k in kernels}, child.stderr, seconds


def compiled_schedules(
    chip: str, block: int, backward: str, batch: int, head_dim: int = HEAD_DIM
) -> tuple[dict[str, KernelSchedule], str, float]:
    """The kernels' schedules, the flags the compile needed beyond the dump, and its seconds:
    a block the default scoped VMEM limit refuses is compiled again with `VMEM_FLAG`, then with the most
    the chip's compiler grants (`scoped_vmem_max_bytes`)."""
    flags = ""
    kernels, error, seconds = dumped_schedules(chip, block, backward, flags, batch, head_dim)
    raised = [VMEM_FLAG, f"--xla_tpu_scoped_vmem_limit_kib={chip_row(chip)['scoped_vmem_max_bytes'] // 1024}"]
    while kernels is None and "CompileTimeScopedVmemOom" in error and raised:
        flags = raised.pop(0)
        kernels, error, seconds = dumped_schedules(chip, block, backward, flags, batch, head_dim)
    if kernels is None:
        raise RuntimeError(f"{chip} B={block} {backward} failed to compile:\n{error[-3000:]}")
    return kernels, flags, seconds


def chip_row(chip: str) -> dict:
    """The chip's row in cost_models/data/chips (read, never written)."""
    return json.loads((CHIP_DIR / f"{chip}.json").read_text())


def clock_hz(chip: str) -> float:
    """The clock the chip row's bf16 peak implies: peak / (cores × MXUs × rows per cycle × tile² × 2)."""
    row = chip_row(chip)
    return row["peak_bf16_flops_per_s"] / (
        row["tensorcores_per_chip"] * MXUS[chip] * ROWS_PER_CYCLE[chip] * row["mxu_tile"] ** 2 * 2
    )


def cores_per_device(chip: str) -> int:
    """TensorCores one JAX device drives (2 on a v5p megacore, 1 on tpu7x)."""
    row = chip_row(chip)
    return row["tensorcores_per_chip"] // row["devices_per_chip"]


def report(chip: str, block: int, batch: int, kernels: dict[str, KernelSchedule], clock: float) -> str:
    """Per kernel its step counts, then the backward-over-forward ratios per step and per chip: the share
    of the device's cores the backward keeps busy is its grid's steps over the cores' rounds of them."""
    lines = []
    total_steps = max(batch, 1) * HEADS * (SEQ // block) ** 2
    for name in KERNELS:
        k = kernels[name]
        lines.append(
            f"{chip:6s} {block:5d} {max(batch, 1):2d}  {name:6s} {k.computed_step:9d} {k.masked_step:7d} "
            f"{1e6 * k.computed_step / clock:9.3f} {k.steps_per_core:7d}  {'yes' if k.core0_only else 'no'}"
        )
    step = {name: k.computed_step for name, k in kernels.items()}
    unfused, fused = (step["dq"] + step["dkv"]) / step["fwd"], step["fused"] / step["fwd"]
    share = min(total_steps / (cores_per_device(chip) * kernels[k].steps_per_core) for k in ("dq", "dkv", "fused"))
    lines.append(
        f"{chip:6s} {block:5d} {max(batch, 1):2d}  per computed step: (dq + dkv) / fwd {unfused:.2f}, "
        f"fused / fwd {fused:.2f}, "
        f"(dq + dkv) / fused {unfused / fused:.2f}; backward core share {share:g}, so per chip "
        f"{unfused / share:.2f} and {fused / share:.2f}"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--chips",
        nargs="+",
        default=list(TOPOLOGIES),
        choices=list(TOPOLOGIES),
        help="chips to compile for, each on a 2x2x1 topology",
    )
    parser.add_argument(
        "--blocks",
        nargs="+",
        type=int,
        default=[512, 1024, 2048],
        help="block sizes B (every splash block size set to B)",
    )
    parser.add_argument(
        "--batch",
        nargs="+",
        type=int,
        default=[0],
        help="sequences the step is vmapped over, as MaxText calls splash (default 0: one sequence, not vmapped)",
    )
    parser.add_argument(
        "--runtime-cores",
        nargs="+",
        type=int,
        help="instead: cpplan's runtime's call for devices of these many TensorCores (its rows split per core)",
    )
    parser.add_argument(
        "--compile", nargs=5, metavar=("TOPOLOGY", "BLOCK", "BACKWARD", "BATCH", "HEAD_DIM"), help=argparse.SUPPRESS
    )
    parser.add_argument("--head-dim", type=int, default=HEAD_DIM, help="the heads' size (default 128)")
    parser.add_argument("--compile-runtime", nargs=3, metavar=("TOPOLOGY", "BLOCK", "CORES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile:
        compile_splash(args.compile[0], int(args.compile[1]), args.compile[2], *map(int, args.compile[3:]))
        return 0
    if args.compile_runtime:
        compile_runtime(args.compile_runtime[0], int(args.compile_runtime[1]), int(args.compile_runtime[2]))
        return 0
    if args.runtime_cores:
        return runtime_cores(args.chips, args.blocks, args.runtime_cores)
    print(
        f"jax {importlib.metadata.version('jax')}, libtpu {importlib.metadata.version('libtpu')}; "
        f"q, k, v bf16 [{HEADS}, {SEQ}, {args.head_dim}], causal, every block = B"
    )
    for chip in args.chips:
        row = chip_row(chip)
        print(
            f"{chip}: clock {clock_hz(chip) / 1e9:.3f} GHz from its row's peak, {CLOCK_DERIVATION[chip]}. Its row "
            "holds " + ", ".join(f"{field} {row[field]:g}" for field in ROW_FIELDS)
        )
    print("\n                          bundles per step    µs per   steps  exits on")
    print("chip       B  b  kernel   computed  masked  computed  a core  cores != 0")
    for chip in args.chips:
        for block, batch in ((b, n) for b in args.blocks for n in args.batch):
            kernels, notes = {}, []
            for backward in BACKWARDS:
                compiled, flags, seconds = compiled_schedules(chip, block, backward, batch, args.head_dim)
                kernels.update(compiled if backward == "unfused" else {"fused": compiled["dkv"]})
                notes.append(
                    f"{backward} compiled in {seconds:.0f} s"
                    + (f" with {flags} (the default scoped VMEM refuses this block)" if flags else "")
                )
            print(report(chip, block, batch, kernels, clock_hz(chip)))
            print(f"{chip:6s} {block:5d} {max(batch, 1):2d}  " + "; ".join(notes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
