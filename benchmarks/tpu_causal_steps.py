"""What a causal splash call's skipped grid steps cost, timed on the chip this runs on: the same shape over every
key and causal, at each block size and head width `cpplan calibrate` fits (32K tokens, its heads there).

A full call visits every (q block, kv block) step and computes it; a causal one computes the steps on and below
the diagonal and skips the rest. With each call's passes over its operands (and the fused backward's dq partials)
priced with the row's figures and taken off, the full call's time per step standing for a computed step, and the
diagonal's masking priced with the row's figure, what is left of the causal call's time is its skipped steps':

    skipped-step cost = (causal − per-call − computed × (full − per-call) / steps − masking) / skipped

(square calls with equal query and key blocks, as every shape here is)

printed in µs beside the K/V bytes a step's blocks hold at the chip's HBM rate and the row's per-step overhead
(which the price gives a skipped step as a visited one).

    python benchmarks/tpu_causal_steps.py OUT [CHIP]          # on a TPU VM (CHIP: its row, default v5e)
    python benchmarks/tpu_causal_steps.py OUT --price-only    # read OUT/causal_steps.jsonl again, anywhere

Writes OUT/causal_steps.jsonl as it goes (one line a call timed) and OUT/causal_steps.txt.
"""

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's runtime, uninstalled

from cost_models.compute import causal_block_fraction, splash_grid_steps  # noqa: E402
from validation.kernel_calibration import (  # noqa: E402
    KINDS,
    KernelShape,
    chip_figures,
    kernel_shapes,
    kernel_terms,
    kernel_timing_script,
    predict,
)

TOKENS = 32768
ACT_BYTES = 2  # bfloat16
REPEATS = 3
MODEL_HEADS = (16, 8, 128)  # the model the v5e row was calibrated with (benchmarks/tpu_v5e/llama-4l-h128.json)


def shapes() -> list[KernelShape]:
    """Each calibrated block size and head width at `TOKENS` (calibrate's shapes there), causal and over every key."""
    calibrated = [s for s in kernel_shapes(*MODEL_HEADS) if s.q_len == TOKENS]
    return [dataclasses.replace(s, causal=causal) for s in calibrated for causal in (True, False)]


def skipped_step_lines(timings: list[dict], chip) -> list[str]:
    """A line per causal call with its full twin: its skipped steps' cost per step, beside the K/V fetch and the
    row's per-step overhead."""
    full = {(s["q_len"], s["block"], s["heads"], s["head_dim"]): t for t in timings if not (s := t["shape"])["causal"]}
    hbm_bytes_per_s = chip.hbm_bw_bytes_per_s / chip.devices_per_chip
    # the row's figures less the math, the steps and the masking: what `predict` gives any call whatever its mask
    # (its passes over its operands and its fixed part)
    per_call_figures = (0.0, 0.0, 0.0, *chip_figures(chip)[3:])
    lines = [
        f"{'shape':28} {'kind':17} {'full s':>8} {'causal s':>9} {'skipped':>8} {'µs a skipped step':>18} "
        f"{'K/V fetch µs':>12} {'row µs':>7}"
    ]
    for t in timings:
        s = t["shape"]
        twin = full.get((s["q_len"], s["block"], s["heads"], s["head_dim"]))
        if not s["causal"] or twin is None:
            continue
        shape = KernelShape(**s)
        steps = float(
            splash_grid_steps(shape.heads, shape.q_len, shape.kv_len, block_q=shape.block, block_kv=shape.block)
        )
        computed = steps * float(causal_block_fraction(shape.q_len, shape.block))
        # each kind's grid steps and masked logits, as the price counts them (the separate backward runs two grids)
        terms = kernel_terms(shape, act_bytes=ACT_BYTES, hbm_s_per_byte=1 / hbm_bytes_per_s)
        full_terms = kernel_terms(
            dataclasses.replace(shape, causal=False), act_bytes=ACT_BYTES, hbm_s_per_byte=1 / hbm_bytes_per_s
        )

        fetch_us = 2 * shape.block * shape.head_dim * ACT_BYTES / hbm_bytes_per_s * 1e6
        for kind in KINDS:
            causal_s, full_s = t[f"{kind}_s"], twin[f"{kind}_s"]
            if causal_s is None or full_s is None:
                continue
            grids = terms.units[kind][0] / steps
            masking = terms.units[kind][1] * chip.attention_masked_element_s
            computed_s = computed / steps * (full_s - predict(per_call_figures, full_terms, kind))
            per_call = predict(per_call_figures, terms, kind)
            per_skipped = (causal_s - per_call - computed_s - masking) / ((steps - computed) * grids)
            lines.append(
                f"q {shape.q_len} block {shape.block:4} {shape.heads}/{shape.kv_heads}x{shape.head_dim:<4} {kind:17} "
                f"{full_s:8.4f} {causal_s:9.4f} {(steps - computed) * grids:8.0f} {per_skipped * 1e6:18.2f} "
                f"{fetch_us:12.2f} {chip.attention_block_overhead_s * 1e6:7.2f}"
            )
    return lines


def report(timings: list[dict], chip, chip_name: str) -> list[str]:
    """The report: a heading, then `skipped_step_lines`."""
    return [
        f"what a causal call's skipped grid steps cost on {chip_name}, from {len(timings)} calls timed:"
    ] + skipped_step_lines(timings, chip)


def main(argv: list[str]) -> int:
    return kernel_timing_script(
        argv, doc=__doc__, stem="causal_steps", shapes=shapes(), repeats=REPEATS, act_bytes=ACT_BYTES, report=report
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
