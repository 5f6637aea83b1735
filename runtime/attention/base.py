"""Shared by every strategy: the static attention layout, head folding for splash, Ulysses' KV replication."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from cost_models.errors import CpplanError
from cost_models.masks import CAUSAL, AttentionMask, hops_needed
from cost_models.strategies.ulysses import replicated_kv_heads
from runtime.splash import KernelConfig


@dataclass(frozen=True)
class AttentionLayout:
    """Static facts about one attention call inside `shard_map`: global `seq_len`, the 'context'
    (`ring`) and 'context_ulysses' (`ulysses`) degrees, zigzag order, splash `kernel`, the layer's mask.

    Raises:
        CpplanError: zigzag order under a full or a local mask (`Plan` refuses both too).
    """

    seq_len: int
    ring: int
    ulysses: int
    zigzag: bool
    kernel: KernelConfig
    mask: AttentionMask = CAUSAL

    def __post_init__(self):
        if self.zigzag and not self.mask.causal:
            raise CpplanError(
                "zigzag order balances causal attention; with a full (non-causal) mask every rank does "
                "the same work, and the ring's hops attend whole blocks: lay tokens out in natural "
                "order (load_balance='none')."
            )
        if self.zigzag and self.mask.local:
            raise CpplanError(
                f"zigzag order under a local mask ({self.mask.describe()}) puts each window's keys on the ranks a "
                f"one-way ring reaches last, and a local layer's work is the same on every rank: lay tokens out "
                f"in natural order (load_balance='none')."
            )

    @property
    def ring_block(self) -> int:
        """Tokens of one ring rank (a Ulysses group gathers exactly this)."""
        return self.seq_len // self.ring

    @property
    def causal(self) -> bool:
        """Whether a query sees no key after it (every mask but the full one)."""
        return self.mask.causal

    @property
    def hops(self) -> int:
        """Ring hops that bring each rank every key its queries see (`cost_models.masks.hops_needed`)."""
        return int(hops_needed(self.mask, self.ring_block, self.ring))


def fold_heads(x: jax.Array) -> jax.Array:
    """`[batch, seq, heads, d]` → `[batch·heads, seq, d]`; folding q and k/v alike keeps GQA's head mapping."""
    b, s, h, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b * h, s, d)


def unfold_heads(x: jax.Array, batch: int) -> jax.Array:
    """Inverse of `fold_heads`."""
    bh, s, d = x.shape
    return x.reshape(batch, bh // batch, s, d).transpose(0, 2, 1, 3)


def repeat_kv_for(k: jax.Array, degree: int) -> jax.Array:
    """Replicates kv heads (axis 2) to `replicated_kv_heads`, as the Ulysses spec prices it."""
    heads = k.shape[2]
    factor = replicated_kv_heads(heads, degree) // heads
    return jnp.repeat(k, factor, axis=2) if factor > 1 else k
