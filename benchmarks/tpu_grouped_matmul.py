"""Times grouped matmuls (a mixture of experts' expert matmuls) on the TPU this runs on, against the chip
row's model of them (`Chip.grouped_matmul_seconds`, fitted to tokamax's timings by
regenerate/fit_grouped_matmul.py): `jax.lax.ragged_dot` and, where this jax has it, megablox's `gmm` (the
kernel MaxText's default `megablox=True` runs), bf16, forward, input gradient and weight gradient, over
expert counts, rows per expert and the widths of published models (widths that are not multiples of 128
lanes among them). Each timing is written to the output as soon as it is made (one JSON line per call),
so a run cut short keeps what it measured; a summary of measured over modelled ends the run.

Run on a TPU VM:

    python benchmarks/tpu_grouped_matmul.py --chip v5e --out benchmarks/results/tpu_v5e/grouped_matmul.jsonl
    python benchmarks/tpu_grouped_matmul.py --chip v5e --quick --out out/g.jsonl   # a smoke run (CPU too)
    python benchmarks/tpu_grouped_matmul.py --chip v5e --shape 8,1024,2048,1024 --out out/g.jsonl  # chosen calls
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's cost model, uninstalled

from tpu_splash_timings import timed as each_timed  # noqa: E402  (its neighbour here: the same timing loop)

# (contract, out) of the forward's first matrix: the experts' widths of Qwen3-30B-A3B (2048 → 768),
# Qwen3-235B-A22B (4096 → 1536), GPT-OSS (2880 → 2880) and Gemma 4 26B (2816 → 704); the second matrix
# is the transpose of each
WIDTHS = ((2048, 768), (4096, 1536), (2880, 2880), (2816, 704))
GROUPS = (8, 32, 128)
ROWS_PER_GROUP = (512, 2048)
MAX_ROWS = 1 << 18  # rows of all groups together: the operands stay within the chip's HBM


def shapes(quick: bool, chosen: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """(groups, rows per group, contract, out) of every call timed: `chosen` where given."""
    if chosen:
        return chosen
    if quick:
        return [(4, 128, 256, 128)]
    return [
        (g, r, k, n)
        for g in GROUPS
        for r in ROWS_PER_GROUP
        for k, n in WIDTHS + tuple((n, k) for k, n in WIDTHS)
        if g * r <= MAX_ROWS
    ]


def timed(fn, args, repeats: int) -> float:
    """Median seconds per call of `fn(*args)` after one warm-up (which compiles it), each waited for."""
    return statistics.median(each_timed(fn, args, repeats))


def kernels() -> dict:
    """The grouped matmuls this jax has, by name: each (lhs [rows, K], rhs [groups, K, N], sizes) → [rows, N]."""
    import jax

    found = {"ragged_dot": lambda lhs, rhs, sizes: jax.lax.ragged_dot(lhs, rhs, sizes)}
    try:
        from jax.experimental.pallas.ops.tpu.megablox import gmm

        found["megablox_gmm"] = lambda lhs, rhs, sizes: gmm(lhs, rhs, sizes, preferred_element_type=lhs.dtype)
    except ImportError:
        pass
    return found


def measure(kernel, groups: int, rows_per_group: int, contract: int, out: int, *, repeats: int) -> dict:
    """One call shape's forward, and forward with both gradients (the input's and the weights'), seconds."""
    import jax
    import jax.numpy as jnp

    rows = groups * rows_per_group
    keys = jax.random.split(jax.random.key(0), 3)
    lhs = jax.random.normal(keys[0], (rows, contract), jnp.bfloat16)
    rhs = jax.random.normal(keys[1], (groups, contract, out), jnp.bfloat16) * contract**-0.5
    cotangent = jax.random.normal(keys[2], (rows, out), jnp.bfloat16)
    sizes = jnp.full((groups,), rows_per_group, jnp.int32)
    forward = jax.jit(kernel)

    def with_gradients(lhs, rhs, sizes, cotangent):
        result, vjp = jax.vjp(lambda a, b: kernel(a, b, sizes), lhs, rhs)
        return result, vjp(cotangent)

    both = jax.jit(with_gradients)
    forward_s = timed(forward, (lhs, rhs, sizes), repeats)
    both_s = timed(both, (lhs, rhs, sizes, cotangent), repeats)
    return {"forward_s": forward_s, "backward_s": both_s - forward_s}


def modelled(chip, groups: int, rows_per_group: int, contract: int, out: int) -> dict:
    """The chip row's price of the same call: forward, and the backward's input and weight gradients."""
    rows = groups * rows_per_group
    forward = chip.grouped_matmul_seconds(groups, rows, contract, out)
    backward = chip.grouped_matmul_seconds(groups, rows, out, contract) + chip.grouped_matmul_seconds(
        groups, rows, contract, out, weight_grad=True
    )
    return {"forward_s": forward, "backward_s": backward}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chip", required=True, help="the chip row to compare with (e.g. v5e)")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per call shape and kernel")
    parser.add_argument("--quick", action="store_true", help="one small shape (a smoke run)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="G,R,K,N",
        help="time only these calls (repeatable): groups, rows per group, contract and out widths",
    )
    args = parser.parse_args()
    chosen = []
    for text in args.shape:
        try:
            g, r, k, n = (int(v) for v in text.split(","))
        except ValueError:
            parser.error(f"--shape {text!r} is not four integers G,R,K,N (e.g. 8,1024,2048,1024)")
        if min(g, r, k, n) < 1:
            parser.error(f"--shape {text!r}: every size must be at least 1")
        chosen.append((g, r, k, n))

    from cost_models.chips import get_chip

    chip = get_chip(args.chip)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ratios: dict[str, list[float]] = {}
    with open(args.out, "a") as log:
        found = kernels()
        for g, r, k, n in shapes(args.quick, chosen):  # each shape under every kernel, so a run cut short has both
            for name, kernel in found.items():
                row = {"kernel": name, "groups": g, "rows_per_group": r, "contract": k, "out": n}
                try:
                    row |= {"measured": measure(kernel, g, r, k, n, repeats=args.repeats)}
                except Exception as err:  # a shape the kernel refuses is recorded, not fatal
                    row |= {"error": f"{type(err).__name__}: {str(err)[:300]}"}
                row |= {"model": modelled(chip, g, r, k, n)}
                log.write(json.dumps(row) + "\n")
                log.flush()
                if "measured" in row:
                    total = sum(row["measured"].values())
                    ratio = total / sum(row["model"].values())
                    aligned = "aligned" if k % 128 == 0 and n % 128 == 0 else "unaligned"
                    ratios.setdefault(f"{name} {aligned}", []).append(ratio)
                    print(
                        f"{name:14} {g:4}x{r:<5} K={k:<5} N={n:<5} measured {total * 1e3:9.3f} ms  "
                        f"measured/model {ratio:5.2f}",
                        flush=True,
                    )
    for key, values in ratios.items():
        print(
            f"{key}: {len(values)} calls, measured/model median {statistics.median(values):.2f} "
            f"(range {min(values):.2f}-{max(values):.2f})"
        )


if __name__ == "__main__":
    main()
