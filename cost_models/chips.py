"""Chips as cited data: one frozen row per chip, loaded from JSON files.

The cited TPU rows ship in `cost_models/data/chips/`. A measured row (a CPU host, a GPU,
written by `cpplan calibrate`) is the same JSON format: drop it in a directory named by the
environment variable `CPPLAN_CHIP_DIR`, or load it with `load_chip(path)`; no code changes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from pathlib import Path

from cost_models.collectives import HOST_FORMULAS
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


class GroupedKernel(str, Enum):
    """A grouped-matmul kernel a runtime runs its experts' matmuls with; a chip row has figures for each."""

    TOKAMAX = "tokamax"  # tokamax's (megablox's) Mosaic kernel, as MaxText runs it
    XLA_RAGGED_DOT = "xla_ragged_dot"  # jax.lax.ragged_dot as XLA compiles it, as cpplan's runtime runs it


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
    def lanes(self) -> int:
        """Elements an array's minor-most dimension is laid out in multiples of in memory: a TPU tiles it
        by 128 lanes (its vector registers' width), so a head of 64 there takes 128; elsewhere, as it is."""
        return 128 if self is ChipKind.TPU else 1

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
    scoped_vmem_bytes: int  # the compiler's default scoped VMEM limit for one Mosaic kernel (0: no limit)
    scoped_vmem_max_bytes: int  # the most --xla_tpu_scoped_vmem_limit_kib grants that splash still compiles at
    matmul_efficiency: float
    attention_efficiency: float
    attention_block_overhead_s: float  # per splash grid step (q block × kv block × head), visited or skipped
    attention_step_s_per_operand_byte: (
        float  # per grid step, per byte of the kernel's operand arrays (interpreted kernels)
    )
    attention_masked_element_s: float  # per logit of a block the causal mask cuts through, per kernel
    attention_backward_over_forward: float  # splash's fused backward's MXU time over the forward's, per core
    attention_unfused_backward_factor: float  # the dq and dk/dv kernels' time over the fused backward's
    attention_operand_passes: float  # passes over a forward call's operand arrays at HBM bandwidth, per call
    attention_backward_operand_passes: float  # the same for the backward's operand arrays
    comm_overlaps_compute: bool
    # the memory of the VM that holds the chip, shared out per chip (what a process can pin), and the
    # chip's one-way link to it: where remat offload puts activations, and how fast they go and come back
    host_memory_bytes_per_chip: int
    host_link_bw_bytes_per_s: float
    # facts of the chip's XLA compiler schedule that the memory price reads (from deviceless compiles,
    # cited in the rows): layouts moved off the TensorCore; a backward's attention recomputation run
    # before the MLP's; an iteration peeled off each layer loop of an offloading step; splash's
    # log-sum-exp kept in the kernel's lane-wide output until the backward reads it, and through a
    # layer's forward that keeps the attention output; a flat offloading program's loss holding a layer's
    # weights beyond the last layer's gathered MLP matrices; reduce-scatters run by the SparseCore, each
    # holding a scratch of (n - 2)/n of its operand in HBM; the loss's logit gradient fused into the head's
    # weight-gradient matmul, so that a deferred matmul holds the logits, which the compiler can recompute
    relayout_off_tensorcore: bool
    attention_before_mlp_backward: bool
    offload_peels_layer_loops: bool
    splash_lse_lanes_held: bool
    forward_lse_lanes_held: bool
    flat_offload_holds_layer_weights: bool
    reduce_scatter_scratch: bool
    logit_gradient_fused_into_head_matmul: bool
    # the peak of a matmul of fp8 operands, per chip: the bf16 peak where fp8 runs at the bf16 rate (v5p,
    # v6e, as Google's docs give them); 0.0 where no fp8 rate is documented or measured (the price refuses
    # fp8 there: cost_models/precision.py)
    peak_fp8_flops_per_s: float = 0.0
    # a grouped matmul (a mixture-of-experts layer's expert matmuls: each row times its group's matrix),
    # fitted to a grouped-matmul kernel's measured timings; `grouped_matmul_seconds` is the model they
    # are fitted in. Efficiencies are fractions of the per-device peak; 0.0 where not measured (the
    # grouped matmul is then priced as the dense one, at `matmul_efficiency` without per-group costs)
    grouped_matmul_efficiency: float = 0.0
    grouped_matmul_group_rows: float = 0.0  # MXU rows each group adds (its partial row tile), per group
    grouped_matmul_group_overhead_s: float = 0.0  # seconds each group adds, per group
    grouped_matmul_weight_grad_efficiency: float = 0.0  # the weight gradient (one matrix per group)
    grouped_matmul_weight_grad_group_rows: float = 0.0
    grouped_matmul_fp8_efficiency: float = 0.0  # fp8 weights (lhs quantized in the kernel), of the fp8 peak
    # a grouped matmul whose contracted or output width is not a multiple of the TPU's 128 lanes (GPT-OSS's
    # 2880, Gemma's 704 and 2816): its measured time over the model's for it (the median of such calls);
    # 1.0 where not measured (priced as a lane-aligned one)
    grouped_matmul_unaligned_slowdown: float = 1.0
    # the same model's figures for XLA's own grouped matmul (`jax.lax.ragged_dot` compiled by XLA, which
    # cpplan's runtime runs), fitted to its timings on the chip (regenerate/fit_ragged_dot.py); 0.0 where
    # not measured (the kernel is then priced with the figures above, and its source says so)
    ragged_dot_efficiency: float = 0.0
    ragged_dot_group_rows: float = 0.0
    ragged_dot_group_overhead_s: float = 0.0
    ragged_dot_weight_grad_efficiency: float = 0.0
    ragged_dot_weight_grad_group_rows: float = 0.0
    ragged_dot_unaligned_slowdown: float = 1.0
    # HBM passes over the routed copies (tokens × top k × hidden) that routing, permuting, unpermuting and
    # combining take per forward as cpplan's runtime runs them (XLA's top k, sort, gathers and scatters),
    # from a timing of them on the chip (regenerate/fit_ragged_dot.py); 0.0 where not measured (the passes
    # are then counted: cost_models/pricing/experts.py)
    ragged_dot_permute_passes: float = 0.0
    # the time one collective across N slices (a reduce-scatter or an all-gather over DCN) waits beyond its
    # bytes' line-rate time: base + per_slice · N, fitted to the published runs' step growth from one slice to
    # N (regenerate/fit_dcn_latency.py); 0.0 where not fitted
    dcn_collective_latency_s: float = 0.0
    dcn_collective_latency_per_slice_s: float = 0.0
    # a host's collectives, each kind at its measured rate: ((kind, bytes/s, latency s), ...); its
    # virtual devices share memory, not links, so the torus formulas do not describe them.
    # Written {kind: [bytes/s, latency s]} in JSON; empty for chips with links.
    host_collectives: tuple = ()
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if isinstance(self.host_collectives, dict):
            object.__setattr__(self, "host_collectives", _host_collectives(self.name, self.host_collectives))

    def dcn_latency_s(self, slices: int) -> float:
        """What one collective across `slices` slices waits for over DCN beyond its bytes' time (0 on one)."""
        if slices <= 1:
            return 0.0
        return self.dcn_collective_latency_s + self.dcn_collective_latency_per_slice_s * slices

    def grouped_figures(self, kernel: GroupedKernel) -> tuple[float, float, float, float, float, float]:
        """`kernel`'s figures, in GROUPED_MATMUL_FIELDS' order but fp8's: efficiency, group rows, seconds per
        group, the weight gradient's efficiency and group rows, the unaligned widths' slowdown. XLA's ragged
        dot on a row that has not measured it takes the row's grouped-matmul figures (`measures`)."""
        prefix = "ragged_dot" if kernel is GroupedKernel.XLA_RAGGED_DOT and self.measures(kernel) else "grouped_matmul"
        return tuple(getattr(self, f"{prefix}_{name}") for name in GROUPED_FIGURE_NAMES)

    def measures(self, kernel: GroupedKernel) -> bool:
        """Whether the row has figures fitted to `kernel`'s own timings."""
        if kernel is GroupedKernel.XLA_RAGGED_DOT:
            return self.ragged_dot_efficiency > 0
        return self.grouped_matmul_efficiency > 0

    def grouped_matmul_seconds(
        self,
        groups: float,
        rows: float,
        contract: int,
        out: int,
        *,
        weight_grad: bool = False,
        fp8: bool = False,
        kernel: GroupedKernel = GroupedKernel.TOKAMAX,
    ) -> float:
        """Seconds of one grouped matmul on one device, in the model the row's grouped-matmul figures were
        fitted in (regenerate/fit_grouped_matmul.py):

            max(2·(rows + groups·r)·contract·out / (peak·e), bytes / hbm_bw) + groups·c

        where peak and hbm_bw are the device's (the chip's over devices_per_chip), e the efficiency, r the
        rows and c the seconds each group adds, and bytes the operands read and the result written once:
        bf16 rows (rows·contract and rows·out, 2 bytes each) and each group's matrix (groups·contract·out,
        2 bytes; 1 for fp8 weights). The weight gradient has its own e and r; fp8 weights on a chip whose
        row has an fp8 rate and efficiency run at those, elsewhere at the bf16 figures. A row without
        grouped figures (0.0: not measured) prices the dense matmul: `matmul_efficiency`, r = c = 0.

        A contracted or output width that is not a multiple of the chip's lanes (128 on a TPU) multiplies
        the whole time by the kernel's unaligned slowdown (`grouped_matmul_unaligned_slowdown`, or
        `ragged_dot_unaligned_slowdown` for XLA's): the row's measured ratio for such calls
        (1.0 where not measured), applied to the widths as they are, not padded: padding them up to a
        multiple of 128 or of the MXU tile explains little of the measured slowdown (the row's source).

        Args:
            groups: groups with at least one row (experts the device holds that tokens were routed to).
            rows: rows of all groups together (tokens × experts each is routed to, on this device).
            contract: the contracted width (the forward's model width, or the expert's for its second matrix).
            out: the output width.
            weight_grad: the weight gradient: each group's [contract, out] matrix summed over its rows
                (`rows` × `contract` against `rows` × `out`), with the row's weight-gradient figures.
            fp8: fp8 matrices at the fp8 peak and efficiency, where the row has both; otherwise the bf16 figures.
            kernel: whose figures (`grouped_figures`): tokamax's Mosaic kernel (the default) or XLA's ragged dot.
        """
        bf16_e, rows_per_group, group_s, grad_e, grad_rows, unaligned = self.grouped_figures(kernel)
        # only tokamax's kernel is timed in fp8
        fp8_rate = (
            fp8
            and kernel is GroupedKernel.TOKAMAX
            and self.peak_fp8_flops_per_s > 0
            and self.grouped_matmul_fp8_efficiency > 0
        )
        if bf16_e <= 0:
            efficiency, group_rows, group_s = self.matmul_efficiency, 0.0, 0.0  # not measured: the dense matmul
        elif weight_grad and grad_e > 0:
            efficiency, group_rows = grad_e, grad_rows
        else:
            efficiency = self.grouped_matmul_fp8_efficiency if fp8_rate else bf16_e
            group_rows = rows_per_group
        peak = (self.peak_fp8_flops_per_s if fp8_rate else self.peak_bf16_flops_per_s) / self.devices_per_chip
        math = 2.0 * (rows + groups * group_rows) * contract * out / (peak * efficiency)
        weight_bytes = 1 if fp8 and not weight_grad else 2  # a weight gradient is written in bf16
        moved = 2.0 * rows * (contract + out) + weight_bytes * groups * contract * out
        seconds = max(math, moved / (self.hbm_bw_bytes_per_s / self.devices_per_chip)) + groups * group_s
        lanes = self.kind.lanes
        return seconds * unaligned if contract % lanes or out % lanes else seconds

    @property
    def cores_per_device(self) -> int:
        """TensorCores one JAX device drives and a kernel's parallel grid dimensions are split over (v5p's
        megacore: 2); an interpreted kernel runs as one program wherever it runs."""
        return 1 if self.kind.interprets_kernels else self.tensorcores_per_chip // self.devices_per_chip

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
        if not isinstance(row, dict):
            raise CpplanError(f"{origin}: a chip row is a JSON object of fields, not {type(row).__name__}.")
        names = {f.name for f in dataclasses.fields(cls)}
        # fields added after measured rows were first written: a row without them takes their defaults
        missing = sorted(names - set(row) - {"sources", *DEFAULTED_FIELDS})
        extra = sorted(set(row) - names)
        if missing or extra:
            raise CpplanError(
                f"{origin}: chip row has missing fields {missing} and unknown fields {extra}; "
                f"a row needs exactly: {', '.join(sorted(names))}."
            )
        try:
            wrap = Wraparound(row["wraparound"])
        except (ValueError, TypeError):
            raise CpplanError(
                f"{origin}: wraparound {row['wraparound']!r} is not one of {[w.value for w in Wraparound]}."
            ) from None
        try:
            kind = ChipKind(row["kind"])
        except (ValueError, TypeError):
            raise CpplanError(f"{origin}: kind {row['kind']!r} is not one of {[k.value for k in ChipKind]}.") from None
        for name, value in row.items():
            if name in _NUMBER_RULES:
                _check_number(origin, name, value, *_NUMBER_RULES[name])
        if not isinstance(row["name"], str) or not row["name"].strip():
            raise CpplanError(f"{origin}: name={row['name']!r} must be a non-empty string (the chip's name).")
        for name in ("comm_overlaps_compute", *COMPILER_SCHEDULE_FIELDS):
            if not isinstance(row[name], bool):
                raise CpplanError(f"{origin}: {name}={row[name]!r} must be true or false.")
        sources = row.get("sources", {})
        if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
            raise CpplanError(f"{origin}: sources={sources!r} must map field names to citation strings.")
        if row["devices_per_chip"] > 1 and row["core_link_bw_bytes_per_s"] is None:
            raise CpplanError(
                f"{origin}: a chip of {row['devices_per_chip']} devices needs core_link_bw_bytes_per_s, "
                f"the bandwidth between them; measure it (cpplan calibrate) or cite it."
            )
        if row["max_chips"] > 1 and not row["ici_link_bw_bytes_per_s"] > 0:
            raise CpplanError(
                f"{origin}: a slice of up to {row['max_chips']} chips needs ici_link_bw_bytes_per_s > 0, "
                f"the bandwidth between chips; cite it, or set max_chips to 1."
            )
        if row.get("grouped_matmul_fp8_efficiency", 0) > 0 and not row.get("peak_fp8_flops_per_s", 0) > 0:
            raise CpplanError(
                f"{origin}: grouped_matmul_fp8_efficiency={row['grouped_matmul_fp8_efficiency']!r} is a fraction of "
                f"the fp8 peak, which the row does not give (peak_fp8_flops_per_s); cite the peak or set it to 0."
            )
        return cls(
            **{
                **row,
                "wraparound": wrap,
                "kind": kind,
                "host_collectives": _host_collectives(origin, row["host_collectives"]),
            }
        )


