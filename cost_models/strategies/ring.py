"""Ring attention over `context`: K/V blocks travel N−1 hops by ppermute, each hidden behind the
block in hand's attention when that takes longer. Backward sends K/V and fp32 dK/dV around again, plus
one hop home; a recomputed forward's hops are reused. Holds two blocks, never the full length.
Evidence: docs/provenance/strategies_and_validation.md#ring
"""

from __future__ import annotations

import numpy as np

from cost_models.masks import AttentionMask, hops_needed
from cost_models.strategies.base import (
    AxisRule,
    CPCost,
    KernelCall,
    Layout,
    Shape,
    StrategySpec,
    laid_out_values,
    lane_ratio,
    tensor_shard_heads,
)
from cost_models.strategies.registry import register
from cost_models.vocabulary import CPStrategy

GRAD_BYTES = 4  # dK/dV accumulate in fp32


def ring_calls(x, layout: Layout) -> tuple[KernelCall, ...]:
    """A call over the local block, then one per hop (USP reuses it).

    Zigzag: half the hops attend all queries to the source's first chunk, half the second query
    chunk to the whole source. Without it only earlier ranks' hops compute (all on the last rank,
    half on average, as shared cores pay). Under a full mask every hop is whole.
    """
    length, hops = layout.q_len, layout.ring - 1
    if x.attention_mask.local:
        return local_ring_calls(x.attention_mask, layout)
    if not x.model.causal:
        return (KernelCall(1.0, length, length, causal=False), KernelCall(hops, length, length, causal=False))
    plain_hops = np.where(x.shared_cores, hops / 2, hops)
    return (
        KernelCall(1.0, length, length),
        KernelCall(
            np.where(x.zigzag, hops / 2, plain_hops), length, np.where(x.zigzag, length / 2, length), causal=False
        ),
        KernelCall(np.where(x.zigzag, hops / 2, 0.0), length / 2, length, causal=False),
    )


def local_ring_calls(mask: AttentionMask, layout: Layout) -> tuple[KernelCall, ...]:
    """Under a local mask (natural order), the last rank's calls: its own block, then one per hop the
    mask reaches (`hops_needed`; a hop past a candidate's reach has count 0 there)."""
    length, ring = layout.q_len, np.asarray(layout.ring, dtype=float)
    hops = hops_needed(mask, length, ring)
    last = (ring - 1) * length
    calls = [KernelCall(1.0, length, length, mask=mask, q_start=last, kv_start=last)]
    for hop in range(1, int(np.max(hops, initial=0)) + 1):
        calls.append(
            KernelCall(
                (hops >= hop).astype(float), length, length, mask=mask, q_start=last, kv_start=last - hop * length
            )
        )
    return tuple(calls)


def tokamax_ring_calls(x, layout: Layout) -> tuple[KernelCall, ...]:
    """MaxText's ring (tokamax's kernel): every call spans the whole local grid, so zigzag hops visit
    the blocks they skip; backward is splash's fused kernel."""
    hops = layout.ring - 1
    return (
        KernelCall(1.0, layout.q_len, layout.kv_len, causal=x.model.causal, fused_backward=True),
        KernelCall(hops, layout.q_len, layout.kv_len, causal=False, fused_backward=True),
    )


def ring_merge_bytes(x, layout: Layout, calls: tuple[KernelCall, ...]):
    """HBM bytes per layer of merging each call after the first outside the kernel (as both runtimes
    do): forward, fp32 output read+written and the call's output read; backward, the fp32 dq and
    dK/dV accumulators each read and written."""
    merges = sum(np.asarray(c.count, dtype=float) for c in calls) - 1
    q_values, kv_values = laid_out_values(x, layout)
    forward = merges * q_values * (2 * GRAD_BYTES + x.act_bytes)
    backward = merges * 3 * GRAD_BYTES * (q_values + 2 * kv_values)
    return forward, backward


def zigzag_hop_excess(x, layout: Layout):
    """Bytes per device a backward hop under zigzag holds beyond the ring's buffers (whose dq is a whole
    block's): the later sources' hops slice q's and the output gradient's second halves out anew and form
    half a dq beside the hop's dK/dV, where a later hop forms its fp32 sums instead, the larger of the two
    (docs/provenance/strategies_and_validation.md#usp, #ring)."""
    q_values, kv_values = laid_out_values(x, layout)
    later_hop = hops_needed(x.attention_mask, x.seq_len / layout.ring, layout.ring) > 1
    hop_own = (q_values / 2 + 2 * kv_values) * x.act_bytes
    return x.zigzag * np.maximum(hop_own - later_hop * 2 * kv_values * GRAD_BYTES, 0.0)


