"""All-gather K/V over `context`: every device gets the full-length keys and values.

Forward: one all-gather of K and V per layer; backward: the gather again (unless a recomputed
forward just made it) plus a reduce-scatter of dK and dV. Not overlapped with compute. Holds
full-length K, V and their gradients (in the compute dtype, as splash returns them). One splash
call per device: its local queries (at their global positions) against all keys, causal unless
the model's mask is full.
"""

from __future__ import annotations

import numpy as np

from cost_models.strategies.base import (
    AxisRule,
    CPCost,
    KernelCall,
    Layout,
    Shape,
    StrategySpec,
    lane_ratio,
    tensor_shard_heads,
)
from cost_models.strategies.registry import register
from cost_models.vocabulary import CPStrategy


class AllGather(StrategySpec):
    strategy = CPStrategy.register("all_gather", aliases=("allgather", "ag"), rank=1)
    axes = AxisRule(context=True, context_ulysses=False)
    collective = "all-gather K/V"
    maxtext_name = "all_gather"

    def layout(self, x) -> Layout:
        ring = np.asarray(x.ring, dtype=float)
        return Layout(*tensor_shard_heads(x), ring, x.seq_len / ring, np.full_like(ring, x.seq_len))

    def kernel_calls(self, x, layout: Layout) -> tuple[KernelCall, ...]:
        """One call of the local queries against the gathered keys, causal as the model's mask is;
        under zigzag a query block must stay inside one of the rank's two chunks. Under a local mask, the
        last rank's (in natural order: every rank past the first does the same work)."""
        mask = x.attention_mask
        if mask.local:
            call = KernelCall(1.0, layout.q_len, layout.kv_len, mask=mask, q_start=layout.kv_len - layout.q_len)
            return self.with_backward(x, (call,))
        cap = np.where(x.zigzag, layout.q_len / 2, np.inf)
        call = KernelCall(1.0, layout.q_len, layout.kv_len, causal=x.model.causal, q_block_cap=cap)
        return self.with_backward(x, (call,))

    def gathered_kv_bytes(self, x, layout: Layout):
        return 2 * x.sequences_per_device * x.seq_len * layout.kv_heads * x.model.head_dim * x.act_bytes

    def cost(
        self, x, layout: Layout, attention_fwd_s, attention_bwd_s, *, gradients_all_reduced: bool = False
    ) -> CPCost:
        kv_full = self.gathered_kv_bytes(x, layout)
        gather = x.comm.all_gather(kv_full, x.ring, *x.context_link)
        scatter = (2 if gradients_all_reduced else 1) * x.comm.reduce_scatter(kv_full, x.ring, *x.context_link)
        bwd = gather + scatter
        # the gathered K/V, then their gradients before the scatter, in the kernel's layout
        held = kv_full * lane_ratio(x)
        return CPCost(
            gather,
            bwd,
            gather,
            bwd,
            2 * held,
            recompute_reuses_s=gather,
            reads_own_lse=1.0,
            buffer_bytes_before_backward=held,
            kv_in_working_set=0.0,
            held_through_mlp_backward=held,
        )

    def describe(self, ring: int, ulysses: int, zigzag: bool) -> str:
        return f"all-gather K/V over context={ring}{', zigzag' if zigzag else ''}"

    def maxtext_problems(self, shape: Shape) -> list[str]:
        if shape.zigzag and shape.ring % 2:
            return [f"MaxText's load balancing needs an even context degree, not {shape.ring}"]
        return []


register(AllGather())