# the grouped-matmul figures (regenerate/fit_grouped_matmul.py); 0.0 where not measured (the unaligned
# widths' slowdown 1.0)
GROUPED_MATMUL_FIELDS = (
    "grouped_matmul_efficiency",
    "grouped_matmul_group_rows",
    "grouped_matmul_group_overhead_s",
    "grouped_matmul_weight_grad_efficiency",
    "grouped_matmul_weight_grad_group_rows",
    "grouped_matmul_fp8_efficiency",
    "grouped_matmul_unaligned_slowdown",
)
# fields a row may leave out (rows `cpplan calibrate` wrote before they existed): each takes the default
# of its declaration above, which means "not measured" (0.0; the unaligned slowdown 1.0)
# the figures of each kernel's model (`Chip.grouped_figures`), after its prefix
GROUPED_FIGURE_NAMES = (
    "efficiency",
    "group_rows",
    "group_overhead_s",
    "weight_grad_efficiency",
    "weight_grad_group_rows",
    "unaligned_slowdown",
)
RAGGED_DOT_FIELDS = tuple(f"ragged_dot_{name}" for name in GROUPED_FIGURE_NAMES)
DEFAULTED_FIELDS = (
    "peak_fp8_flops_per_s",
    *GROUPED_MATMUL_FIELDS,
    *RAGGED_DOT_FIELDS,
    "ragged_dot_permute_passes",
    "dcn_collective_latency_s",
    "dcn_collective_latency_per_slice_s",
)

