"""Which embedding-table slices the TPU compiler copies into another layout: cpplan's step for Llama's block
(2 layers, 8K tokens × 8, full remat) at several hidden sizes over fsdp 8 on v5p:2x2x2, compiled deviceless,
so that each device's slice of the table (split on hidden, `runtime.model.embed_lookup`) is 16 to 960
columns wide. For each: the table's layout at the step's entry, the copies of the table and its two
moments the program makes, and whether the price holds copies (`pricing.memory.relaid_table_values`).

    python benchmarks/bench_table_layouts.py   # about a minute a width; writes results/table_layouts.txt
"""

import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from bench_memory import compile_with_heap, plan_of  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "table_layouts.txt"
LANES = 128
# hidden sizes (heads, K/V heads, head width) whose slice over 8 devices is off the lanes by 0 to 700%
SHAPES = {
    128: (1, 1, 128),
    512: (4, 4, 128),
    960: (15, 5, 64),
    1536: (12, 4, 128),
    2304: (18, 2, 128),
    2560: (20, 4, 128),
    4096: (32, 8, 128),
    7680: (60, 4, 128),
}
DEVICES = 8


def plan_for(hidden: int):
    """bench_memory's plan of its row for Llama's block at `hidden` (`SHAPES`)."""
    heads, kv_heads, head_dim = SHAPES[hidden]
    model = dict(hidden=hidden, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)
    return plan_of(
        (f"hidden {hidden}", "v5p:2x2x2", dict(fsdp=DEVICES), "none", 8192, DEVICES, 2, dict(remat="full", model=model))
    )


def table_layouts(program: str) -> tuple[list[str], list[str]]:
    """(the table's entry layouts, the names of what the program copies out of them) in an optimized module."""
    entry = re.findall(r"%param\.\d+ = (\S+) parameter\(\d+\), metadata=\{op_name=\"([^\"]*embed[^\"]*)\"", program)
    copies = re.findall(r"= \S+ copy\(%param\.\d+\), metadata=\{op_name=\"([^\"]*embed[^\"]*)\"", program)
    return [layout for layout, _ in entry], [name.replace("\\'", "'") for name in copies]


def main() -> None:
    from planner.estimate import estimate

    lines = [f"{'columns':>7} {'padding':>8}  {'entry layout of the table':<34} {'copied by the program':<50} priced"]
    print(lines[0], flush=True)
    for hidden in SHAPES:
        plan = plan_for(hidden)
        with tempfile.TemporaryDirectory() as dump:
            compile_with_heap(plan, Path(dump))
            text = next(p for p in Path(dump).glob("*after_optimizations.txt")).read_text()
        layouts, copies = table_layouts(text)
        width = hidden // DEVICES
        padding = -width % LANES / width
        priced = estimate(plan).hbm_bytes["relaid_update"]
        copied = ", ".join(sorted({name.split("'")[0].rstrip("[") or "params" for name in copies})) or "nothing"
        line = f"{width:>7} {padding:>8.1%}  {sorted(set(layouts))!s:<34} {copied:<50} {'a copy' if priced else 'none'}"
        lines.append(line)
        print(line, flush=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    print("wrote benchmarks/results/table_layouts.txt")


if __name__ == "__main__":
    main()
