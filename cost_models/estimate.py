"""`Estimate`: the named price of one plan, and how to read it off a row of priced candidates.

Times are seconds per step, bytes per device; `cost_models.pricing` computes the figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cost_models.candidates import Candidates
from cost_models.pricing import Priced, peak_bytes
from cost_models.strategies import STRATEGIES
from cost_models.strategies.base import lane_ratio
from cost_models.units import mfu


@dataclass(frozen=True)
class Estimate:
    """The named price of one plan: times in seconds per step, bytes per device. `exposed_s` is the
    communication the step waits for; `step_time_s` = compute + HBM-bound work + exposed communication."""

    step_time_s: float
    compute_s: dict[str, float]
    hbm_s: dict[str, float]
    comm_s: dict[str, float]
    exposed_s: dict[str, float]
    hbm_bytes: dict[str, float]
    hbm_capacity_bytes: int
    smem_bytes: float
    smem_capacity_bytes: int
    model_flops: float
    executed_flops_per_device: float
    tokens_per_step: int
    num_devices: int
    num_chips: int
    peak_flops_per_device: float
    cp_collective: str
    notes: tuple[str, ...] = field(default=())
    memory_margin: float = 0.0  # the compiler's measured excess over the memory price (`accuracy.memory_band`)
    memory_overprice: float = 0.0  # the memory price's measured excess over what the compiler needed

    @property
    def hbm_bytes_per_device(self) -> float:
        """Peak: static state plus the larger of a layer's backward and the loss, or the optimizer's
        update at the step's end where that holds more (`peak_bytes`)."""
        return float(peak_bytes(self.hbm_bytes))

    @property
    def headroom_bytes(self) -> float:
        return self.hbm_capacity_bytes - self.hbm_bytes_per_device

    @property
    def smem_fits(self) -> bool:
        """The splash metadata fits the chip's SMEM (always where the chip has none to count)."""
        return self.smem_capacity_bytes == 0 or self.smem_bytes <= self.smem_capacity_bytes

    @property
    def fits(self) -> bool:
        return self.hbm_bytes_per_device <= self.hbm_capacity_bytes and self.smem_fits

    @property
    def marginal(self) -> bool:
        """Within the memory price's measured error of the capacity: fits as priced, but not once the
        compiler's largest measured excess over the price is added, or does not fit as priced (HBM),
        but would with the price's largest measured excess over the compiler taken off. The pre-flight
        compile settles it."""
        hbm = self.hbm_bytes_per_device
        if self.fits:
            return hbm * (1 + self.memory_margin) > self.hbm_capacity_bytes
        return self.smem_fits and hbm / (1 + self.memory_overprice) <= self.hbm_capacity_bytes

    @property
    def marginal_reason(self) -> str:
        """Why the verdict is marginal ('' where it is not)."""
        if not self.marginal:
            return ""
        if self.fits:
            return (
                "within the memory price's measured error of the capacity (the compiler has needed up to "
                f"{self.memory_margin:.1%} more than priced); `cpplan run`'s pre-flight compile settles it"
            )
        return (
            "over the capacity as priced, but within the memory price's measured error of it (the price has said "
            f"up to {self.memory_overprice:.1%} more than the compiler needed); a compile settles it"
        )

    @property
    def verdict(self) -> str:
        """'fits', 'fits, marginally', 'does not fit, marginally' or 'does not fit'."""
        verdict = "fits" if self.fits else "does not fit"
        return verdict + ", marginally" if self.marginal else verdict

    @property
    def mfu(self) -> float:
        return mfu(self.model_flops, self.step_time_s, self.num_devices, self.peak_flops_per_device)

    @property
    def tokens_per_s_per_chip(self) -> float:
        return self.tokens_per_step / self.step_time_s / self.num_chips

    @property
    def t_math_s(self) -> float:
        return float(sum(self.compute_s.values()))

    @property
    def t_hbm_s(self) -> float:
        return float(sum(self.hbm_s.values()))

    @property
    def t_comms_s(self) -> float:
        return float(sum(self.comm_s.values()))

    @property
    def lower_bound_s(self) -> float:
        """Perfect overlap: the largest of T_math, T_hbm and the busiest collective family
        (families run on different axes at once, so their sum is no bound)."""
        return max(self.t_math_s, self.t_hbm_s, max(self.comm_s.values()))

    @property
    def upper_bound_s(self) -> float:
        """No overlap at all."""
        return self.t_math_s + self.t_hbm_s + self.t_comms_s

    @property
    def bottleneck(self) -> str:
        """The largest single term of the step: a compute kind, HBM-bound work, or exposed traffic."""
        terms = {f"compute ({k})": v for k, v in self.compute_s.items()}
        terms["HBM-bound work"] = self.t_hbm_s
        terms.update({f"exposed {k} communication": v for k, v in self.exposed_s.items()})
        return max(terms, key=terms.get)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_time_s": self.step_time_s,
            "mfu": self.mfu,
            "tokens_per_s_per_chip": self.tokens_per_s_per_chip,
            "fits": self.fits,
            "marginal": self.marginal,
            "bottleneck": self.bottleneck,
            "compute_s": self.compute_s,
            "hbm_s": self.hbm_s,
            "comm_s": self.comm_s,
            "exposed_s": self.exposed_s,
            "lower_bound_s": self.lower_bound_s,
            "upper_bound_s": self.upper_bound_s,
            "hbm_bytes": self.hbm_bytes,
            "hbm_bytes_per_device": self.hbm_bytes_per_device,
            "hbm_capacity_bytes": self.hbm_capacity_bytes,
            "memory_margin": self.memory_margin,
            "memory_overprice": self.memory_overprice,
            "smem_bytes": self.smem_bytes,
            "smem_capacity_bytes": self.smem_capacity_bytes,
            "model_flops": self.model_flops,
            "executed_flops_per_device": self.executed_flops_per_device,
            "tokens_per_step": self.tokens_per_step,
            "cp_collective": self.cp_collective,
            "notes": list(self.notes),
        }


