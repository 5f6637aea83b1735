"""Sweep sequence lengths and show where the best context-parallel strategy changes.

Sixteen TPU7x chips (32 devices) with a 4M-token step: at short lengths Ulysses' all-to-alls
are cheap next to attention, at long lengths only the ring hides its traffic and keeps memory
O(S/N). Run: python examples/strategy_crossover.py
"""
import planner
from planner.options import format_tokens

previous = None
print(f"{'seq_len':>8}  {'best':<10}  " + "  ".join(f"{s:>10}" for s in ("all_gather", "ulysses", "ring", "usp")))
for exponent in range(15, 24):
    seq_len = 2**exponent
    explanation = planner.explain("llama3.1-8b", seq_len, "tpu7x:2x2x4")
    if explanation.best is None:
        print(f"{format_tokens(seq_len):>8}  nothing fits")
        continue
    per = {s.value: r.estimate.step_time_s for s, r in explanation.best_per_strategy().items()}
    best = explanation.best.cp_strategy.value
    cells = "  ".join(f"{per[s]:>9.2f}s" if s in per else f"{'—':>10}" for s in ("all_gather", "ulysses", "ring", "usp"))
    marker = "  <- changes" if previous and best != previous else ""
    print(f"{format_tokens(seq_len):>8}  {best:<10}  {cells}{marker}")
    previous = best
