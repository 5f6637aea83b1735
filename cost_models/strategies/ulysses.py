"""DeepSpeed-Ulysses over `context_ulysses`: all-to-all from sequence shards to head shards.

Four all-to-alls forward (q, k, v in; the output back); backward: q, k, v in again (unless a
recomputed forward just did it), d_out in, dq, dk, dv back. None overlapped.
With fewer KV heads per tensor shard than the Ulysses degree, KV heads are replicated up to it.
Each device then runs the kernel over the whole sequence (or ring block, for USP) for its heads.
"""
from __future__ import annotations

import numpy as np

from cost_models.strategies.base import (CPCost, KernelCall, Layout, Shape, Violation, degree_check, heads_check,
                                         kv_heads_per_tensor_shard, one_call, sequence_check)
from cost_models.vocabulary import CPStrategy


def ulysses_check(shape: Shape) -> Violation | None:
    """Query heads per tensor shard must split over the Ulysses degree; KV heads must replicate evenly."""
    q_heads = shape.model.num_heads // shape.tensor
    if q_heads % shape.ulysses:
        return Violation("heads", f"num_heads/tensor={shape.model.num_heads}/{shape.tensor}={q_heads} not divisible by "
                                  f"context_ulysses={shape.ulysses}")
    kv = max(shape.model.num_kv_heads // shape.tensor, 1)
    if kv % shape.ulysses and shape.ulysses % kv:
        return Violation("heads", f"num_kv_heads per tensor shard={kv} and context_ulysses={shape.ulysses}: "
                                  "neither divides the other")
    return None


def ulysses_layout(x, ring, seq_len_in_kernel) -> Layout:
    kv = np.maximum(kv_heads_per_tensor_shard(x.model, x.tensor), x.ulysses) / x.ulysses
    return Layout(x.model.num_heads / (x.tensor * x.ulysses), kv, ring, seq_len_in_kernel, seq_len_in_kernel)


def all_to_all_cost(x, layout: Layout):
    """(forward, backward, backward a recompute makes unnecessary) all-to-all time of one layer."""
    local_tokens = x.sequences_per_device * x.seq_len / (x.ring * x.ulysses)

    def a2a(heads):  # one array of `heads` heads per device after the exchange
        return x.comm.all_to_all(local_tokens * heads * x.ulysses * x.model.head_dim * x.act_bytes,
                                      x.ulysses, *x.ulysses_link)

    q, kv = a2a(layout.q_heads), a2a(layout.kv_heads)
    qkv_in = q + 2 * kv
    forward = qkv_in + q  # q, k, v in; the output back
    backward = qkv_in + q + q + 2 * kv  # q, k, v in again; d_out in; dq, dk, dv back
    return forward, backward, qkv_in


class Ulysses:
    strategy = CPStrategy.ULYSSES
    collective = "all-to-all q/k/v/out"

    def check(self, shape: Shape) -> Violation | None:
        if shape.zigzag:
            return Violation("load balance", "zigzag does nothing for ulysses: each device attends over the whole sequence")
        return (degree_check(shape, "ulysses", lambda r: r == 1, lambda u: u > 1, "context_ulysses > 1 and context = 1")
                or heads_check(shape) or ulysses_check(shape) or sequence_check(shape, shape.ulysses, "Ulysses ranks"))

    def layout(self, x) -> Layout:
        return ulysses_layout(x, np.ones_like(x.ring), np.full_like(x.ring, x.seq_len, dtype=float))

    def kernel_calls(self, x, layout: Layout) -> tuple[KernelCall, ...]:
        return one_call(x, layout)

    def cost(self, x, layout: Layout, attention_fwd_s) -> CPCost:
        fwd, bwd, reuse = all_to_all_cost(x, layout)
        full = x.sequences_per_device * x.seq_len * (2 * layout.q_heads + 2 * layout.kv_heads) * x.model.head_dim * x.act_bytes
        # q, k, v, out at full length, and their gradients
        return CPCost(fwd, bwd, fwd, bwd, 2 * full, recompute_reuses_s=reuse)
