"""Where tokens live: the zigzag token order and the shard_map specs of a plan. Zigzag gives rank i of
N chunks i and 2N−1−i of 2N, so every rank does the same causal work; it permutes the inputs, targets
and positions once. The sequence splits over ('context', 'context_ulysses'), the ring index outer.
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
    """The natural positions in load-balanced order, `balanced = natural[order]`, for `seq_len` a
    multiple of 2·`ring` (the identity when `ring` is 1)."""
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
