"""Multi-head latent attention (MLA, DeepSeek-V2/V3): queries and keys/values projected down to low-rank
latents, normed, and projected back up per head, with a few RoPE dimensions decoupled from the latent.
What the attention kernel sees is multi-head attention whose keys are `head_dim` wide and whose values
are `v_head_dim` wide; what differs from grouped-query attention is the projections' weights and
FLOPs, defined here once (MaxText's `MLA` layer; docs/provenance/moe_models.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cost_models.errors import CpplanError, from_fields


@dataclass(frozen=True)
class LatentAttention:
    """The low-rank projections of a multi-head latent attention layer.

    Attributes:
        kv_rank: the key/value latent's width (`kv_lora_rank`).
        q_rank: the query latent's width (`q_lora_rank`; 0: queries projected directly).
        rope_dims: the query and key dimensions that carry RoPE, outside the latent (`qk_rope_head_dim`);
            part of the model's `head_dim` (which is `qk_nope_head_dim + qk_rope_head_dim`).
        v_head_dim: each head's value width.
    """

    kv_rank: int
    rope_dims: int
    v_head_dim: int
    q_rank: int = 0

    def check(self, model: str, head_dim: int, num_heads: int, num_kv_heads: int) -> None:
        """Raises CpplanError naming the field of `model` that breaks a rule."""
        for name, low in (("kv_rank", 1), ("rope_dims", 0), ("v_head_dim", 1), ("q_rank", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise CpplanError(f"model {model!r}: latent.{name}={value!r} must be an integer of at least {low}.")
        if self.rope_dims >= head_dim:
            raise CpplanError(
                f"model {model!r}: latent.rope_dims={self.rope_dims} must be less than head_dim={head_dim}, "
                f"which holds them beside the latent's own (qk_nope_head_dim + qk_rope_head_dim)."
            )
        if num_kv_heads != num_heads:
            raise CpplanError(
                f"model {model!r}: latent attention expands its latent to every head, so num_kv_heads="
                f"{num_kv_heads} must equal num_heads={num_heads}."
            )

    def projection_params(self, hidden: int, num_heads: int, head_dim: int) -> tuple[int, int]:
        """Weights of the (query and key/value) projections, and of the output projection; the latents'
        norm scales are counted with the first."""
        nope = head_dim - self.rope_dims
        if self.q_rank:
            q = hidden * self.q_rank + self.q_rank + self.q_rank * num_heads * head_dim
        else:
            q = hidden * num_heads * head_dim
        kv = (
            hidden * (self.kv_rank + self.rope_dims)
            + self.kv_rank
            + self.kv_rank * num_heads * (nope + self.v_head_dim)
        )
        return q + kv, num_heads * self.v_head_dim * hidden

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, row) -> "LatentAttention":
        """A latent attention from its JSON form (`to_dict`).

        Raises:
            CpplanError: not an object, a missing or unknown field.
        """
        return row if isinstance(row, cls) else from_fields(cls, row, what="a model's latent attention")
