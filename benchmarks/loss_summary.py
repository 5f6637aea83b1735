"""Summarises the losses of `cpplan run --json` outputs: the first, the highest and its ratio to the first,
the last, and whether the loss falls (the mean of the last five steps below that of the first five).

    python benchmarks/loss_summary.py RUN.json [RUN.json ...]
"""

import json
import sys

WINDOW = 5  # steps averaged at each end


def summary(path: str) -> str:
    try:
        with open(path) as f:
            losses = json.load(f)["losses"]
    except (OSError, ValueError, KeyError) as e:  # a run that failed writes no report
        return f"{path}: no run report ({type(e).__name__}: {e}); see the run's log"
    if not losses:
        return f"{path}: no steps ran"
    first, highest = losses[0], max(losses)
    head, tail = losses[:WINDOW], losses[-WINDOW:]
    mean_head, mean_tail = sum(head) / len(head), sum(tail) / len(tail)
    return (
        f"{path}: {len(losses)} steps; first {first:.4f}, highest {highest:.4f} ({highest / first:.4f} × the first), "
        f"last {losses[-1]:.4f}; mean of the first {len(head)} {mean_head:.4f}, of the last {len(tail)} "
        f"{mean_tail:.4f}: {'falls' if mean_tail < mean_head else 'does not fall'}\n"
        f"  losses: {', '.join(f'{x:.4f}' for x in losses)}"
    )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        print(summary(p))
