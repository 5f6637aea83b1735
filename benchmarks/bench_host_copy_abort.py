"""The TPU compiler's host-copy abort, reproduced with the smallest program found and with cpplan's step.

    python benchmarks/bench_host_copy_abort.py                     # the small program, 3-8 GiB, v5p (3-6 minutes)
    python benchmarks/bench_host_copy_abort.py --topology tpu7x:2x2x1 --gib 4,3.9995 --layers 4
    python benchmarks/bench_host_copy_abort.py --gib 4 --variant halves   # x named as two halves: compiles
    python benchmarks/bench_host_copy_abort.py --plan              # cpplan's 4-layer Llama 3.1 8B step (1 minute)
    python benchmarks/bench_host_copy_abort.py --plan input-only,context-only,separate-backward,blocks-512,8-layers

The small program is a scan over `--layers` layers of `sin(x) * w` whose input x (`--gib` GiB of bf16 on one
device, 32768 columns) a remat policy offloads to pinned host memory, differentiated and compiled deviceless
with libtpu. `--plan` compiles the plan `planner.explain` chose for a 4-layer Llama 3.1 8B at 128K tokens on
v5p:2x2x2 before the search refused such plans (ring 4 × fsdp 2, 32 sequences, `custom` remat offloading each
layer's input and the attention output, the fused backward, blocks of 2048): 4 GiB per device per layer.
Each compile runs in a child process (`runtime.compile.compile_in_child` for the plan), as the compiler ends
its process; a line per compile says what came of it (docs/compiler_aborts.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = 32768


def small_program(rows: int, layers: int, topology: str, variant: str) -> None:
    """Compiles the small program in this process (the child): it ends by SIGABRT where the compiler aborts.
    `variant`: `offload` (x offloaded whole), `halves` (x named as two halves, each offloaded), `hbm` (kept
    in HBM)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    device = topologies.get_topology_desc(topology_name=topology, platform="tpu").devices[:1]
    replicated = NamedSharding(Mesh(device, ("d",)), P())
    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["x"], offload_src="device", offload_dst="pinned_host"
    )
    if variant == "hbm":
        policy = jax.checkpoint_policies.save_only_these_names("x")

    def layer(x, w):
        if variant == "halves":
            x = jnp.concatenate([checkpoint_name(half, "x") for half in jnp.split(x, 2, axis=-1)], axis=-1)
        else:
            x = checkpoint_name(x, "x")
        return jnp.sin(x) * w

    def loss(x, ws):
        y, _ = jax.lax.scan(lambda h, w: (jax.checkpoint(layer, policy=policy)(h, w), None), x, ws)
        return jnp.sum(y.astype(jnp.float32))

    x = jax.ShapeDtypeStruct((rows, COLUMNS), jnp.bfloat16, sharding=replicated)
    ws = jax.ShapeDtypeStruct((layers, COLUMNS), jnp.bfloat16, sharding=replicated)
    memory = jax.jit(jax.grad(loss)).lower(x, ws).compile().memory_analysis()
    print(f"temporaries {memory.temp_size_in_bytes / 2**30:.2f} GiB")


def check_line(output: str) -> str:
    from runtime.compile import compiler_abort_line

    return compiler_abort_line(output) or "no failed check in the output"


def run_small(gib: float, layers: int, topology: str, variant: str) -> str:
    rows = round(gib * 2**30 / (2 * COLUMNS))
    args = [sys.executable, __file__, "--child", str(rows), str(layers), topology, variant]
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    took = time.perf_counter() - start
    copy = f"{rows * COLUMNS * 2 / 2**30:.4f} GiB ({rows * COLUMNS * 2} bytes), {layers} layers, {topology}, {variant}"
    if done.returncode < 0:
        return f"{copy}: aborted ({signal.Signals(-done.returncode).name}): {check_line(done.stderr)} ({took:.0f} s)"
    if done.returncode:
        return f"{copy}: failed, status {done.returncode}: {done.stderr.strip().splitlines()[-1]}"
    return f"{copy}: compiled, {done.stdout.strip().splitlines()[-1]} ({took:.0f} s)"


# runtime/compile_child.py with the search's rule lifted (Plan.check refuses the plan now, before compiling)
_UNCHECKED_CHILD = (
    "import runpy, sys; import cost_models.pricing.offload as offload; offload.HOST_COPY_LIMIT_BYTES = float('inf'); "
    "sys.argv = ['compile_child', *sys.argv[1:]]; runpy.run_module('runtime.compile_child', run_name='__main__')"
)


# the plan's variants (`--plan NAME,...`): each changes one thing of the plan the search chose
PLAN_VARIANTS = {
    "chosen": {},
    "input-only": {"remat_custom": {"decoder_layer_input": "offload"}},
    "context-only": {"remat_custom": {"context": "offload"}},
    "separate-backward": {"fused_attention_backward": False},
    "blocks-512": {"block_q": 512, "block_kv": 512},
    "8-layers": {"layers": 8},
    "2-sequences": {"global_batch": 2},  # 256 MiB a layer: compiles (17 minutes on the loaded 2-core host)
    "ring-8": {"global_batch": 1, "mesh": {"context": 8}},  # 128 MiB a layer: compiles (7 minutes)
}


def run_plan(variant: str) -> str:
    import runtime.compile
    from cost_models.models import get_model
    from planner.plan import Plan, make_mesh

    changes = dict(PLAN_VARIANTS[variant])
    model = dataclasses.replace(get_model("llama3.1-8b"), num_layers=changes.pop("layers", 4))
    plan = Plan(
        model=model,
        topology="v5p:2x2x2",
        seq_len=131072,
        global_batch=32,
        mesh=make_mesh(**changes.pop("mesh", {"fsdp": 2, "context": 4})),
        cp_strategy="ring",
        load_balance="zigzag",
        remat="custom",
        remat_custom={"decoder_layer_input": "offload", "context": "offload"},
        block_q=2048,
        block_kv=2048,
        loss_chunk_tokens=8192,
        fused_attention_backward=True,
    )
    plan = dataclasses.replace(plan, **changes)
    runtime.compile.CHILD_COMMAND = (sys.executable, "-c", _UNCHECKED_CHILD)
    start = time.perf_counter()
    report = runtime.compile.compile_in_child(plan)
    return (
        f"{variant}: {plan.remat_label}, {plan.global_batch} sequences, {report} ({time.perf_counter() - start:.0f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="v5p:2x2x1")
    parser.add_argument("--gib", default="3,3.9995,4,5,8", help="sizes of the offloaded value, GiB per device")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument(
        "--variant",
        choices=("offload", "halves", "hbm"),
        default="offload",
        help="x offloaded whole, named as two halves each offloaded, or kept in HBM",
    )
    parser.add_argument(
        "--plan",
        nargs="?",
        const="chosen",
        help=f"compile cpplan's 4-layer Llama 3.1 8B step instead, as these variants: {','.join(PLAN_VARIANTS)}",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        small_program(int(args.child[0]), int(args.child[1]), args.child[2], args.child[3])
        return
    sys.path.insert(0, str(ROOT))
    if args.plan:
        for variant in args.plan.split(","):
            print(run_plan(variant), flush=True)
        return
    for gib in (float(g) for g in args.gib.split(",")):
        print(run_small(gib, args.layers, args.topology, args.variant), flush=True)


if __name__ == "__main__":
    main()
