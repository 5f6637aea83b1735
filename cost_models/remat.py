"""What each remat policy keeps for the backward pass, by MaxText's checkpoint names: the one
table from which both the price (bytes kept, work recomputed) and the runtime's jax checkpoint
policy are derived.

A decoder layer names eight intermediate values (`CHECKPOINTS`); a policy keeps some of them
(`KEPT`) and recomputes the rest from the layer input, which every policy keeps:

- full: keeps the layer input only; recomputes every forward matmul and the attention.
- save_dot_except_mlp: keeps the q/k/v and out projections; recomputes attention and the MLP.
- minimal_with_context: keeps every matmul output and the attention output ("context");
  recomputes only elementwise work.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from cost_models.models import ModelSpec
from cost_models.vocabulary import RematPolicy

POLICIES = tuple(RematPolicy)

# The attention output's name. Splash's own residuals (its output and log-sum-exp) and the ring's
# go by it too, so a policy that keeps "context" does not run the attention forward again.
ATTENTION_OUTPUT = "context"


class Block(str, Enum):
    """The sub-block of a decoder layer a checkpoint belongs to; recomputing any value of a
    block's matmuls recomputes that block's matmuls (the MLP's but its output projection)."""

    ATTENTION_PROJECTIONS = "attention projections"
    ATTENTION = "attention"
    MLP = "mlp"


@dataclass(frozen=True)
class Checkpoint:
    """One named value of a decoder layer: its block and how wide it is per token.

    `split_over_tensor`: the `tensor` axis splits it (heads, MLP columns); otherwise every tensor
    shard holds it whole.
    """

    name: str
    block: Block
    split_over_tensor: bool

    def width(self, model: ModelSpec) -> int:
        """Values per token of this checkpoint, before any tensor split."""
        kv = model.num_kv_heads * model.head_dim
        return {"query_proj": model.num_heads * model.head_dim, "key_proj": kv, "value_proj": kv,
                "out_proj": model.hidden, "mlpwi_0": model.intermediate, "mlpwi_1": model.intermediate,
                "mlpwo": model.hidden, ATTENTION_OUTPUT: model.num_heads * model.head_dim}[self.name]


CHECKPOINTS = (
    Checkpoint("query_proj", Block.ATTENTION_PROJECTIONS, True),
    Checkpoint("key_proj", Block.ATTENTION_PROJECTIONS, True),
    Checkpoint("value_proj", Block.ATTENTION_PROJECTIONS, True),
    Checkpoint("out_proj", Block.ATTENTION_PROJECTIONS, False),
    Checkpoint(ATTENTION_OUTPUT, Block.ATTENTION, True),
    Checkpoint("mlpwi_0", Block.MLP, True),
    Checkpoint("mlpwi_1", Block.MLP, True),
    Checkpoint("mlpwo", Block.MLP, False),
)
_BY_NAME = {c.name: c for c in CHECKPOINTS}
_ATTENTION_PROJECTIONS = tuple(c.name for c in CHECKPOINTS if c.block is Block.ATTENTION_PROJECTIONS)
_MLP = tuple(c.name for c in CHECKPOINTS if c.block is Block.MLP)

KEPT: dict[RematPolicy, tuple[str, ...]] = {
    RematPolicy.FULL: (),
    RematPolicy.SAVE_DOT_EXCEPT_MLP: _ATTENTION_PROJECTIONS,
    RematPolicy.MINIMAL_WITH_CONTEXT: _ATTENTION_PROJECTIONS + _MLP + (ATTENTION_OUTPUT,),
}
TENSOR_COLLECTIVES_PER_MATMUL_BLOCK = 2  # a gather before its first matmul, a scatter after its last
# Recomputing the MLP re-runs its two input projections, not its output projection: that output
# feeds only the residual sum, whose backward does not need it, so XLA drops its recomputation
# (read from the compiled step's matmuls; docs/measurements.md). Its three matrices are equal.
# Nor is its tensor-parallel sum (after the output projection) repeated: only a recomputed
# attention block repeats one, its output projection's, which the MLP's input needs.
MLP_RECOMPUTED_FRACTION = 2 / 3


def kept_names(policy: RematPolicy) -> tuple[str, ...]:
    """The checkpoint names `policy` keeps (what the runtime's jax policy saves)."""
    return KEPT[policy]


def recomputes(policy: RematPolicy, block: Block) -> bool:
    """Whether the backward under `policy` recomputes `block`: some value of it is not kept."""
    return any(c.name not in KEPT[policy] for c in CHECKPOINTS if c.block is block)


@dataclass(frozen=True)
class RematCost:
    """Per-layer figures of every policy (numpy arrays indexed by policy code)."""

    saved_full_width: np.ndarray  # values kept per token per layer that every tensor shard holds whole
    saved_split: np.ndarray  # values kept per token per layer that 'tensor' splits (heads, MLP columns)
    recompute_qkv_out: np.ndarray  # fraction of the q/k/v and out projections recomputed
    recompute_mlp: np.ndarray  # whether the MLP is recomputed (its elementwise work in full)
    recompute_mlp_matmuls: np.ndarray  # fraction of the MLP's matmul FLOPs recomputed
    recompute_attention: np.ndarray  # forward attention passes recomputed
    recompute_tensor_collectives: np.ndarray  # tensor-parallel gathers/scatters repeated


def remat_table(model: ModelSpec) -> RematCost:
    """What each policy keeps and recomputes for `model`, derived from `KEPT`."""
    def kept_width(policy, split):
        return sum(_BY_NAME[n].width(model) for n in KEPT[policy] if _BY_NAME[n].split_over_tensor == split)

    rows = []
    for p in POLICIES:
        projections, mlp = recomputes(p, Block.ATTENTION_PROJECTIONS), recomputes(p, Block.MLP)
        rows.append((model.hidden + kept_width(p, False), kept_width(p, True), projections, mlp,
                     mlp * MLP_RECOMPUTED_FRACTION,
                     recomputes(p, Block.ATTENTION),
                     TENSOR_COLLECTIVES_PER_MATMUL_BLOCK * projections))
    cols = np.array(rows, dtype=float).T
    return RematCost(*cols)


def remat_code(policy: RematPolicy) -> int:
    return POLICIES.index(policy)
