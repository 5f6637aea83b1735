"""shared/ANCHORS.md's MaxText 0.2.5 compiles priced by `cpplan import` under the MaxText target.

Each row of ANCHORS.md's MaxText table (llama3.1-8b, one sequence per step, full remat, all
chips on the context axis, compiled deviceless with MaxText's own `train_compile`) is read from
its flags with `planner.maxtext.read_maxtext`, as `cpplan import` reads them, and priced with
`estimate(plan, target="maxtext")`. Printed: priced against compiled HBM per device, their ratio
and both fit verdicts. Where MaxText ran out of memory, ANCHORS.md gives "N G of temporaries";
MaxText's error counts the arguments in that figure (bench_maxtext_offload.md, finding 1), so it
is taken as the whole step's need, in GiB (the error's "G": it gives v5p's HBM as "95.73G").

The rows and their figures are copied here from shared/ANCHORS.md (not in this repository). Its
USP rows name "usp 4×2" and "usp 8×2" without saying which factor is which; they are read as the
ring over the first (`ici_context_parallelism`) and Ulysses over 2
(`ici_context_usp_ulysses_parallelism`), and named so. The v5p-16 one was recompiled that way with
MaxText 0.2.5 (bench_maxtext_offload.md: the same HBM); read the other way round, the three rows
are priced at 1.3 to 3.2 times what MaxText compiled.

Run from the repository root (a second, jax-free):

    python benchmarks/reprice_anchors.py
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_models.topology import get_topology  # noqa: E402
from cost_models.units import GiB  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.maxtext import read_maxtext  # noqa: E402

SOURCE = "shared/ANCHORS.md, 'MaxText 0.2.5, compiled deviceless for TPU on this kind of machine'"
# the flags of ANCHORS.md's command line that every row shares
COMMON_FLAGS = ("compile_topology_num_slices=1 model_name=llama3.1-8b dataset_type=synthetic attention=flash "
                "remat_policy=full ici_fsdp_parallelism=1")
TOLERANCE = 0.10


@dataclass(frozen=True)
class Anchor:
    """One compile of ANCHORS.md's table.

    Attributes:
        topology: MaxText's `compile_topology`.
        strategy: `context_parallel_strategy`.
        ring: `ici_context_parallelism` (all-gather and Ulysses: their degree).
        ulysses: `ici_context_usp_ulysses_parallelism` (USP only; 1 otherwise).
        seq_len: `max_target_length`.
        compiled_gib: HBM per device MaxText's compile reported (GiB), or its out-of-memory figure
            (its "G" are GiB: the same error gives v5p's HBM as "95.73G", cpplan's 95.7 GiB).
        fits: whether MaxText's compile fit.
        extra_flags: flags beyond the shared ones (e.g. the splash blocks Ulysses needed).
    """

    topology: str
    strategy: str
    ring: int
    ulysses: int
    seq_len: int
    compiled_gib: float
    fits: bool
    extra_flags: str = ""

    @property
    def name(self) -> str:
        degree = f"ring {self.ring} × ulysses {self.ulysses}" if self.strategy == "usp" else str(self.ring)
        return f"{self.topology} {self.strategy} {degree} × {self.seq_len // 1024}K"

    def flags(self) -> str:
        """MaxText's command-line flags of this compile (ANCHORS.md's command)."""
        splash = "" if self.strategy == "all_gather" else " use_tokamax_splash=True"
        mesh = f"ici_context_parallelism={self.ring}"
        if self.strategy == "usp":
            mesh += f" ici_context_usp_ulysses_parallelism={self.ulysses}"
        return (f"{COMMON_FLAGS} compile_topology={self.topology} max_target_length={self.seq_len} "
                f"per_device_batch_size={1 / get_topology(self.topology).num_devices} context_parallel_strategy={self.strategy} "
                f"{mesh}{splash} {self.extra_flags}").strip()


K = 1024
ANCHORS = [
    Anchor("v5p-16", "all_gather", 8, 1, 128 * K, 26.1, True),
    Anchor("v5p-16", "all_gather", 8, 1, 256 * K, 38.2, True),
    Anchor("v5p-16", "all_gather", 8, 1, 512 * K, 62.4, True),
    Anchor("v5p-16", "ring", 8, 1, 128 * K, 35.0, True),
    Anchor("v5p-16", "ring", 8, 1, 256 * K, 70.7, True),
    Anchor("v5p-16", "ring", 8, 1, 512 * K, 189.0, False),
    # the default blocks of 512 overflow SMEM, ANCHORS.md's compile used 1024; MaxText refuses Ulysses
    # with its default load balancing, so the compile turned it off
    Anchor("v5p-16", "ulysses", 8, 1, 128 * K, 26.2, True,
           "context_parallel_load_balance=False sa_block_q=1024 sa_block_kv=1024 sa_block_kv_compute=1024 "
           "sa_block_q_dkv=1024 sa_block_kv_dkv=1024 sa_block_kv_dkv_compute=1024 sa_block_q_dq=1024 "
           "sa_block_kv_dq=1024"),
    Anchor("v5p-16", "usp", 4, 2, 128 * K, 42.9, True),
    Anchor("v5p-16", "usp", 4, 2, 512 * K, 317.0, False),
    Anchor("tpu7x-16", "all_gather", 16, 1, 128 * K, 15.7, True),
    Anchor("tpu7x-16", "ring", 16, 1, 128 * K, 16.7, True),
    Anchor("tpu7x-16", "ring", 16, 1, 256 * K, 29.4, True),
    Anchor("tpu7x-16", "ring", 16, 1, 512 * K, 63.8, True),
    Anchor("tpu7x-16", "usp", 8, 2, 512 * K, 95.9, False),
]


def reprice(anchor: Anchor) -> dict:
    """The anchor priced as `cpplan import` prices its flags.

    Args:
        anchor: the compile.
    Returns:
        name, priced and compiled GiB, their ratio, both verdicts, and whether the row is
        within `TOLERANCE` with the same verdict.
    """
    found = read_maxtext(anchor.flags())
    predicted = estimate(found.plan, target="maxtext")
    priced = predicted.hbm_bytes_per_device / GiB
    compiled = anchor.compiled_gib
    ratio = priced / compiled
    return {"name": anchor.name, "priced_gib": priced, "compiled_gib": compiled, "ratio": ratio,
            "priced_fits": predicted.fits, "compiled_fits": anchor.fits,
            "ok": abs(ratio - 1) <= TOLERANCE and predicted.fits == anchor.fits}


def main() -> int:
    print(f"# {SOURCE}: priced by cpplan import (--target maxtext) against MaxText 0.2.5's compiles")
    print(f"{'compile':<44} {'priced':>8} {'compiled':>9} {'ratio':>6}  verdicts (priced / compiled)")
    rows = [reprice(anchor) for anchor in ANCHORS]
    for row in rows:
        verdicts = " / ".join("fits" if fit else "no" for fit in (row["priced_fits"], row["compiled_fits"]))
        mark = "" if row["ok"] else "   <- off by more than 10% or the verdict"
        print(f"{row['name']:<44} {row['priced_gib']:8.1f} {row['compiled_gib']:9.1f} {row['ratio']:6.3f}  "
              f"{verdicts}{mark}")
    ok = sum(row["ok"] for row in rows)
    print(f"{ok} of {len(rows)} within {TOLERANCE:.0%} with the same verdict")
    return 0


if __name__ == "__main__":
    sys.exit(main())
