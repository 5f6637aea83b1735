"""One spec per context-parallel strategy (see `base.StrategySpec`), one module each.

Each says which mesh axes it needs and whether it runs a case (and why not), how the attention
kernel lies on a device and which splash calls it makes, what its own communication costs per
layer and how much of it hides behind attention, how to describe it, and what it is in MaxText.
`cost_models.pricing` prices the rest, the same for all; the runtime makes the calls listed.
"""

from __future__ import annotations

import importlib
import pkgutil

from cost_models.strategies.base import CPCost, KernelCall, Layout, Shape, StrategySpec, Violation
from cost_models.strategies.registry import STRATEGIES, register
from cost_models.vocabulary import CPStrategy

# every module of this package but the shared ones holds a spec, which registers itself
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "registry"):
        importlib.import_module(f"{__name__}.{_module.name}")


def strategies_for(ring: int, ulysses: int) -> tuple[CPStrategy, ...]:
    """The strategies whose mesh rule accepts these context degrees."""
    return tuple(s for s, spec in STRATEGIES.items() if spec.axes.accepts(ring, ulysses))


__all__ = [
    "CPCost",
    "KernelCall",
    "Layout",
    "STRATEGIES",
    "Shape",
    "StrategySpec",
    "Violation",
    "register",
    "strategies_for",
]
