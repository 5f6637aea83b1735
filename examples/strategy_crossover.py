"""Sweep sequence lengths on sixteen TPU7x chips (32 devices, a 4M-token step) and show each
strategy's best step time, marking the lengths where the best strategy changes.

Ulysses' all-to-alls and the all-gather's K/V are not overlapped; the ring hides its hops behind
attention and keeps memory O(S/N), so it wins as sequences grow; where others win at short
lengths depends on the chip's measured kernel figures. Run: python examples/strategy_crossover.py
"""

import planner
from cost_models.vocabulary import CPStrategy
from planner.options import format_tokens

STRATEGIES = [s.value for s in CPStrategy if s is not CPStrategy.NONE]
previous = None
print(f"{'seq_len':>8}  {'best':<10}  " + "  ".join(f"{s:>10}" for s in STRATEGIES))
for exponent in range(15, 25):
    seq_len = 2**exponent
    explanation = planner.explain("llama3.1-8b", seq_len, "tpu7x:2x2x4")
    if explanation.best is None:
        print(f"{format_tokens(seq_len):>8}  nothing fits")
        continue
    per = {s.value: r.estimate.step_time_s for s, r in explanation.best_per_strategy().items()}
    best = explanation.best.cp_strategy.value
    cells = "  ".join(f"{per[s]:>9.2f}s" if s in per else f"{'—':>10}" for s in STRATEGIES)
    marker = "  <- changes" if previous and best != previous else ""
    print(f"{format_tokens(seq_len):>8}  {best:<10}  {cells}{marker}")
    previous = best