# the chip row's compiler-schedule facts (booleans, each cited with the compile it was read from)
COMPILER_SCHEDULE_FIELDS = (
    "relayout_off_tensorcore",
    "attention_before_mlp_backward",
    "offload_peels_layer_loops",
    "splash_lse_lanes_held",
    "forward_lse_lanes_held",
    "flat_offload_holds_layer_weights",
    "reduce_scatter_scratch",
    "logit_gradient_fused_into_head_matmul",
)

# (integer?, lowest, lowest allowed itself?, highest or None, what the field measures); every value finite
_NUMBER_RULES = {
    "peak_bf16_flops_per_s": (False, 0, False, None, "a chip's peak FLOP/s"),
    "hbm_bytes_per_device": (True, 0, False, None, "bytes of memory per device"),
    "hbm_bw_bytes_per_s": (False, 0, False, None, "memory bandwidth"),
    "ici_links_per_chip": (True, 0, True, None, "a count of links"),
    "ici_link_bw_bytes_per_s": (False, 0, True, None, "a link bandwidth (0 where there are no links)"),
    "core_link_bw_bytes_per_s": (False, 0, False, None, "a bandwidth between a chip's cores (or null)"),
    "torus_rank": (True, 0, True, 3, "the torus's dimensions"),
    "devices_per_chip": (True, 1, True, None, "a count of devices"),
    "tensorcores_per_chip": (True, 1, True, None, "a count of TensorCores"),
    "max_chips": (True, 1, True, None, "a count of chips"),
    "dcn_bw_bytes_per_s": (False, 0, True, None, "a bandwidth (0 where there is no DCN)"),
    "ici_hop_latency_s": (False, 0, True, None, "a latency"),
    "dcn_collective_latency_s": (False, 0, True, None, "a latency"),
    "dcn_collective_latency_per_slice_s": (False, 0, True, None, "a latency per slice"),
    "mxu_tile": (True, 1, True, None, "a tile edge in elements"),
    "smem_bytes": (True, 0, True, None, "bytes of SMEM (0 where kernels are interpreted)"),
    "matmul_efficiency": (False, 0, False, 1, "a fraction of the peak"),
    # measured against the row's matmul peak, not a physical limit: a host's attention may beat it
    "attention_efficiency": (False, 0, False, 2, "a fraction of the matmul peak"),
    "attention_block_overhead_s": (False, 0, True, None, "a time per grid step"),
    "attention_step_s_per_operand_byte": (False, 0, True, None, "a time per byte"),
    "attention_masked_element_s": (False, 0, True, None, "a time per logit"),
    "attention_backward_over_forward": (False, 0, False, None, "a ratio of times"),
    "attention_unfused_backward_factor": (False, 0, False, None, "a ratio of times"),
    "scoped_vmem_bytes": (True, 0, True, None, "bytes of scoped VMEM"),
    "scoped_vmem_max_bytes": (True, 0, True, None, "bytes of scoped VMEM"),
    "attention_operand_passes": (False, 0, True, None, "a count of passes"),
    "attention_backward_operand_passes": (False, 0, True, None, "a count of passes"),
    "host_memory_bytes_per_chip": (True, 0, False, None, "bytes of host memory per chip"),
    "host_link_bw_bytes_per_s": (False, 0, False, None, "the bandwidth between a chip and its host"),
    "peak_fp8_flops_per_s": (False, 0, True, None, "a chip's fp8 peak FLOP/s (0 where it has no fp8 rate)"),
    "grouped_matmul_efficiency": (False, 0, True, 1, "a fraction of the peak (0 where not measured)"),
    "grouped_matmul_group_rows": (False, 0, True, None, "rows per group"),
    "grouped_matmul_group_overhead_s": (False, 0, True, None, "a time per group"),
    "grouped_matmul_weight_grad_efficiency": (False, 0, True, 1, "a fraction of the peak (0 where not measured)"),
    "grouped_matmul_weight_grad_group_rows": (False, 0, True, None, "rows per group"),
    "grouped_matmul_fp8_efficiency": (False, 0, True, 1, "a fraction of the fp8 peak (0 where not measured)"),
    "grouped_matmul_unaligned_slowdown": (False, 0, False, None, "a ratio of times (1 where not measured)"),
    "ragged_dot_efficiency": (False, 0, True, 1, "a fraction of the peak (0 where not measured)"),
    "ragged_dot_group_rows": (False, 0, True, None, "rows per group"),
    "ragged_dot_group_overhead_s": (False, 0, True, None, "a time per group"),
    "ragged_dot_weight_grad_efficiency": (False, 0, True, 1, "a fraction of the peak (0 where not measured)"),
    "ragged_dot_weight_grad_group_rows": (False, 0, True, None, "rows per group"),
    "ragged_dot_unaligned_slowdown": (False, 0, False, None, "a ratio of times (1 where not measured)"),
    "ragged_dot_permute_passes": (False, 0, True, None, "a count of HBM passes (0 where not measured)"),
}


