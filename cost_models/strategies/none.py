"""No context parallelism: each device's kernel sees whole sequences; no traffic of its own."""

from __future__ import annotations

import numpy as np

from cost_models.strategies.base import AxisRule, CPCost, Layout, Shape, StrategySpec, Violation, tensor_shard_heads
from cost_models.strategies.registry import register
from cost_models.vocabulary import CPStrategy


class NoContext(StrategySpec):
    strategy = CPStrategy.register("none", rank=0)
    axes = AxisRule(context=False, context_ulysses=False)
    collective = "none"
    balances_load = False
    # MaxText has no "none": all-gather over a context axis of 1 gathers nothing
    maxtext_name = "all_gather"

    def load_balance_check(self, shape: Shape) -> Violation | None:
        if shape.zigzag:
            return Violation("load balance", "zigzag balances work across context ranks; with context=1 there are none")
        return None

    def layout(self, x) -> Layout:
        s = np.full_like(np.asarray(x.ring, dtype=float), x.seq_len)
        return Layout(*tensor_shard_heads(x), np.ones_like(s), s, s)

    def cost(
        self, x, layout: Layout, attention_fwd_s, attention_bwd_s, *, gradients_all_reduced: bool = False
    ) -> CPCost:
        zero = np.zeros_like(attention_fwd_s)
        return CPCost(zero, zero, zero, zero, zero, reads_own_lse=1.0)

    def describe(self, ring: int, ulysses: int, zigzag: bool) -> str:
        return "no context parallelism"


register(NoContext())