def ring_cost(x, layout: Layout, attention_fwd_s, attention_bwd_s, heads_in_kernel_kv) -> CPCost:
    """Ring traffic for blocks of S/ring tokens with `heads_in_kernel_kv` KV heads (USP reuses it)."""
    r = layout.ring
    block_tokens = x.sequences_per_device * x.seq_len / r
    kv_block = 2 * block_tokens * heads_in_kernel_kv * x.model.head_dim * x.act_bytes
    hop_fwd = x.comm.ppermute(kv_block, *x.ring_link)
    hop_bwd = x.comm.ppermute(kv_block * (1 + GRAD_BYTES / x.act_bytes), *x.ring_link)
    # a local mask's hops stop at its reach, and dK/dV come back over as many links; the whole ring's
    # come home in one more hop
    mask = x.attention_mask
    hops = hops_needed(mask, x.seq_len / r, r)
    compute_per_hop_fwd = attention_fwd_s / (hops + 1)
    compute_per_hop_bwd = attention_bwd_s / (hops + 1)
    grads_home = (hops if mask.local else np.minimum(hops, 1)) * x.comm.ppermute(kv_block, *x.ring_link)
    fwd = hops * hop_fwd
    bwd = hops * hop_bwd + grads_home
    exposed_fwd = hops * np.maximum(0.0, hop_fwd - compute_per_hop_fwd)
    exposed_bwd = hops * np.maximum(0.0, hop_bwd - compute_per_hop_bwd) + grads_home
    q_block = block_tokens * layout.q_heads * x.model.head_dim
    # what a hop of the backward holds beyond the working set (whose gradients of q, K, V are the hop's
    # own): dq's fp32 sum and the one being formed, the next hop's K/V and dK/dV's fp32 sums arriving,
    # and while a later hop follows, the sums being formed; a mask that needs no hop holds none of
    # them (docs/provenance/strategies_and_validation.md#ring). Those in flight are not lane-padded.
    in_flight = kv_block * (1 + GRAD_BYTES / x.act_bytes)
    forming = lane_ratio(x) * (q_block * 2 * GRAD_BYTES + (hops > 1) * kv_block * GRAD_BYTES / x.act_bytes)
    buffers = (hops > 0) * (in_flight + forming)
    return CPCost(
        fwd,
        bwd,
        exposed_fwd,
        exposed_bwd,
        buffers,
        recompute_shared_hops_s=fwd,
        kv_in_working_set=(hops == 0) * 1.0,
        beside_kv_excess=zigzag_hop_excess(x, layout),
    )


class Ring(StrategySpec):
    strategy = CPStrategy.register("ring", aliases=("p2p",), rank=3)
    axes = AxisRule(context=True, context_ulysses=False)
    collective = "ring ppermute K/V"
    maxtext_name = "ring"
    maxtext_tokamax_splash = True
    maxtext_ring_kernel = True
    maxtext_global_layers_only = True
    hides_traffic_behind_attention = True

    def layout(self, x) -> Layout:
        ring = np.asarray(x.ring, dtype=float)
        block = x.seq_len / ring
        return Layout(*tensor_shard_heads(x), ring, block, block)

    def kernel_calls(self, x, layout: Layout) -> tuple[KernelCall, ...]:
        return self.with_backward(x, ring_calls(x, layout))

    def maxtext_kernel_calls(self, x, layout: Layout) -> tuple[KernelCall, ...]:
        return tokamax_ring_calls(x, layout)

    def merge_bytes(self, x, layout: Layout, calls: tuple[KernelCall, ...]):
        return ring_merge_bytes(x, layout, calls)

    def cost(
        self, x, layout: Layout, attention_fwd_s, attention_bwd_s, *, gradients_all_reduced: bool = False
    ) -> CPCost:
        return ring_cost(x, layout, attention_fwd_s, attention_bwd_s, layout.kv_heads)

    def describe(self, ring: int, ulysses: int, zigzag: bool) -> str:
        return f"ring over context={ring}{', zigzag' if zigzag else ''}"

    def maxtext_problems(self, shape: Shape) -> list[str]:
        problems = []
        if shape.seq_len % (shape.ring * shape.ring):
            problems.append(
                f"MaxText's ring needs max_target_length={shape.seq_len} divisible by "
                f"context²={shape.ring * shape.ring}"
            )
        if shape.zigzag and shape.ring % 2:
            problems.append(f"MaxText's load balancing needs an even context degree, not {shape.ring}")
        return problems


register(Ring())
