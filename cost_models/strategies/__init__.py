"""One spec per context-parallel strategy (see `base.StrategySpec`).

Each says which mesh axes it needs and whether it runs a case (and why not), how the attention
kernel lies on a device and which splash calls it makes, what its own communication costs per
layer and how much of it hides behind attention, how to describe it, and what it is in MaxText.
`cost_models.pricing` prices the rest, the same for all; the runtime makes the calls listed.
"""
from __future__ import annotations

from cost_models.strategies.all_gather import AllGather
from cost_models.strategies.base import CPCost, KernelCall, Layout, Shape, StrategySpec, Violation
from cost_models.strategies.none import NoContext
from cost_models.strategies.ring import Ring
from cost_models.strategies.ulysses import Ulysses
from cost_models.strategies.usp import USP
from cost_models.vocabulary import CPStrategy

STRATEGIES: dict[CPStrategy, StrategySpec] = {s.strategy: s for s in (NoContext(), AllGather(), Ulysses(), Ring(),
                                                                          USP())}


def strategies_for(ring: int, ulysses: int) -> tuple[CPStrategy, ...]:
    """The strategies whose mesh rule accepts these context degrees."""
    return tuple(s for s, spec in STRATEGIES.items() if spec.axes.accepts(ring, ulysses))


__all__ = ["CPCost", "KernelCall", "Layout", "STRATEGIES", "Shape", "StrategySpec", "Violation", "strategies_for"]
