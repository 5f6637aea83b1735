"""No context parallelism: each device's kernel sees whole sequences; no traffic of its own."""
from __future__ import annotations

import numpy as np

from cost_models.strategies.base import (CPCost, KernelCall, Layout, Shape, Violation, degree_check, heads_check,
                                         kv_heads_per_tensor_shard, one_call, sequence_check)
from cost_models.vocabulary import CPStrategy


class NoContext:
    strategy = CPStrategy.NONE
    collective = "none"

    def check(self, shape: Shape) -> Violation | None:
        if shape.zigzag:
            return Violation("load balance", "zigzag balances work across context ranks; with context=1 there are none")
        return (degree_check(shape, "no context parallelism", lambda r: r == 1, lambda u: u == 1,
                             "context = context_ulysses = 1")
                or heads_check(shape) or sequence_check(shape, 1, ""))

    def layout(self, x) -> Layout:
        s = np.full_like(x.ring, x.seq_len, dtype=float)
        return Layout(x.model.num_heads / x.tensor, kv_heads_per_tensor_shard(x.model, x.tensor), np.ones_like(s), s, s)

    def kernel_calls(self, x, layout: Layout) -> tuple[KernelCall, ...]:
        return one_call(x, layout)

    def cost(self, x, layout: Layout, attention_fwd_s) -> CPCost:
        zero = np.zeros_like(attention_fwd_s)
        return CPCost(zero, zero, zero, zero, zero)
