"""The registered strategy specs: a spec module registers its spec, and every list of strategies
(the search, the CLI, the MaxText import and export, the runtime) is read from here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cost_models.vocabulary import CPStrategy

if TYPE_CHECKING:
    from cost_models.strategies.base import StrategySpec

STRATEGIES: dict[CPStrategy, "StrategySpec"] = {}


def register(spec: "StrategySpec") -> "StrategySpec":
    """Makes `spec` the spec of its strategy (`spec.strategy`, from `CPStrategy.register`); the
    registry stays in the strategies' rank order."""
    STRATEGIES[spec.strategy] = spec
    ordered = sorted(STRATEGIES.items(), key=lambda item: item[0].rank)
    STRATEGIES.clear()
    STRATEGIES.update(ordered)
    return spec
