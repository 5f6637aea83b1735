"""MaxText 0.2.5's own deviceless compiles of llama3.1-8b (one sequence per step, full remat, every
chip on the context axes) and their price under the MaxText target, as `cpplan import` reads their flags.
Evidence: docs/provenance/strategies_and_validation.md#anchors
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.topology import get_topology
from cost_models.units import GiB
from planner.estimate import estimate
from planner.maxtext import read_maxtext

SOURCE = "docs/measurements.md, 'MaxText 0.2.5 compiled deviceless'"
# the flags of the compiles' command line that every row shares
COMMON_FLAGS = (
    "compile_topology_num_slices=1 model_name=llama3.1-8b dataset_type=synthetic attention=flash "
    "remat_policy=full ici_fsdp_parallelism=1"
)
TOLERANCE = 0.10


@dataclass(frozen=True)
class Anchor:
    """One MaxText compile of the table. `ring`: `ici_context_parallelism` (the degree of every
    strategy but USP's Ulysses, `ulysses`); `compiled_gib`: the HBM per device the compile reported,
    or its out-of-memory figure; `extra_flags`: beyond `COMMON_FLAGS`."""

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
        """MaxText's command-line flags of this compile (the compiles' command)."""
        splash = "" if self.strategy == "all_gather" else " use_tokamax_splash=True"
        mesh = f"ici_context_parallelism={self.ring}"
        if self.strategy == "usp":
            mesh += f" ici_context_usp_ulysses_parallelism={self.ulysses}"
        return (
            f"{COMMON_FLAGS} compile_topology={self.topology} max_target_length={self.seq_len} "
            f"per_device_batch_size={1 / get_topology(self.topology).num_devices} "
            f"context_parallel_strategy={self.strategy} "
            f"{mesh}{splash} {self.extra_flags}"
        ).strip()


K = 1024
ANCHORS = [
    Anchor("v5p-16", "all_gather", 8, 1, 128 * K, 26.1, True),
    Anchor("v5p-16", "all_gather", 8, 1, 256 * K, 38.2, True),
    Anchor("v5p-16", "all_gather", 8, 1, 512 * K, 62.4, True),
    Anchor("v5p-16", "ring", 8, 1, 128 * K, 35.0, True),
    Anchor("v5p-16", "ring", 8, 1, 256 * K, 70.7, True),
    Anchor("v5p-16", "ring", 8, 1, 512 * K, 189.0, False),
    # default 512 blocks overflow SMEM; MaxText refuses Ulysses with load balancing on
    Anchor(
        "v5p-16",
        "ulysses",
        8,
        1,
        128 * K,
        26.2,
        True,
        "context_parallel_load_balance=False sa_block_q=1024 sa_block_kv=1024 sa_block_kv_compute=1024 "
        "sa_block_q_dkv=1024 sa_block_kv_dkv=1024 sa_block_kv_dkv_compute=1024 sa_block_q_dq=1024 "
        "sa_block_kv_dq=1024",
    ),
    Anchor("v5p-16", "usp", 4, 2, 128 * K, 42.9, True),
    Anchor("v5p-16", "usp", 4, 2, 512 * K, 317.0, False),
    Anchor("tpu7x-16", "all_gather", 16, 1, 128 * K, 15.7, True),
    Anchor("tpu7x-16", "ring", 16, 1, 128 * K, 16.7, True),
    Anchor("tpu7x-16", "ring", 16, 1, 256 * K, 29.4, True),
    Anchor("tpu7x-16", "ring", 16, 1, 512 * K, 63.8, True),
    Anchor("tpu7x-16", "usp", 8, 2, 512 * K, 95.9, False),
]


def reprice(anchor: Anchor) -> dict:
    """The anchor priced as `cpplan import` prices its flags: priced and compiled GiB, their ratio,
    both verdicts, and `ok` (within `TOLERANCE`, the same verdict or a marginal one)."""
    found = read_maxtext(anchor.flags())
    predicted = estimate(found.plan, target="maxtext")
    priced = predicted.hbm_bytes_per_device / GiB
    compiled = anchor.compiled_gib
    ratio = priced / compiled
    return {
        "name": anchor.name,
        "priced_gib": priced,
        "compiled_gib": compiled,
        "ratio": ratio,
        "priced_fits": predicted.fits,
        "priced_marginal": predicted.marginal,
        "compiled_fits": anchor.fits,
        # a marginal verdict claims neither: the price is within its measured error of the capacity
        "ok": abs(ratio - 1) <= TOLERANCE and (predicted.fits == anchor.fits or predicted.marginal),
    }
