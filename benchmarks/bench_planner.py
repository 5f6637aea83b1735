"""Planner speed at pod scale, each figure beside its target.

Run: python benchmarks/bench_planner.py

`plan` at 4M tokens on the two full pods runs the batch search (the count nearest the 4M-token
target that the pod can split); `max_seq_len` on a full pod probes from the shortest length that
splits; `sweep` prices 8 lengths on tpu7x-1024 as `cpplan sweep` does; `explain` plans DeepSeek-V3 at 128K on tpu7x-256
and Qwen3-235B-A22B at 1M on v5p-256 (experts beside the context axes); `advice` explains a request nothing fits
(Mistral 7B, 35 × 512K on 3 slices of tpu7x:4x40x44) and lists what would. Each is timed cold (the
first query on that topology in this process: placements are built) and warm (the same query
again, placements cached).
"""

import time

import planner
from planner.api import run_search
from planner.explanation import Explanation

MODEL = "llama3.1-8b"
SWEEP_LENGTHS = ["32k", "64k", "128k", "256k", "512k", "1M", "2M", "4M"]


def _plan(topology: str) -> str:
    plan = planner.plan(MODEL, "4M", topology)
    return f"{plan.global_batch} × 4M, {plan.cp_strategy.value} {plan.mesh_dict}"


def _max_seq_len(topology: str) -> str:
    longest = planner.max_seq_len(MODEL, topology)
    return f"{longest.seq_len:,} tokens × {longest.sequences}"


def _sweep(topology: str) -> str:
    fits = sum(Explanation(run_search(MODEL, length, topology)).best is not None for length in SWEEP_LENGTHS)
    return f"{fits} of {len(SWEEP_LENGTHS)} lengths fit"


def _explain(model: str, seq_len: str):
    """`explain` of a mixture-of-experts model, as `cpplan explain` runs it (priced for MaxText, which runs it)."""

    def run(topology: str) -> str:
        best = planner.explain(model, seq_len, topology).best
        return f"{model} {best.global_batch} × {seq_len}, {best.cp_strategy.value} {best.mesh_dict}"

    return run


def _advice(topology: str) -> str:
    """`explain` where nothing fits: the advice probes other batches and lengths (max_seq_len's probes)."""
    e = planner.explain("mistral-7b-v0.1", "512k", topology, global_batch=35, num_slices=3)
    assert e.best is None, "the advice case must not fit"
    return f"mistral-7b-v0.1 35 × 512k on 3 slices: nothing fits, {len(e.advice())} suggestions"


CASES = [
    # (what, topology, function, target seconds)
    ("plan 4M", "v5p:16x20x28", _plan, 0.2),
    ("plan 4M", "tpu7x:16x24x24", _plan, 0.2),
    ("max_seq_len", "v5p:16x20x28", _max_seq_len, 10.0),
    ("max_seq_len", "tpu7x:16x24x24", _max_seq_len, 10.0),
    ("sweep 8 lengths", "tpu7x-1024", _sweep, 5.0),
    ("explain 128K", "tpu7x-256", _explain("deepseek3-671b", "128k"), 1.0),
    ("explain 1M", "v5p-256", _explain("qwen3-235b-a22b", "1M"), 1.0),
    ("advice 512K", "tpu7x:4x40x44", _advice, 10.0),
]


def _timed(function, topology: str) -> tuple[float, str]:
    start = time.perf_counter()
    answer = function(topology)
    return time.perf_counter() - start, answer


def main() -> None:
    print(f"{'query':<16} {'topology':<16} {'cold s':>7} {'warm s':>7} {'target':>7}  answer")
    for what, topology, function, target in CASES:
        cold, answer = _timed(function, topology)
        warm, _ = _timed(function, topology)
        verdict = "ok" if max(cold, warm) < target else "SLOW"
        print(f"{what:<16} {topology:<16} {cold:>7.3f} {warm:>7.3f} {target:>6.1f}s  {verdict}: {answer}")


if __name__ == "__main__":
    main()
