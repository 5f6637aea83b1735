"""USP: Ulysses over `context_ulysses` inside, ring over `context` across.

The all-to-all gathers one ring block (S/ring tokens) per Ulysses group onto head shards; the
ring then passes those blocks around the `context` axis. Costs are the two strategies' sums.
"""
from __future__ import annotations

from cost_models.strategies.base import AxisRule, CPCost, KernelCall, Layout, Shape, StrategySpec, Violation
from cost_models.strategies.ring import ring_calls, ring_cost
from cost_models.strategies.ulysses import all_to_all_cost, maxtext_ulysses_problems, ulysses_heads_rule, ulysses_layout
from cost_models.vocabulary import CPStrategy


class USP(StrategySpec):
    strategy = CPStrategy.USP
    axes = AxisRule(context=True, context_ulysses=True)
    collective = "all-to-all + ring ppermute"
    maxtext_name = CPStrategy.USP.value
    maxtext_tokamax_splash = True
    hides_traffic_behind_attention = True
    maxtext_refuses_load_balance = True

    def heads_rule(self, shape: Shape) -> Violation | None:
        return ulysses_heads_rule(shape)

    def layout(self, x) -> Layout:
        return ulysses_layout(x, x.ring, x.seq_len / x.ring)

    def kernel_calls(self, x, layout: Layout) -> tuple[KernelCall, ...]:
        return ring_calls(x, layout)

    def cost(self, x, layout: Layout, attention_fwd_s) -> CPCost:
        a2a_fwd, a2a_bwd, reuse = all_to_all_cost(x, layout)
        ring = ring_cost(x, layout, attention_fwd_s, layout.kv_heads)
        block = x.sequences_per_device * x.seq_len / x.ring * (2 * layout.q_heads + 2 * layout.kv_heads) \
            * x.model.head_dim * x.act_bytes
        return CPCost(a2a_fwd + ring.forward_s, a2a_bwd + ring.backward_s,
                      a2a_fwd + ring.exposed_forward_s, a2a_bwd + ring.exposed_backward_s,
                      ring.buffer_bytes + 2 * block,
                      recompute_reuses_s=reuse + ring.recompute_reuses_s)

    def describe(self, ring: int, ulysses: int, zigzag: bool) -> str:
        return f"usp: ulysses {ulysses} inside × ring {ring} across{', zigzag' if zigzag else ''}"

    def maxtext_degrees(self, ring: int, ulysses: int) -> tuple[int, int]:
        return ring, ulysses

    def from_maxtext_degrees(self, context: int, usp_ulysses: int) -> tuple[int, int]:
        return context, usp_ulysses

    def maxtext_problems(self, shape: Shape) -> list[str]:
        return maxtext_ulysses_problems(shape)
