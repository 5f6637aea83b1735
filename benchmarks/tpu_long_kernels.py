"""Splash's kernels at the shapes a ring or an all-gather runs at 1M-4M tokens, timed on the chip this runs on and
priced with its chip row as it stands: none of these shapes is in the timings the row was fitted to (`cpplan
calibrate` times causal self-attention of 4K-128K tokens), so the errors printed are held out. The shapes:
causal self-attention of 256K and 512K tokens, a ring hop of 128K queries against 128K keys (on the diagonal,
causal; off it, every key), and 16K queries against 512K keys (an all-gather's local queries against every key),
at the blocks and the per-device heads of the README's 4M-token plan (8 query heads, 2 K/V heads, of 128).

    python benchmarks/tpu_long_kernels.py OUT [CHIP]          # on a TPU VM (CHIP: its row, default v5e)
    python benchmarks/tpu_long_kernels.py OUT --price-only    # price OUT/long_kernels.jsonl again, anywhere

Writes OUT/long_kernels.jsonl as it goes (one line a shape: its seconds per kernel kind) and then prices every
timing with the row (`validation.kernel_calibration.predict`, the formulas of the fit) into OUT/long_kernels.txt.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's runtime, uninstalled

from validation.kernel_calibration import (  # noqa: E402
    KINDS,
    KernelShape,
    chip_figures,
    kernel_terms,
    kernel_timing_script,
    predict,
    timed_points,
)

BLOCK = 2048  # the README's 4M-token plan's splash blocks
HEADS = dict(heads=8, kv_heads=2, head_dim=128)  # Llama 3.1 8B's heads on one device of tensor 4
SHAPES = (
    KernelShape(131072, 131072, BLOCK, True, **HEADS),  # a ring hop on the diagonal
    KernelShape(131072, 131072, BLOCK, False, **HEADS),  # a ring hop off it
    KernelShape(16384, 524288, BLOCK, False, **HEADS),  # local queries against an all-gather's every key
    KernelShape(262144, 262144, BLOCK, True, 4, 1, 128),  # causal self-attention, heads halved for time
    KernelShape(524288, 524288, BLOCK, True, 2, 1, 128),
)
ACT_BYTES = 2  # bfloat16
REPEATS = 2


def _label(shape: KernelShape) -> str:
    return (
        f"q {shape.q_len:>6} kv {shape.kv_len:>6} {'causal' if shape.causal else 'full':6} "
        f"{shape.heads}/{shape.kv_heads}x{shape.head_dim}"
    )


def price(timings: list[dict], chip) -> list[str]:
    """A line per kernel timed: measured, priced by the row, and the error; then the mean error per kind."""
    figures = chip_figures(chip)
    hbm_s_per_byte = chip.devices_per_chip / chip.hbm_bw_bytes_per_s
    lines, errors = [], {kind: [] for kind in KINDS}
    for shape, kind, seconds in timed_points(timings):
        priced = predict(figures, kernel_terms(shape, act_bytes=ACT_BYTES, hbm_s_per_byte=hbm_s_per_byte), kind)
        errors[kind].append(priced / seconds - 1)
        lines.append(
            f"{_label(shape)} {kind:17} measured {seconds:8.3f} s  priced {priced:8.3f} s  {priced / seconds - 1:+6.1%}"
        )
    for t in timings:
        lines += [f"{_label(KernelShape(**t['shape']))} {kind}: {why}" for kind, why in t["errors"].items()]
    for kind, errs in errors.items():
        if errs:
            mean = sum(abs(e) for e in errs) / len(errs)
            lines.append(f"{kind}: {len(errs)} timings, mean |error| {mean:.1%}, largest {max(errs, key=abs):+.1%}")
    return lines


def report(timings: list[dict], chip, chip_name: str) -> list[str]:
    """The report: a heading, then `price`'s lines."""
    return [
        f"the {chip_name} row's attention figures, priced against {len(timings)} shapes none was fitted to:"
    ] + price(timings, chip)


def main(argv: list[str]) -> int:
    return kernel_timing_script(
        argv, doc=__doc__, stem="long_kernels", shapes=SHAPES, repeats=REPEATS, act_bytes=ACT_BYTES, report=report
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
