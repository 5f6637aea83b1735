"""Where a tensor-parallel step's norms run, read from deviceless v5p compiles: the shapes the TPU
compiler gives the norms (their rsqrt, one per token normalised), against the tokens the
elementwise price says they run on (`work_layout.residual_tokens`).

    python benchmarks/bench_elementwise_layout.py   # about a minute a block on this 2-core machine

A 2-layer model of distinct widths (hidden 640, 12 heads and 6 KV heads of 64, MLP 1792) at 2048
tokens, fsdp 2 × tensor 2 on v5p:2x2x1, full remat, in the sequential and the parallel block.
Prints, per block, the normalised token counts found and the residual stream's tokens the price
uses; exit status 1 when a norm runs on other tokens than the price's. (In the same compile of the
parallel block, read by hand on 2026-12-01: the out projection's forward is an output fusion,
convolution then add of the MLP's partial sums, f32[2048,640], before the one reduce-scatter, and
the residual add a plain add on bf16[1,1024,640]: the branch sum the price reads once on every
token, the residual add on the residual's tokens.) Too slow for CI (the cpu_mesh test tests/test_elementwise_runtime.py
checks the same rule on the CPU mesh in seconds).

Results: benchmarks/results/elementwise_layout.txt.
"""
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

SEQ, HIDDEN, TENSOR = 2048, 640, 2
# rsqrt results by shape: [tokens] or [batch, tokens]
RSQRT = re.compile(r"= f32\[([0-9,]+)\][^=\n]*rsqrt\(")


def main() -> int:
    from cost_models.models import ModelSpec
    from cost_models.work_layout import residual_tokens
    from planner.estimate import candidates_of
    from planner.plan import Plan, make_mesh
    from runtime.compile import compile_step

    misses = 0
    for block in ("llama2", "default"):
        model = ModelSpec(f"layout-probe-{block}", 2, HIDDEN, 12, 6, 64, 1792, 1024, decoder_block=block)
        plan = Plan(model=model, topology="v5p:2x2x1", seq_len=SEQ, global_batch=2,
                    mesh=make_mesh(fsdp=2, tensor=TENSOR), remat="full", block_q=512, block_kv=512,
                    loss_chunk_tokens=512)
        x = candidates_of(plan)
        priced = int(residual_tokens(x.tokens_per_device, x.tensor)[0])
        step = compile_step(plan)
        normed = sorted({int(dims.split(",")[-1]) for dims in RSQRT.findall(step.hlo_text)})
        ok = normed == [priced]
        misses += not ok
        print(f"{block:8s} compiled in {step.compile_s:.0f} s: norms over {normed} tokens per device; the price's "
              f"residual stream {priced} of {int(x.tokens_per_device[0])} tokens ({'as priced' if ok else 'MISS'})")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
