"""DeepSpeed-Ulysses over `context_ulysses`: all-to-all from sequence shards to head shards.

Forward: q, k, v in, output back; backward repeats those four (unless a recomputed forward did),
plus d_out in and dq, dk, dv back; none overlapped. KV heads are replicated to lcm(count, degree),
and that is priced. Evidence: docs/provenance/strategies_and_validation.md#ulysses
"""

from __future__ import annotations

import math

import numpy as np

from cost_models.strategies.base import (
    AxisRule,
    CPCost,
    Layout,
    Shape,
    StrategySpec,
    Violation,
    kv_heads_per_tensor_shard,
    lane_ratio,
)
from cost_models.strategies.registry import register
from cost_models.vocabulary import CPStrategy


def replicated_kv_heads(kv_heads, ulysses):
    """KV heads of one tensor shard after replication: lcm(`kv_heads`, degree), so every device gets
    whole, equal groups. Ints, or arrays of whole numbers."""
    if np.ndim(kv_heads) == 0 and np.ndim(ulysses) == 0:
        return math.lcm(int(kv_heads), int(ulysses))
    return np.lcm(np.asarray(kv_heads, dtype=int), np.asarray(ulysses, dtype=int))


def ulysses_heads_rule(shape: Shape) -> Violation | None:
    """Query heads per tensor shard must split over the Ulysses degree."""
    q_heads = shape.model.num_heads // shape.tensor
    if q_heads % shape.ulysses:
        return Violation(
            "heads",
            f"num_heads/tensor={shape.model.num_heads}/{shape.tensor}={q_heads} not divisible by "
            f"context_ulysses={shape.ulysses}",
        )
    return None


def ulysses_layout(x, ring, seq_len_in_kernel) -> Layout:
    """Heads per device after the all-to-all, over `seq_len_in_kernel` tokens (USP reuses it)."""
    ulysses = np.asarray(x.ulysses, dtype=float)
    per_shard = kv_heads_per_tensor_shard(x.model, x.tensor)
    kv = replicated_kv_heads(per_shard, ulysses) / ulysses
    return Layout(
        x.model.num_heads / (np.asarray(x.tensor, dtype=float) * ulysses),
        kv,
        ring,
        seq_len_in_kernel,
        seq_len_in_kernel,
    )


def all_to_all_cost(x, layout: Layout):
    """(forward, backward) all-to-all time of one layer; the forward's is what a recomputed forward
    saves (`recompute_reuses_s`)."""
    local_tokens = x.sequences_per_device * x.seq_len / (x.ring * x.ulysses)

    def a2a(heads):  # one array of `heads` heads per device after the exchange
        return x.comm.all_to_all(
            local_tokens * heads * x.ulysses * x.model.head_dim * x.act_bytes, x.ulysses, *x.ulysses_link
        )

    q, kv = a2a(layout.q_heads), a2a(layout.kv_heads)
    qkv_in = q + 2 * kv
    forward = qkv_in + q  # q, k, v in; the output back
    backward = forward + q + q + 2 * kv  # q, k, v in and the output back again; d_out in; dq, dk, dv back
    return forward, backward


def kept_operand_copies(x):
    """Bytes per device the all-to-all adds to a layer's peak: it lays the working set's q/K/V/out out
    anew for the kernel, so only the values the policy keeps (counted in the activations, not the
    working set) are held twice, once per layout, the kernel's lane-padded (`lane_ratio`)
    (docs/provenance/strategies_and_validation.md#usp)."""
    return x.tokens_per_device * x.held_remat_columns.kept_attention_operands / x.tensor * x.act_bytes * lane_ratio(x)


def maxtext_ulysses_problems(shape: Shape) -> list[str]:
    """MaxText 0.2.5's all-to-all head rules (configs/types.py): query and KV heads divisible by the
    degree, no MQA; it never replicates KV heads."""
    problems = []
    model = shape.model
    if model.num_heads % shape.ulysses:
        problems.append(
            f"MaxText's Ulysses needs num_heads={model.num_heads} divisible by its degree {shape.ulysses}; "
            f"use a smaller context_ulysses"
        )
    if model.num_kv_heads == 1:
        problems.append("MaxText's Ulysses refuses MQA (num_kv_heads=1); use ring or all_gather")
    elif model.num_kv_heads % shape.ulysses:
        problems.append(
            f"MaxText's Ulysses needs num_kv_heads={model.num_kv_heads} divisible by its degree "
            f"{shape.ulysses} (it does not replicate KV heads); use a smaller context_ulysses"
        )
    return problems


class Ulysses(StrategySpec):
    strategy = CPStrategy.register("ulysses", aliases=("a2a", "all_to_all"), rank=2)
    axes = AxisRule(context=False, context_ulysses=True)
    collective = "all-to-all q/k/v/out"
    balances_load = False
    maxtext_name = "ulysses"
    maxtext_tokamax_splash = True
    maxtext_refuses_load_balance = True
    maxtext_per_head_metadata = True
    maxtext_global_layers_only = True
    maxtext_skips_other_documents = True  # tokamax's splash prunes tiles whose segment ids do not meet

    def heads_rule(self, shape: Shape) -> Violation | None:
        return ulysses_heads_rule(shape)

    def layout(self, x) -> Layout:
        ones = np.ones_like(np.asarray(x.ring, dtype=float))
        return ulysses_layout(x, ones, ones * x.seq_len)

    def cost(
        self, x, layout: Layout, attention_fwd_s, attention_bwd_s, *, gradients_all_reduced: bool = False
    ) -> CPCost:
        fwd, bwd = all_to_all_cost(x, layout)
        copies = kept_operand_copies(x)
        return CPCost(
            fwd, bwd, fwd, bwd, copies, recompute_reuses_s=fwd, reads_own_lse=1.0, buffer_bytes_before_backward=copies
        )

    def describe(self, ring: int, ulysses: int, zigzag: bool) -> str:
        return f"ulysses (all-to-all) over context_ulysses={ulysses}"

    def maxtext_degrees(self, ring: int, ulysses: int) -> tuple[int, int]:
        return ulysses, 1  # MaxText's Ulysses degree is its ici_context_parallelism

    def from_maxtext_degrees(self, context: int, usp_ulysses: int) -> tuple[int, int]:
        return 1, context

    def maxtext_problems(self, shape: Shape) -> list[str]:
        problems = maxtext_ulysses_problems(shape)
        if shape.zigzag:
            problems.append(
                "MaxText's ulysses requires context_parallel_load_balance=False (after the all-to-all "
                "each device attends over the whole sequence); plan with load_balance='none'"
            )
        return problems


register(Ulysses())
