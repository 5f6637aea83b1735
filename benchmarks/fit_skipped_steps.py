"""Would a figure for a causal forward's skipped grid steps make the v5e row price splash better? A trial on
the timings already kept, nothing measured anew and nothing written to the row.

The v5e row's attention figures are `cpplan calibrate`'s least-squares fit (`validation.kernel_calibration`) to
its causal timings (`tpu_v5e/calibrate/timings/v5e.json`). `tpu_causal_steps.py` found a skipped forward step
costing more than the row's per-step overhead, growing with the block. Here the same fit is run on the
calibration's timings plus the 32K calls over every key (`tpu_v5e/causal_steps/causal_steps.jsonl`: they tell
a skipped step from a computed one), once as the price stands and once with one more figure, the forward's
seconds per skipped step (`step`), per key row of one (`row`) or per logit of one (`logit`). Each fit is
scored on its own timings and on the held-out long calls (`tpu_v5e/long_kernels/long_kernels.jsonl`:
128K-512K keys, causal and over every key).

    python benchmarks/fit_skipped_steps.py    # writes benchmarks/results/tpu_v5e/causal_steps/skipped_fit.txt
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, uninstalled

from cost_models.compute import causal_block_fraction, splash_grid_steps  # noqa: E402
from validation.kernel_calibration import fit_kernels, kernel_terms, predict, read_timings, timed_points  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "tpu_v5e"
ACT_BYTES = 2  # bfloat16, as every timing here
# what one unit of the extra figure is per skipped step, and about what a unit costs (the solver's scale)
FORMS = {
    "step": (lambda block: 1.0, 1e-7),
    "row": (lambda block: block, 1e-10),
    "logit": (lambda block: block**2, 1e-13),
}


def skipped_steps(shape) -> float:
    """Grid steps a causal forward skips (none over every key)."""
    steps = float(splash_grid_steps(shape.heads, shape.q_len, shape.kv_len, block_q=shape.block, block_kv=shape.block))
    return steps * (1 - float(causal_block_fraction(shape.q_len, shape.block))) if shape.causal else 0.0


def fit_with_skipped(points, terms, form: str):
    """The calibration's figures and one more, the forward's cost per unit of `form` of its skipped steps, fitted
    together by `fit_kernels`; and the price of a call's kernel under such figures."""
    unit, scale = FORMS[form]

    def units(shape, kind) -> float:
        return skipped_steps(shape) * unit(shape.block) if kind == "forward" else 0.0

    def price(figures, shape, kind):
        return predict(figures[:7], terms[shape], kind) + figures[7] * units(shape, kind)

    return fit_kernels(points, terms, extra=(units, scale)).figures, price


def scores(price, figures, points) -> str:
    """Mean and largest |priced ÷ measured − 1|, and the forward's mean signed error, causal and over every key."""
    errors = np.array([price(figures, s, k) / t - 1 for s, k, t in points])

    def forward(causal: bool) -> float:
        return np.mean([e for e, (s, k, _) in zip(errors, points) if k == "forward" and s.causal == causal])

    return (
        f"mean {np.abs(errors).mean():5.1%} largest {np.abs(errors).max():5.1%} "
        f"forward {forward(True):+6.1%} / {forward(False):+6.1%}"
    )


def read_calibration(path: Path) -> dict:
    """The calibration's splash timings as points, and its measured HBM rate per device."""
    raw = json.loads(path.read_text())
    return {"points": timed_points(raw["splash"]), "memory": raw["memory_bytes_per_s_per_device"]}


def main() -> int:
    calibration = read_calibration(RESULTS / "calibrate" / "timings" / "v5e.json")
    full = [p for p in timed_points(read_timings(RESULTS / "causal_steps" / "causal_steps.jsonl")) if not p[0].causal]
    held_out = timed_points(read_timings(RESULTS / "long_kernels" / "long_kernels.jsonl"))
    points = calibration["points"] + full
    terms = {
        s: kernel_terms(s, act_bytes=ACT_BYTES, hbm_s_per_byte=1 / calibration["memory"]) for s, *_ in points + held_out
    }
    lines = [
        f"v5e splash fitted to {len(calibration['points'])} causal calibration timings + {len(full)} 32K timings over "
        f"every key; scored there and on {len(held_out)} held-out timings at 128K-512K keys (forward: mean signed "
        "error, causal / over every key)",
        f"{'figure added':26} {'skipped cost':>16}  {'fitted timings':52}  held out",
    ]
    base = fit_kernels(points, terms).figures

    def without(figures, shape, kind):
        return predict(figures, terms[shape], kind)

    lines.append(
        f"{'none (seven, refitted)':26} {'':>16}  {scores(without, base, points):52}  {scores(without, base, held_out)}"
    )
    for form in FORMS:
        figures, price = fit_with_skipped(points, terms, form)
        at_2048 = figures[7] * FORMS[form][0](2048) * 1e6
        lines.append(
            f"{'skipped forward ' + form:26} {at_2048:8.2f} µs@2048  {scores(price, figures, points):52}  "
            f"{scores(price, figures, held_out)}"
        )
    text = "\n".join(lines) + "\n"
    (RESULTS / "causal_steps" / "skipped_fit.txt").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
