"""USP: Ulysses over `context_ulysses` inside, ring over `context` across.

The all-to-all gathers one ring block (S/ring tokens) per Ulysses group onto head shards; the
ring then passes those blocks around the `context` axis. Costs are the two strategies' sums.
"""

from __future__ import annotations

from cost_models.strategies.base import (
    AxisRule,
    CPCost,
    KernelCall,
    Layout,
    Shape,
    StrategySpec,
    Violation,
    query_values,
)
from cost_models.strategies.registry import register
from cost_models.strategies.ring import ring_calls, ring_cost, ring_merge_bytes, tokamax_ring_calls
from cost_models.strategies.ulysses import (
    all_to_all_cost,
    kept_operand_copies,
    maxtext_ulysses_problems,
    ulysses_heads_rule,
    ulysses_layout,
)
from cost_models.vocabulary import CPStrategy


class USP(StrategySpec):
    strategy = CPStrategy.register("usp", aliases=("hybrid",), rank=4)
    axes = AxisRule(context=True, context_ulysses=True)
    collective = "all-to-all + ring ppermute"
    maxtext_name = "usp"
    maxtext_tokamax_splash = True
    maxtext_ring_kernel = True
    maxtext_global_layers_only = True
    hides_traffic_behind_attention = True

    def heads_rule(self, shape: Shape) -> Violation | None:
        return ulysses_heads_rule(shape)

    def layout(self, x) -> Layout:
        return ulysses_layout(x, x.ring, x.seq_len / x.ring)

    def kernel_calls(self, x, layout: Layout) -> tuple[KernelCall, ...]:
        return self.with_backward(x, ring_calls(x, layout))

    def maxtext_kernel_calls(self, x, layout: Layout) -> tuple[KernelCall, ...]:
        return tokamax_ring_calls(x, layout)

    def merge_bytes(self, x, layout: Layout, calls: tuple[KernelCall, ...]):
        return ring_merge_bytes(x, layout, calls)

    def cost(
        self, x, layout: Layout, attention_fwd_s, attention_bwd_s, *, gradients_all_reduced: bool = False
    ) -> CPCost:
        a2a_fwd, a2a_bwd = all_to_all_cost(x, layout)
        ring = ring_cost(x, layout, attention_fwd_s, attention_bwd_s, layout.kv_heads)
        copies = kept_operand_copies(x)
        return CPCost(
            a2a_fwd + ring.forward_s,
            a2a_bwd + ring.backward_s,
            a2a_fwd + ring.exposed_forward_s,
            a2a_bwd + ring.exposed_backward_s,
            ring.buffer_bytes + copies,
            recompute_reuses_s=a2a_fwd,
            recompute_shared_hops_s=ring.recompute_shared_hops_s,
            kv_in_working_set=ring.kv_in_working_set,
            beside_kv_excess=ring.beside_kv_excess,
            operand_copies_bytes=copies,
            relaid_output_bytes=query_values(x, layout) * x.act_bytes,
        )

    def describe(self, ring: int, ulysses: int, zigzag: bool) -> str:
        return f"usp: ulysses {ulysses} inside × ring {ring} across{', zigzag' if zigzag else ''}"

    def maxtext_degrees(self, ring: int, ulysses: int) -> tuple[int, int]:
        return ring, ulysses

    def from_maxtext_degrees(self, context: int, usp_ulysses: int) -> tuple[int, int]:
        return context, usp_ulysses

    def maxtext_problems(self, shape: Shape) -> list[str]:
        """MaxText 0.2.5's USP rules (configs/types.py): the Ulysses head rules, the sequence divisible
        by ring², and load balancing only over an even ring degree (which it accepts)."""
        problems = maxtext_ulysses_problems(shape)
        if shape.seq_len % (shape.ring * shape.ring):
            problems.append(
                f"MaxText's usp needs max_target_length={shape.seq_len} divisible by context²={shape.ring * shape.ring}"
            )
        if shape.zigzag and shape.ring % 2:
            problems.append(
                f"MaxText's usp balances load only over an even ring degree, not context={shape.ring}; "
                f"plan with load_balance='none' or an even context"
            )
        return problems


register(USP())
