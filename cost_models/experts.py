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

    def routed_params(self, hidden: int, mlp_inputs: int) -> int:
        """Weights of one layer's routed experts (each expert's matrices and biases): what `expert` splits by
        expert, the rest of the layer (router, shared experts) split as every other weight is."""
        biases = self.bias * (mlp_inputs * self.count * self.intermediate + self.count * hidden)
        return (mlp_inputs + 1) * hidden * self.count * self.intermediate + biases

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


def expert_axis_sizes(model) -> tuple[int, ...]:
    """The sizes the `expert` mesh axis (MaxText's ici_expert_parallelism) may take for `model`: 1 for a dense
    model; every divisor of a model's routed expert count (`expert_axis_problem`)."""
    if model.experts is None:
        return (1,)
    count = model.experts.count
    return tuple(d for d in range(1, count + 1) if count % d == 0)


def expert_axis_problem(model, size: int) -> str | None:
    """Why `model` cannot run with `size` devices on the `expert` axis, or None.

    Rules (MaxText 0.2.5, read from the wheel): the axis splits the routed experts' weights by expert (the
    `exp` logical axis on the `expert` mesh axis, `configs/base.yml:691`), each device holding
    num_experts // EP of them (`layers/moe.py:2619`), so the expert count must divide by it; a dense model
    (num_experts = 1) has nothing to split, where MaxText would put its batch over the axis as fsdp does:
    cpplan plans that as fsdp.
    """
    if size == 1:
        return None
    if model.experts is None:
        return (
            f"expert={size}: model {model.name!r} has no experts; a dense model's batch and weights split over "
            f"fsdp (MaxText treats an expert axis there as fsdp): use fsdp={size}"
        )
    if model.experts.count % size:
        return (
            f"expert={size} does not divide num_experts={model.experts.count} of model {model.name!r}: each "
            f"device on the expert axis holds num_experts // ici_expert_parallelism whole experts "
            f"(MaxText 0.2.5 layers/moe.py:2619); use a divisor of {model.experts.count}"
        )
    return None