class ChipRuleError(CpplanError):
    """A chip-row number that breaks its rule: `rule` names the field, its value and the rule (the
    message adds where the row came from and what to do about a written row)."""

    def __init__(self, origin: str, rule: str, fix: str):
        super().__init__(f"{origin}: {rule}; {fix}.")
        self.origin, self.rule, self.fix = origin, rule, fix

    def __reduce__(self):  # rebuilt from its parts (a pickled exception is rebuilt from `args`)
        return type(self), (self.origin, self.rule, self.fix)


def _check_number(origin: str, name: str, value, integer: bool, low: float, low_ok: bool, high, what: str) -> None:
    """Refuses a chip-row number of the wrong type, not finite, or outside its physical range."""
    if value is None and name == "core_link_bw_bytes_per_s":
        return
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise ChipRuleError(origin, f"{name}={value!r} must be {kind} ({what})", "write it as a JSON number")
    if not math.isfinite(value):
        raise ChipRuleError(origin, f"{name}={value!r} must be finite ({what})", "write the measured figure")
    too_low = value < low or (value == low and not low_ok)
    if too_low or (high is not None and value > high):
        bound = f"{'≥' if low_ok else '>'} {low}" + (f" and ≤ {high}" if high is not None else "")
        raise ChipRuleError(origin, f"{name}={value!r} must be {bound} ({what})", "fix the row")


