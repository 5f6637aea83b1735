"""Where tokens live: the zigzag load-balanced token order and the shard_map specs of a plan.

Zigzag over a ring of N ranks cuts the sequence into 2N chunks; rank i holds chunks i and
2N−1−i, so every rank does the same causal work. The permutation is applied once, to the input
tokens, targets and RoPE positions; attention then works on the permuted order and the loss,
a sum over tokens, does not care. The sequence is split over ('context', 'context_ulysses'):
the ring index outer, the Ulysses index inner, so a Ulysses group holds one ring block.
"""
from __future__ import annotations

import numpy as np
from jax.sharding import PartitionSpec as P

from cost_models.vocabulary import BATCH_AXES, SEQUENCE_AXES, WEIGHT_SHARDING_AXES

TOKENS = P(BATCH_AXES, SEQUENCE_AXES)  # [batch, seq]
ACTIVATIONS = P(BATCH_AXES, SEQUENCE_AXES, None)  # [batch, seq, embed]
HEADS = P(BATCH_AXES, SEQUENCE_AXES, "tensor", None)  # [batch, seq, heads, head_dim]
WEIGHT_AXES = WEIGHT_SHARDING_AXES


def zigzag_order(seq_len: int, ring: int) -> np.ndarray:
    """The natural positions in load-balanced order: `balanced = natural[order]`.

    Args:
        seq_len: tokens per sequence (a multiple of 2·ring).
        ring: ring degree N; with N = 1 the order is the identity.
    Returns:
        int array of length seq_len.
    """
    chunks = np.arange(seq_len).reshape(2 * ring, seq_len // (2 * ring))
    slots = [c for i in range(ring) for c in (i, 2 * ring - 1 - i)]
    return chunks[slots].reshape(-1)


def natural_chunk_slots(ring: int) -> np.ndarray:
    """For each natural chunk m of a zigzag sequence (2·ring chunks), the chunk slot holding it."""
    slots = np.empty(2 * ring, dtype=np.int64)
    for i in range(ring):
        slots[i], slots[2 * ring - 1 - i] = 2 * i, 2 * i + 1
    return slots


def token_order(seq_len: int, ring: int, zigzag: bool) -> np.ndarray:
    """The natural position of every token slot of the sequence as the runtime lays it out."""
    return zigzag_order(seq_len, ring) if zigzag else np.arange(seq_len)
