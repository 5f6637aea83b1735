"""One module per context-parallel strategy, one protocol.

Each strategy says whether it supports a case (and why not), how the attention kernel is laid
out on a device (heads, how many ways the sequence is split for attention, kernel extents),
and what its own communication costs per layer, with how much of it is hidden behind the
attention compute. `cost_models.estimate` does the rest, the same for all.
"""
from __future__ import annotations

from cost_models.strategies.base import CPCost, Layout, Shape, Strategy, Violation
from cost_models.strategies.all_gather import AllGather
from cost_models.strategies.none import NoContext
from cost_models.strategies.ring import Ring
from cost_models.strategies.ulysses import Ulysses
from cost_models.strategies.usp import USP
from cost_models.vocabulary import CPStrategy

STRATEGIES: dict[CPStrategy, Strategy] = {s.strategy: s for s in (NoContext(), AllGather(), Ulysses(), Ring(), USP())}

__all__ = ["CPCost", "Layout", "STRATEGIES", "Shape", "Strategy", "Violation"]