def estimate_row(
    priced: Priced, i: int, x: Candidates, *, memory_margins: tuple[float, float] = (0.0, 0.0)
) -> Estimate:
    """Row `i` of the candidates `x` priced as `priced` (`cost_models.pricing.price(x)`), as an
    `Estimate`; `memory_margins` are the memory price's measured errors each way for its chip and
    target (`accuracy.memory_margins`)."""
    topo = x.topology

    def pick(d):
        return {k: float(np.broadcast_to(v, priced.step_time_s.shape)[i]) for k, v in d.items()}

    return Estimate(
        step_time_s=float(priced.step_time_s[i]),
        compute_s=pick(priced.compute_s),
        hbm_s=pick(priced.hbm_s),
        comm_s=pick(priced.comm_s),
        exposed_s=pick(priced.exposed_s),
        hbm_bytes=pick(priced.memory),
        hbm_capacity_bytes=topo.hbm_bytes_per_device,
        smem_bytes=float(priced.smem_bytes[i]),
        smem_capacity_bytes=topo.chip.smem_bytes,
        model_flops=priced.model_flops,
        executed_flops_per_device=float(priced.executed_flops[i]),
        tokens_per_step=x.case.tokens_per_step,
        num_devices=topo.num_devices,
        num_chips=topo.num_chips,
        peak_flops_per_device=topo.peak_flops_per_device,
        cp_collective=" + ".join(dict.fromkeys(STRATEGIES[name].collective for _, _, name in x.layer_kinds())),
        notes=unpriced_memory_notes(x),
        memory_margin=memory_margins[0],
        memory_overprice=memory_margins[1],
    )


def unpriced_memory_notes(x: Candidates) -> tuple[str, ...]:
    """What the memory price is known to leave out for these candidates' model, chip and plan."""
    head_dim, lanes = x.model.head_dim, x.topology.chip.kind.lanes
    notes = []
    if head_dim % lanes:
        notes.append(
            f"head_dim {head_dim} is not a multiple of the TPU's {lanes} lanes: the attention's values in splash's "
            f"layout are priced lane-padded ({lane_ratio(x):.3g}× their bytes), but the kept values a compiler lays "
            f"out with the head minor-most are not (some v5p layouts keep q and the output so), and a ring of two "
            f'held up to 5.5% more than priced (docs/measurements.md, "Heads narrower than a lane"); compile the '
            f"plan (`cpplan compile`) before trusting its fit"
        )
    if x.one_hot_embedding:
        notes.append(
            "one_hot_embedding: the one-hot lookup's matmuls and masks are priced as time, not its mask's memory "
            "(a byte per token and vocabulary entry, held before the layers and after their backward); compile "
            "the plan (`cpplan compile`) before trusting its fit"
        )
    return tuple(notes)
