"""Fits a chip row's attention figures to splash timings measured on the chip itself
(`benchmarks/tpu_splash_timings.py`'s output), prints model against measured per call, and with
`--write` writes the figures and their sources into the row.

The forward figures (efficiency, per-step and masked-logit costs, operand passes) are fitted to the
forward timings, the fused backward's ratio to the forward and its operand passes to the fused
forward-with-backward timings less the forward (`validation.kernel_fits`, as for tokamax's timings);
the separate dq and dk/dv kernels' factor over the fused backward is the median of the measured
ratio, with its spread:

    python regenerate/fit_measured_kernels.py benchmarks/results/kernels/v5e_splash.jsonl --chip v5e [--write]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cost_models.chips import CHIP_DIR, load_chip  # noqa: E402
from validation.kernel_fits import (  # noqa: E402
    AttentionFit,
    AttentionTiming,
    fit_backward,
    fit_forward,
    model_attention,
    write_rows,
)


def timings(rows: list[dict], field: str) -> list[AttentionTiming]:
    """The calls with a `field` time, as kernel_fits' timings (one sequence, no KV grouping)."""
    return [
        AttentionTiming(
            1, r["seq"], r["heads"], r["heads"], r["head_dim"], r["causal"], r["block"], r["block"], r[field]
        )
        for r in rows
        if field in r
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timings", type=Path, help="JSON lines of tpu_splash_timings.py")
    parser.add_argument("--chip", required=True, help="the chip row the timings were measured on")
    parser.add_argument("--write", action="store_true", help=f"write the figures into {CHIP_DIR}/<chip>.json")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.timings.read_text().splitlines() if line.strip()]
    chip = load_chip(CHIP_DIR / f"{args.chip}.json")
    forward = timings(rows, "forward_median_s")
    backward = timings(rows, "fused_backward_s")
    # measured on the chip itself, against its own peak: the MXUs cannot beat it
    fit, forward_rms = fit_forward(chip, forward, max_efficiency=1.0)
    ratio, passes, backward_rms = fit_backward(chip, fit, backward)
    # where the fused kernel ran (its dq partials outgrow a chip's HBM at long lengths, recorded as an error)
    both = [r for r in rows if "separate_backward_s" in r and "fused_backward_s" in r]
    unfused = [r["separate_backward_s"] / r["fused_backward_s"] for r in both]
    factor = statistics.median(unfused)
    device = rows[0]["device"]
    cite = (
        f"{args.timings} ({device}, jax {rows[0]['jax']}; jax's splash, causal bf16, one sequence of 2048-wide "
        f"heads: {len(forward)} shapes, {min(r['seq'] for r in rows)}-{max(r['seq'] for r in rows)} tokens, heads "
        f"of {sorted({r['head_dim'] for r in rows})}, blocks {sorted({r['block'] for r in rows})}; median of "
        f"{'-'.join(sorted({str(len(r['forward_s'])) for r in rows if 'forward_s' in r}))} timed calls each; "
        f"benchmarks/tpu_splash_timings.py)"
    )
    bound = (
        " (the efficiency at its bound, 1: the calls' shortfall from the peak is what they pay per step, "
        "per cut logit and per call)"
        if fit.efficiency >= 1
        else ""
    )
    forward_how = (
        f"fitted to {cite} forward times by least squares on relative error (scipy least_squares), with the "
        f"other forward figures of this row{bound}; RMS error {forward_rms:.1%}"
    )
    backward_how = (
        f"fitted to {cite} fused forward-with-backward times less the forward, the forward figures held; "
        f"RMS error {backward_rms:.1%}"
    )
    figures = {
        "attention_efficiency": (fit.efficiency, forward_how),
        "attention_block_overhead_s": (fit.step_s, forward_how + ". Seconds per (q block × kv block × head) grid step"),
        "attention_masked_element_s": (
            fit.masked_element_s,
            forward_how + ". Seconds per logit of the blocks the causal diagonal cuts",
        ),
        "attention_operand_passes": (
            fit.operand_passes,
            forward_how + ". Passes over the call's q, k, v, o at HBM bandwidth, once per call",
        ),
        "attention_backward_over_forward": (ratio, backward_how + ". The fused backward's MXU time over the forward's"),
        "attention_backward_operand_passes": (passes, backward_how),
        "attention_unfused_backward_factor": (
            factor,
            f"the median over {len(unfused)} shapes of {cite} of the separate dq and dk/dv kernels' backward time over "
            f"the fused kernel's (forward-with-backward less forward, each): {min(unfused):.2f}-{max(unfused):.2f}",
        ),
    }
    for name, (value, how) in figures.items():
        print(f"{name:36s} {value:.4g}  (row had {getattr(chip, name):.4g})")
    spread = f"{min(unfused):.2f}-{max(unfused):.2f}"
    print(f"forward RMS {forward_rms:.1%}, fused backward RMS {backward_rms:.1%}, separate/fused {spread}")
    backward_fit = AttentionFit(fit.efficiency, fit.step_s, fit.masked_element_s, fit.operand_passes, passes)
    for t in forward:
        match = next((b for b in backward if (b.seq, b.head_dim, b.block_q) == (t.seq, t.head_dim, t.block_q)), None)
        fwd, bwd = model_attention(chip, t, backward_fit, ratio)
        if match is None:
            shape = f"{t.seq:7d} d{t.head_dim} b{t.block_q}"
            print(f"{shape}: forward {1e3 * t.seconds:8.3f} ms model {fwd / t.seconds - 1:+6.1%}")
            continue
        print(
            f"{t.seq:7d} d{t.head_dim} b{t.block_q}: forward {1e3 * t.seconds:8.3f} ms "
            f"model {fwd / t.seconds - 1:+6.1%}; "
            f"fused backward {1e3 * match.seconds:8.3f} ms model {bwd / match.seconds - 1:+6.1%}"
        )
    if args.write:
        derived = {
            args.chip: {
                "figures": {
                    k: round(v, 4 - int(f"{v:e}".split("e")[1]) - 1) if v else v for k, (v, _) in figures.items()
                },
                "sources": {k: how for k, (_, how) in figures.items()},
            }
        }
        write_rows(derived)
        print(f"wrote {(CHIP_DIR / (args.chip + '.json')).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
