"""The words plans are made of: mesh axes, context-parallel strategies, remat policies, load
balancing, dtypes. Enums, not strings or booleans; each accepts MaxText's spelling too."""
from __future__ import annotations

from enum import Enum

from cost_models.errors import unknown_name

# Logical mesh axes, MaxText's names; this order is the canonical order of a plan's mesh.
AXES = ("data", "fsdp", "context", "context_ulysses", "tensor")
# Axes whose devices hold disjoint shards of the weights (ZeRO-3 style, as MaxText shards the
# `embed` dimension over fsdp and the context axes) and all-gather them layer by layer.
WEIGHT_SHARDING_AXES = ("fsdp", "context", "context_ulysses")
# Axes that split the batch, and the sequence.
BATCH_AXES = ("data", "fsdp")
SEQUENCE_AXES = ("context", "context_ulysses")


class _Named(str, Enum):
    """An enum whose members parse from their value, their name, or an alias (case-insensitive)."""

    @classmethod
    def parse(cls, value: "str | _Named"):
        if isinstance(value, cls):
            return value
        text = str(value).strip().lower().replace("-", "_")
        for member in cls:
            if text in (member.value, member.name.lower(), *member.aliases):
                return member
        raise unknown_name(cls.kind(), str(value), [m.value for m in cls])

    @property
    def aliases(self) -> tuple[str, ...]:
        return ()

    @classmethod
    def kind(cls) -> str:
        """What a member is called in error messages."""
        return cls.__name__


class CPStrategy(_Named):
    """How attention over a sequence split across devices gets the keys and values it needs."""

    NONE = "none"  # the sequence is not split (context = context_ulysses = 1)
    ALL_GATHER = "all_gather"
    ULYSSES = "ulysses"
    RING = "ring"
    USP = "usp"

    @classmethod
    def kind(cls) -> str:
        return "strategy"

    @property
    def aliases(self):
        return {"ALL_GATHER": ("allgather", "ag"), "ULYSSES": ("a2a", "all_to_all"),
                "RING": ("p2p",), "USP": ("hybrid",)}.get(self.name, ())


class RematPolicy(_Named):
    """What the forward pass keeps for the backward pass; the rest is recomputed.

    Values are MaxText's `remat_policy` names; `cost_models.remat.POLICY_PLACEMENTS` says where
    each keeps every checkpoint. Listed from the most kept (fastest) to the least.
    """

    MINIMAL_WITH_CONTEXT = "minimal_with_context"  # every matmul output and the attention output
    MINIMAL = "minimal"  # every matmul output; the attention runs again
    SAVE_DOT_WITH_CONTEXT_EXCEPT_MLP = "save_dot_with_context_except_mlp"  # q/k/v, attention output, out
    SAVE_DOT_EXCEPT_MLPWI = "save_dot_except_mlpwi"  # q/k/v, out and the MLP output
    SAVE_DOT_EXCEPT_MLP = "save_dot_except_mlp"  # q/k/v and out projections
    SAVE_QKV_PROJ = "save_qkv_proj"  # q/k/v projections
    QKV_PROJ_OFFLOADED = "qkv_proj_offloaded"  # q/k/v projections, in host memory
    SAVE_OUT_PROJ = "save_out_proj"  # the out projection
    MINIMAL_OFFLOADED = "minimal_offloaded"  # every matmul output, in host memory
    FULL = "full"  # each layer's input only
    CUSTOM = "custom"  # a placement per checkpoint name (`Plan.remat_custom`)

    @classmethod
    def kind(cls) -> str:
        return "remat policy"

    @property
    def aliases(self):
        # MaxText still accepts its old name for minimal_with_context (with a deprecation warning)
        return {"MINIMAL_WITH_CONTEXT": ("minimal_flash",)}.get(self.name, ())


class Placement(_Named):
    """Where a custom remat policy puts one checkpoint (MaxText's `RematLocation`)."""

    DEVICE = "device"  # kept in HBM
    OFFLOAD = "offload"  # copied to pinned host memory in the forward, back in the backward
    REMAT = "remat"  # recomputed in the backward

    @classmethod
    def kind(cls) -> str:
        return "checkpoint placement"


class LoadBalance(_Named):
    """Causal load balancing across the context axis."""

    NONE = "none"
    ZIGZAG = "zigzag"  # 2N chunks; rank i holds chunks i and 2N-1-i

    @classmethod
    def kind(cls) -> str:
        return "load balancing"

    @property
    def aliases(self):
        return {"ZIGZAG": ("true", "dual_chunk", "load_balanced"), "NONE": ("false",)}.get(self.name, ())


DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
