"""What every context-parallel strategy shares: the static layout of a step's attention, the
head-folding that feeds splash, and the KV-head replication Ulysses needs."""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from cost_models.errors import CpplanError
from cost_models.strategies.ulysses import replicated_kv_heads
from runtime.splash import KernelConfig


@dataclass(frozen=True)
class AttentionLayout:
    """Static facts about one attention call inside `shard_map`.

    Attributes:
        seq_len: global tokens per sequence.
        ring: size of the 'context' axis (ring / all-gather degree).
        ulysses: size of the 'context_ulysses' axis (all-to-all degree).
        zigzag: tokens are in zigzag order over the ring.
        kernel: splash block sizes and mode.
        causal: the model's mask (`ModelSpec.causal`): causal, or full, where every query sees
            every key and there is no work for zigzag to balance.
    Raises:
        CpplanError: zigzag order under a full mask (`Plan` refuses it too).
    """

    seq_len: int
    ring: int
    ulysses: int
    zigzag: bool
    kernel: KernelConfig
    causal: bool = True

    def __post_init__(self):
        if self.zigzag and not self.causal:
            raise CpplanError("zigzag order balances causal attention; with a full (non-causal) mask every rank does "
                              "the same work, and the ring's hops attend whole blocks: lay tokens out in natural "
                              "order (load_balance='none').")

    @property
    def ring_block(self) -> int:
        """Tokens of one ring rank (a Ulysses group gathers exactly this)."""
        return self.seq_len // self.ring


def fold_heads(x: jax.Array) -> jax.Array:
    """`[batch, seq, heads, d]` → `[batch·heads, seq, d]`: batch folded into splash's head axis.

    With q and k/v folded the same way, query head b·H+j maps to kv head b·K + j//(H/K): grouped
    attention stays correct.
    """
    b, s, h, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b * h, s, d)


def unfold_heads(x: jax.Array, batch: int) -> jax.Array:
    """Inverse of `fold_heads`."""
    bh, s, d = x.shape
    return x.reshape(batch, bh // batch, s, d).transpose(0, 2, 1, 3)


def repeat_kv_for(k: jax.Array, degree: int) -> jax.Array:
    """Replicates kv heads (axis 2) as the Ulysses spec prices it (`replicated_kv_heads`): to the
    least common multiple of their count and the degree."""
    heads = k.shape[2]
    factor = replicated_kv_heads(heads, degree) // heads
    return jnp.repeat(k, factor, axis=2) if factor > 1 else k
