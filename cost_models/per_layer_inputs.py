"""Per-layer input embeddings (Gemma 4 E2B and E4B, "PLE"): a second token embedding, `width` values per
token for every decoder layer, mixed with a projection of the input embedding and gated into each layer's
residual stream after its MLP (docs/provenance/moe_models.md#gemma-4-e2b-and-e4b).

As MaxText 0.2.5 builds it (`models/gemma4_small.py`, `Gemma4SmallPLE` and `Gemma4SmallDecoderLayer`): before
the layers, a table of `vocab` × layers·`width` is looked up by token, a `hidden` × layers·`width` projection
of the input embedding is normed per `width` slice and the two are summed; after each layer's MLP, a
`hidden` → `width` gate (GELU) multiplies the layer's slice, a `width` → `hidden` projection and a norm
take it back to the residual stream.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cost_models.errors import CpplanError, from_fields


@dataclass(frozen=True)
class PerLayerInputs:
    """A model's per-layer input embeddings.

    Attributes:
        width: values per token and layer (Hugging Face's `hidden_size_per_layer_input`, MaxText's too).
        vocab: rows of the table (`vocab_size_per_layer_input`).
    """

    width: int
    vocab: int

    def check(self, model: str) -> None:
        """Raises CpplanError naming the field of `model` that breaks a rule."""
        for name in ("width", "vocab"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CpplanError(f"model {model!r}: per_layer_inputs.{name}={value!r} must be a positive integer.")

    def table_params(self, num_layers: int) -> int:
        """Weights of the table: `vocab` rows of every layer's `width` values (one array, MaxText's
        `embed_tokens_per_layer`)."""
        return self.vocab * num_layers * self.width

    def projection_params(self, hidden: int, num_layers: int) -> int:
        """Weights of the input embedding's projection to every layer's inputs and of its norm's scale."""
        return hidden * num_layers * self.width + self.width

    def layer_params(self, hidden: int) -> int:
        """Weights one decoder layer adds: its gate (`hidden` → `width`), its projection back and the norm
        after it."""
        return 2 * hidden * self.width + hidden

    def layer_flops_per_token(self, hidden: int) -> float:
        """Forward FLOPs per token of one layer's gate and projection."""
        return 2.0 * 2 * hidden * self.width

    def projection_flops_per_token(self, hidden: int, num_layers: int) -> float:
        """Forward FLOPs per token of the input embedding's projection, once per step for every layer."""
        return 2.0 * hidden * num_layers * self.width

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, row) -> "PerLayerInputs":
        """Per-layer inputs from their JSON form (`to_dict`).

        Raises:
            CpplanError: not an object, a missing or unknown field.
        """
        return row if isinstance(row, cls) else from_fields(cls, row, what="a model's per-layer inputs")
