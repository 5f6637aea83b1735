"""Global layers with a head shape of their own (Gemma 4): fewer, wider K/V heads than the local layers',
keys and values possibly one projection (`attention_k_eq_v`). A model's layer of each mask is then a model
of its own head shape (`ModelSpec.layer_model`), which the price, the FLOPs and the strategies' rules read
per kind of layer (docs/provenance/moe_models.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cost_models.errors import CpplanError, from_fields


@dataclass(frozen=True)
class GlobalAttention:
    """The head shape of a model's global layers where it differs from its local layers'.

    Attributes:
        num_kv_heads: K/V heads of a global layer (`num_global_key_value_heads`).
        head_dim: each head's width in a global layer, queries' included (`global_head_dim`).
        shared_kv: keys and values are one projection (`attention_k_eq_v`; MaxText's `share_kv_projections`).
    """

    num_kv_heads: int
    head_dim: int
    shared_kv: bool = False

    def check(self, model: str, num_heads: int) -> None:
        """Raises CpplanError naming the field of `model` that breaks a rule."""
        for name in ("num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CpplanError(f"model {model!r}: global_attention.{name}={value!r} must be a positive integer.")
        if not isinstance(self.shared_kv, bool):
            raise CpplanError(f"model {model!r}: global_attention.shared_kv={self.shared_kv!r} must be true or false.")
        if num_heads % self.num_kv_heads:
            raise CpplanError(
                f"model {model!r}: num_heads={num_heads} must be a multiple of global_attention.num_kv_heads="
                f"{self.num_kv_heads} (grouped-query attention in the global layers)."
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, row) -> "GlobalAttention":
        """A global head shape from its JSON form (`to_dict`).

        Raises:
            CpplanError: not an object, a missing or unknown field.
        """
        return row if isinstance(row, cls) else from_fields(cls, row, what="a model's global attention")
