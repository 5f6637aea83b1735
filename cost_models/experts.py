"""A mixture-of-experts MLP: routed experts of which each token takes its top k, experts every token
passes through (shared), and leading decoder layers whose MLP stays dense. MaxText's `RoutedMoE` and
DeepSeek's layer shape (docs/provenance/moe_models.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cost_models.errors import CpplanError, from_fields


@dataclass(frozen=True)
class Experts:
    """The MLP of a decoder's mixture-of-experts layers.

    Attributes:
        count: routed experts per layer (MaxText's `num_experts`).
        per_token: experts each token is routed to (`num_experts_per_tok`, the top k).
        intermediate: one expert's MLP width (`moe_mlp_dim`; Hugging Face's `moe_intermediate_size`).
        shared: experts every token passes through (`shared_experts`).
        shared_intermediate: a shared expert's width where it is not `intermediate` (0: it is; Gemma 4's
            dense MLP beside its experts, which MaxText runs as a shared expert `mlp_dim` wide).
        dense_layers: leading decoder layers whose MLP is the model's dense one (`first_num_dense_layers`).
        every: after them, every `every`-th layer is a mixture of experts and the others dense (MaxText's
            `interleave_moe_layer_step`: Llama 4 Maverick's 2, its first layer dense).
        bias: the experts' matrices and the router carry biases (GPT-OSS).
    """

    count: int
    per_token: int
    intermediate: int
    shared: int = 0
    dense_layers: int = 0
    bias: bool = False
    shared_intermediate: int = 0
    every: int = 1

    def check(self, model: str, num_layers: int) -> None:
        """Raises CpplanError naming the field of `model` that breaks a rule."""
        for name, low in (
            ("count", 2),
            ("per_token", 1),
            ("intermediate", 1),
            ("shared", 0),
            ("dense_layers", 0),
            ("shared_intermediate", 0),
            ("every", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise CpplanError(f"model {model!r}: experts.{name}={value!r} must be an integer of at least {low}.")
        if not isinstance(self.bias, bool):
            raise CpplanError(f"model {model!r}: experts.bias={self.bias!r} must be true or false.")
        if self.per_token > self.count:
            raise CpplanError(
                f"model {model!r}: experts.per_token={self.per_token} exceeds experts.count={self.count}: a token "
                f"is routed to at most every expert."
            )
        if self.layers(num_layers) < 1:
            raise CpplanError(
                f"model {model!r}: experts.dense_layers={self.dense_layers} and experts.every={self.every} leave no "
                f"mixture-of-experts layer of num_layers={num_layers}; give a dense model (no experts) instead."
            )

    @property
    def shared_width(self) -> int:
        """One shared expert's MLP width."""
        return self.shared_intermediate or self.intermediate

    @property
    def active_width(self) -> int:
        """MLP width each token runs through: its routed experts' and the shared ones' together."""
        return self.per_token * self.intermediate + self.shared * self.shared_width

    @property
    def total_width(self) -> int:
        """MLP width of every expert of a layer together (one matrix of each, per model unit)."""
        return self.count * self.intermediate + self.shared * self.shared_width

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer `layer` (from 0) is a mixture of experts."""
        return layer >= self.dense_layers and (layer - self.dense_layers + 1) % self.every == 0

    def layers(self, num_layers: int) -> int:
        """The mixture-of-experts layers of a decoder of `num_layers` layers."""
        return (num_layers - self.dense_layers) // self.every

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, row) -> "Experts":
        """Experts from their JSON form (`to_dict`).

        Raises:
            CpplanError: not an object, a missing or unknown field.
        """
        return row if isinstance(row, cls) else from_fields(cls, row, what="a model's experts")
