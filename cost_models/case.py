"""`Case`: what one training step is asked to do — a model, on a topology, at a sequence
length and a batch. The four travel together through the search, the price and the explanation."""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.models import ModelSpec
from cost_models.strategies.base import Violation
from cost_models.topology import Topology


@dataclass(frozen=True)
class Case:
    """A model trained on a topology at `seq_len` tokens per sequence, `global_batch` sequences per step."""

    model: ModelSpec
    topology: Topology
    seq_len: int
    global_batch: int

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch


class ReadsCase:
    """The four fields of a `Case`, read through the object's own `case` attribute."""

    @property
    def model(self) -> ModelSpec:
        return self.case.model

    @property
    def topology(self) -> Topology:
        return self.case.topology

    @property
    def seq_len(self) -> int:
        return self.case.seq_len

    @property
    def global_batch(self) -> int:
        return self.case.global_batch


def batch_split_violation(global_batch: int, batch_shards: int, *, with_expert: bool = False) -> "Violation | None":
    """The batch must split evenly over the data × fsdp (× expert, which splits the batch as fsdp does, for a
    model with experts: `with_expert`) shards (every shard holds whole sequences)."""
    if global_batch % batch_shards:
        axes = "data×fsdp×expert" if with_expert else "data×fsdp"
        return Violation("batch", f"global_batch={global_batch} sequences not divisible by {axes}={batch_shards}")
    return None
