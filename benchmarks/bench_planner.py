"""Search speed: candidates priced per second, and the full search on the largest pods.

Run: python benchmarks/bench_planner.py
Target (issue 2): the full search for v5p:16x20x28 (8960 chips) and tpu7x:16x24x24 (9216
chips) finishes in under 1 second.
"""
import time

from cost_models.models import get_model
from cost_models.topology import get_topology
from planner.options import SearchOptions
from planner.search import search

CASES = [
    # (topology, seq_len, global batch in sequences): batches that the pods' device counts divide
    ("v5p:4x4x8", 4 << 20, 1),
    ("v5p:16x20x28", 1 << 20, 35),
    ("v5p:16x20x28", 4 << 20, 1),
    ("tpu7x:16x24x24", 1 << 20, 9),
    ("tpu7x:16x24x24", 4 << 20, 1),
]


def main() -> None:
    model = get_model("llama3.1-8b")
    print(f"{'topology':<16} {'seq_len':>8} {'batch':>5} {'seconds':>8} {'priced':>7} {'per s':>9} "
          f"{'rejected':>8} {'feasible':>8}  best")
    for name, seq_len, batch in CASES:
        topo = get_topology(name)
        options = SearchOptions.build(global_batch_tokens=seq_len * batch)
        search(model, seq_len, topo, options)  # warm the placement caches' code paths once
        start = time.perf_counter()
        result = search(model, seq_len, topo, options)
        seconds = time.perf_counter() - start
        best = result.best
        summary = (f"{best.plan.cp_strategy.value} {dict((a, s) for a, s in best.plan.mesh if s > 1)} "
                   f"MFU {best.estimate.mfu:.1%}") if best else "nothing fits"
        print(f"{name:<16} {seq_len:>8} {batch:>5} {seconds:>8.3f} {result.candidates_priced:>7} "
              f"{result.candidates_priced / seconds:>9.0f} {len(result.rejections):>8} {len(result.ranked):>8}  {summary}")


if __name__ == "__main__":
    main()
