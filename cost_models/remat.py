"""What each remat policy keeps and recomputes, per decoder layer (MaxText's checkpoint names).

- full: keeps the layer input; recomputes every forward matmul and the attention.
- save_dot_except_mlp: keeps the q/k/v projections and out_proj; recomputes attention and the MLP.
- minimal_with_context: keeps all matmul outputs and the attention output; recomputes only
  elementwise work.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.models import ModelSpec
from cost_models.vocabulary import RematPolicy

POLICIES = tuple(RematPolicy)


@dataclass(frozen=True)
class RematCost:
    """Per-layer figures of one policy (numpy arrays indexed by policy code)."""

    saved_full_width: np.ndarray  # values kept per token per layer that every tensor shard holds whole
    saved_split: np.ndarray  # values kept per token per layer that 'tensor' splits (heads, MLP columns)
    recompute_qkv_out: np.ndarray  # fraction of the q/k/v and out projections recomputed
    recompute_mlp: np.ndarray  # fraction of the MLP matmuls recomputed
    recompute_attention: np.ndarray  # forward attention passes recomputed
    recompute_tensor_collectives: np.ndarray  # tensor-parallel gathers/scatters repeated (of 4)


def remat_table(model: ModelSpec) -> RematCost:
    d, f = model.hidden, model.intermediate
    qkv = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim
    context = model.num_heads * model.head_dim
    saved = {  # (full width: layer input, out_proj, mlpwo; split over tensor: q/k/v, MLP inputs, context)
        RematPolicy.FULL: (d, 0),
        RematPolicy.SAVE_DOT_EXCEPT_MLP: (d + d, qkv),
        RematPolicy.MINIMAL_WITH_CONTEXT: (d + d + d, qkv + 2 * f + context),
    }
    recompute = {  # (qkv/out, mlp, attention, tensor collectives)
        RematPolicy.FULL: (1, 1, 1, 4),
        RematPolicy.SAVE_DOT_EXCEPT_MLP: (0, 1, 1, 2),
        RematPolicy.MINIMAL_WITH_CONTEXT: (0, 0, 0, 0),
    }
    rows = np.array([recompute[p] for p in POLICIES], dtype=float)
    kept = np.array([saved[p] for p in POLICIES], dtype=float)
    return RematCost(kept[:, 0], kept[:, 1], rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3])


def remat_code(policy: RematPolicy) -> int:
    return POLICIES.index(policy)
