"""Explain Llama 3.1 8B at 1M–8M tokens on a v5p slice and a TPU7x (Ironwood) slice.

Run: python examples/explain_long_context.py [--full]
"""

import sys

import planner
from cost_models.units import GiB

full = "--full" in sys.argv
for topology in ("v5p-256", "tpu7x-128"):
    for seq_len in ("1M", "2M", "4M", "8M"):
        explanation = planner.explain("llama3.1-8b", seq_len, topology)
        if full:
            print(explanation, end="\n\n")
            continue
        best, e = explanation.best, explanation.estimate
        if best is None:
            print(f"{topology:>10} {seq_len:>3}: nothing fits")
            continue
        print(
            f"{topology:>10} {seq_len:>3}: {best.cp_strategy.value:<10} mesh {best.mesh_dict}  "
            f"step {e.step_time_s:8.1f} s  MFU {e.mfu:.1%}  HBM {e.hbm_bytes_per_device / GiB:.1f} GiB  "
            f"bottleneck: {e.bottleneck}"
        )
