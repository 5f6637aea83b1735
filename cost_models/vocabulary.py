"""The words plans are made of: mesh axes, context-parallel strategies, remat policies, load
balancing, dtypes. Enums, not strings or booleans; each accepts MaxText's spelling too."""

from __future__ import annotations

import math
from enum import Enum

from cost_models.errors import unknown_name

# Logical mesh axes, MaxText's names; this order is the canonical order of a plan's mesh. `expert`
# (MaxText's `ici_expert_parallelism`) comes last, as in MaxText's `mesh_axes`; it is more than one device
# only for a model with experts.
AXES = ("data", "fsdp", "context", "context_ulysses", "tensor", "expert")
# Axes whose devices hold disjoint shards of the weights (ZeRO-3 style, as MaxText shards the
# `embed` dimension over fsdp, expert and the context axes) and all-gather them layer by layer. The
# experts' own matrices are split over `expert` by expert and gathered over the rest only
# (`EXPERT_WEIGHT_AXES`).
WEIGHT_SHARDING_AXES = ("fsdp", "expert", "context", "context_ulysses")
EXPERT_WEIGHT_AXES = tuple(a for a in WEIGHT_SHARDING_AXES if a != "expert")
# Axes that split the batch (MaxText's `activation_batch`: data, fsdp and expert), and the sequence.
BATCH_AXES = ("data", "fsdp", "expert")
SEQUENCE_AXES = ("context", "context_ulysses")


def _member_named(value, members: list, kind: str):
    """The member of `members` whose value, name or alias is `value` (case-insensitive, - as _).

    Raises:
        CpplanError: `value` is not a string (str(None) would read as the member named "none") or names none.
    """
    if not isinstance(value, str):
        raise unknown_name(kind, repr(value), [m.value for m in members])
    text = value.strip().lower().replace("-", "_")
    for member in members:
        if text in (member.value, member.name.lower(), *member.aliases):
            return member
    raise unknown_name(kind, value, [m.value for m in members])


class _Named(str, Enum):
    """An enum whose members parse from their value, their name, or an alias (case-insensitive)."""

    @classmethod
    def parse(cls, value: "str | _Named"):
        return value if isinstance(value, cls) else _member_named(value, list(cls), cls.kind())

    @property
    def aliases(self) -> tuple[str, ...]:
        return ()

    @classmethod
    def kind(cls) -> str:
        """What a member is called in error messages."""
        return cls.__name__


class _Registry(type):
    """The class of `CPStrategy`: iterating it gives the registered strategies, in their specs' order."""

    def __iter__(cls):
        _register_built_ins()
        return iter(sorted(cls._members.values(), key=lambda member: member.rank))

    def __len__(cls) -> int:
        return len(list(iter(cls)))

    def __getattr__(cls, name: str):  # CPStrategy.RING before the specs are imported
        if name.isupper() and not name.startswith("_"):
            _register_built_ins()
            if name in cls.__dict__:
                return cls.__dict__[name]
        raise AttributeError(f"type object 'CPStrategy' has no attribute {name!r}")


class CPStrategy(str, metaclass=_Registry):
    """How attention over a sequence split across devices gets the keys and values it needs: the
    name of a registered spec (`cost_models.strategies.register`), e.g. `CPStrategy.RING`."""

    _members: dict[str, "CPStrategy"] = {}
    rank: float
    aliases: tuple[str, ...]

    @classmethod
    def register(cls, value: str, *, aliases: tuple[str, ...] = (), rank: float = math.inf) -> "CPStrategy":
        """The strategy named `value` (lower case), created once; `rank` orders listings."""
        if value in cls._members:
            return cls._members[value]
        member = str.__new__(cls, value)
        member.rank, member.aliases = rank, tuple(aliases)
        cls._members[value] = member
        setattr(cls, value.upper(), member)
        return member

    @property
    def value(self) -> str:
        return str.__str__(self)

    @property
    def name(self) -> str:
        return self.value.upper()

    def __repr__(self) -> str:
        return f"<CPStrategy.{self.name}>"

    def __str__(self) -> str:
        return self.value

    def __reduce__(self):
        return CPStrategy.parse, (self.value,)

    @classmethod
    def parse(cls, value: "str | CPStrategy") -> "CPStrategy":
        """A strategy by its value, name or an alias (case-insensitive)."""
        return value if isinstance(value, cls) else _member_named(value, list(cls), "strategy")


def _register_built_ins() -> None:
    import cost_models.strategies  # noqa: F401  (each spec registers its strategy)


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


class HostState(_Named):
    """Training state kept in the host's pinned memory between steps (MaxText's
    `parameter_memory_host_offload` and `optimizer_memory_host_offload`)."""

    PARAMS = "params"  # the weights, brought to HBM for the step and written back after the update
    OPTIMIZER = "optimizer"  # AdamW's moments, brought to HBM for the update only

    @classmethod
    def kind(cls) -> str:
        return "host-offloaded state"


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


class Quantization(_Named):
    """The precision of a step's matmuls (MaxText's `quantization`): bf16 throughout, or fp8 inputs to every
    matmul, forward and backward, each scaled per tensor (`fp8_full`)."""

    NONE = "none"
    FP8_FULL = "fp8_full"

    @classmethod
    def kind(cls) -> str:
        return "quantization"

    @property
    def aliases(self):
        return {"NONE": ("", "bf16", "bfloat16")}.get(self.name, ())


DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
