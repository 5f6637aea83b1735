"""Chips as cited data: one frozen row per chip, loaded from JSON files.

The cited TPU rows ship in `cost_models/data/chips/`. A measured row (a CPU host, a GPU,
written by `cpplan calibrate`) is the same JSON format: drop it in a directory named by the
environment variable `CPPLAN_CHIP_DIR`, or load it with `load_chip(path)`; no code changes.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from pathlib import Path

from cost_models.errors import CpplanError, unknown_name

CHIP_DIR = Path(__file__).parent / "data" / "chips"
CHIP_DIR_ENV = "CPPLAN_CHIP_DIR"


class Wraparound(str, Enum):
    """Which torus dimensions of a slice have wraparound links."""

    ALWAYS = "always"
    MULTIPLE_OF_4 = "multiple_of_4"
    ONLY_16 = "only_16"
    NEVER = "never"

    def wraps(self, size: int) -> bool:
        """Whether a dimension of `size` chips closes into a ring."""
        if size <= 2:
            # two chips are neighbours both ways: a wrap link adds nothing
            return False
        if self is Wraparound.ALWAYS:
            return True
        if self is Wraparound.MULTIPLE_OF_4:
            return size % 4 == 0
        if self is Wraparound.ONLY_16:
            return size == 16
        return False


class ChipKind(str, Enum):
    """What a row describes; code asks its properties, never compares names, so a new kind is
    a new member and a new row."""

    TPU = "tpu"
    CPU = "cpu"  # a host's virtual devices (`cpu:N`), measured by `cpplan calibrate`
    GPU = "gpu"  # a measured GPU: splash is a TPU kernel, so it runs interpreted there

    @property
    def shares_cores(self) -> bool:
        """The devices share one host's cores and memory: work moves to whichever device is busy."""
        return self is ChipKind.CPU

    @property
    def has_torus(self) -> bool:
        """Devices are joined by ICI links on a torus (placement matters; MaxText can run here)."""
        return self is ChipKind.TPU

    @property
    def interprets_kernels(self) -> bool:
        """Pallas kernels (splash) run in interpret mode: no SMEM limit, a cost per grid step."""
        return self is not ChipKind.TPU

    @property
    def jax_platform(self) -> str:
        """The jax platform name of these devices."""
        return self.value


@dataclass(frozen=True)
class Chip:
    """One accelerator (or host) with its figures per chip; units are in the field names."""

    name: str
    kind: ChipKind
    peak_bf16_flops_per_s: float
    hbm_bytes_per_device: int
    hbm_bw_bytes_per_s: float
    ici_links_per_chip: int
    ici_link_bw_bytes_per_s: float
    core_link_bw_bytes_per_s: float | None
    torus_rank: int
    wraparound: Wraparound
    devices_per_chip: int
    tensorcores_per_chip: int
    max_chips: int
    dcn_bw_bytes_per_s: float
    ici_hop_latency_s: float
    mxu_tile: int
    smem_bytes: int
    matmul_efficiency: float
    attention_efficiency: float
    attention_block_overhead_s: float  # per splash grid step (q block × kv block × head), visited or skipped
    attention_step_s_per_operand_byte: float  # per grid step, per byte of the kernel's operand arrays (interpreted kernels)
    attention_masked_element_s: float  # per logit of a block the causal mask cuts through, per kernel
    attention_backward_over_forward: float  # backward kernels' MXU time over the forward's
    attention_operand_passes: float  # passes over a forward call's operand arrays at HBM bandwidth, per call
    attention_backward_operand_passes: float  # the same for the backward's operand arrays
    comm_overlaps_compute: bool
    # a host's collectives, each kind at its measured rate: ((kind, bytes/s, latency s), ...); its
    # virtual devices share memory, not links, so the torus formulas do not describe them.
    # Written {kind: [bytes/s, latency s]} in JSON; empty for chips with links.
    host_collectives: tuple = ()
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if isinstance(self.host_collectives, dict):
            object.__setattr__(self, "host_collectives", tuple(
                (kind, float(bw), float(lat)) for kind, (bw, lat) in sorted(self.host_collectives.items())))

    def to_dict(self) -> dict:
        """The JSON form of this row."""
        row = dataclasses.asdict(self)
        row["wraparound"] = self.wraparound.value
        row["kind"] = self.kind.value
        row["host_collectives"] = {kind: [bw, lat] for kind, bw, lat in self.host_collectives}
        return row

    @classmethod
    def from_dict(cls, row: dict, *, origin: str = "chip row") -> "Chip":
        """Builds a row from its JSON form, naming missing or unknown fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(names - set(row) - {"sources"})
        extra = sorted(set(row) - names)
        if missing or extra:
            raise CpplanError(
                f"{origin}: chip row has missing fields {missing} and unknown fields {extra}; "
                f"a row needs exactly: {', '.join(sorted(names))}."
            )
        try:
            wrap = Wraparound(row["wraparound"])
        except ValueError:
            raise CpplanError(
                f"{origin}: wraparound {row['wraparound']!r} is not one of "
                f"{[w.value for w in Wraparound]}."
            ) from None
        try:
            kind = ChipKind(row["kind"])
        except ValueError:
            raise CpplanError(f"{origin}: kind {row['kind']!r} is not one of {[k.value for k in ChipKind]}.") from None
        chip = cls(**{**row, "wraparound": wrap, "kind": kind})
        for name in ("peak_bf16_flops_per_s", "hbm_bytes_per_device", "hbm_bw_bytes_per_s", "devices_per_chip"):
            if not getattr(chip, name) > 0:
                raise CpplanError(f"{origin}: {name}={getattr(chip, name)} must be positive.")
        return chip


def load_chip(path: str | os.PathLike) -> Chip:
    """Reads one chip row from a JSON file."""
    path = Path(path)
    try:
        row = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CpplanError(f"cannot read chip row {str(path)!r}: {err}") from None
    return Chip.from_dict(row, origin=str(path))


@lru_cache(maxsize=8)
def _chips_in(dirs: tuple[str, ...]) -> dict[str, Chip]:
    chips: dict[str, Chip] = {}
    for directory in dirs:
        for path in sorted(Path(directory).glob("*.json")):
            chip = load_chip(path)
            chips[chip.name] = chip  # later directories (measured rows) override cited ones
    return chips


def known_chips() -> dict[str, Chip]:
    """All chip rows: the cited ones, then any in $CPPLAN_CHIP_DIR (which may override)."""
    dirs = [str(CHIP_DIR)]
    extra = os.environ.get(CHIP_DIR_ENV)
    if extra:
        dirs.append(extra)
    return _chips_in(tuple(dirs))


def get_chip(name: str) -> Chip:
    """The chip row called `name`."""
    chips = known_chips()
    if name not in chips:
        raise unknown_name("chip", name, chips)
    return chips[name]
