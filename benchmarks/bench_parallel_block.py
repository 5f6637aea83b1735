"""Compile MaxText's parallel decoder block (`decoder_block=default`) deviceless on v5p beside the
sequential Llama block, and print cpplan's predicted HBM per device next to the XLA TPU
compiler's for each, and the difference between the two blocks, under a policy that keeps every
matmul output (minimal: the sequential block keeps its out projection for the second norm, the
parallel block has no such value) and one that keeps only the layer input (full).

    python benchmarks/bench_parallel_block.py   # about 2 minutes a row on this 2-core machine shared six ways

Llama 3.1 8B's shapes with 2 layers, fsdp 4 × tensor 2 at 8K tokens (the first row of
bench_memory.py). Target: the prediction within 10% of the compiler with the same fit verdict.
Too slow for CI's tpu_compile tier.
"""
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

TARGET_ERROR = 0.10
POLICIES = ("minimal", "full")
BLOCKS = ("llama2", "default")


def main() -> int:
    from cost_models.models import get_model
    from cost_models.units import GiB
    from planner.estimate import estimate
    from planner.plan import Plan, make_mesh
    from runtime.compile import compile_for

    missed = 0
    for remat in POLICIES:
        sizes = {}
        for block in BLOCKS:
            model = dataclasses.replace(get_model("llama3.1-8b"), name=f"llama3.1-8b-2l-{block}", num_layers=2,
                                        decoder_block=block)
            plan = Plan(model=model, topology="v5p:2x2x2", seq_len=8192, global_batch=8,
                        mesh=make_mesh(fsdp=4, tensor=2), block_q=512, block_kv=512, loss_chunk_tokens=8192,
                        remat=remat)
            start = time.time()
            predicted, compiled = estimate(plan), compile_for(plan)
            sizes[block] = (predicted.hbm_bytes_per_device, compiled.required_bytes)
            ratio = predicted.hbm_bytes_per_device / compiled.required_bytes
            ok = abs(ratio - 1) <= TARGET_ERROR and predicted.fits == compiled.fits
            missed += not ok
            print(f"{block:8} {remat:8} predicted {predicted.hbm_bytes_per_device / GiB:6.2f} GiB  compiled "
                  f"{compiled.required_bytes / GiB:6.2f} GiB  ratio {ratio:.3f}  fits {predicted.fits}/{compiled.fits}"
                  f"  {'ok' if ok else 'MISSED'}  ({time.time() - start:.0f} s)", flush=True)
        (p_seq, c_seq), (p_par, c_par) = sizes["llama2"], sizes["default"]
        print(f"{remat:8} sequential − parallel: predicted {(p_seq - p_par) / GiB:+.2f} GiB, compiled "
              f"{(c_seq - c_par) / GiB:+.2f} GiB", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