def _host_collectives(origin: str, value) -> tuple:
    """`{kind: [bytes/s, latency s]}` from JSON as the row's sorted tuple, each figure checked."""
    if isinstance(value, (tuple, list)) and not value:
        return ()
    if not isinstance(value, dict):
        raise CpplanError(
            f"{origin}: host_collectives={value!r} must be an object {{kind: [bytes/s, latency s]}} "
            f"with kinds among {sorted(HOST_FORMULAS)}."
        )
    out = []
    for kind, pair in sorted(value.items()):
        if kind not in HOST_FORMULAS:
            raise CpplanError(f"{origin}: host_collectives kind {kind!r} is not one of {sorted(HOST_FORMULAS)}.")
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise CpplanError(f"{origin}: host_collectives[{kind!r}]={pair!r} must be [bytes/s, latency s].")
        _check_number(origin, f"host_collectives[{kind!r}] bandwidth", pair[0], False, 0, False, None, "a bandwidth")
        _check_number(origin, f"host_collectives[{kind!r}] latency", pair[1], False, 0, True, None, "a latency")
        out.append((kind, float(pair[0]), float(pair[1])))
    return tuple(out)


def load_chip(path: str | os.PathLike) -> Chip:
    """Reads one chip row from a JSON file."""
    path = Path(path)
    try:
        row = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, RecursionError, json.JSONDecodeError) as err:
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


def measured_here(name: str) -> bool:
    """Whether the row of chip `name` is one `cpplan calibrate` wrote (in $CPPLAN_CHIP_DIR), not a cited one."""
    extra = os.environ.get(CHIP_DIR_ENV)
    return bool(extra) and Path(extra).is_dir() and name in _chips_in((extra,))


def known_chips() -> dict[str, Chip]:
    """All chip rows: the cited ones, then any in $CPPLAN_CHIP_DIR (which may override)."""
    dirs = [str(CHIP_DIR)]
    extra = os.environ.get(CHIP_DIR_ENV)
    if extra:
        if not Path(extra).is_dir():
            raise CpplanError(
                f"{CHIP_DIR_ENV}={extra!r} is not a directory; point it at the directory "
                f"`cpplan calibrate` wrote its row into, or unset it."
            )
        dirs.append(extra)
    return _chips_in(tuple(dirs))


def get_chip(name: str) -> Chip:
    """The chip row called `name`."""
    chips = known_chips()
    if name not in chips:
        raise unknown_name("chip", name, chips)
    return chips[name]
