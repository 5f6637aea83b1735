"""What the price says one device executes and moves in a step, in the terms a compiled program is read
in (`validation.compiled_program`): matmul FLOPs, and the array bytes of each collective family. The bytes
are the price's own, with every link at 1 byte/s and no latency, and the compiled program's collectives
go through the same formulas (`link_bytes`), so the two sides compare like with like."""

from __future__ import annotations

import dataclasses

import numpy as np

from cost_models import collectives
from cost_models.candidates import Candidates, LinkColumns
from cost_models.pricing.communication import context_traffic, price_traffic
from cost_models.pricing.head import price_head
from cost_models.pricing.matmul import price_matmuls
from cost_models.pricing.step import price_layer_attention
from cost_models.targets import Target

# kind of a compiled collective → its formula, with the array it is priced by
_FORMULAS = {
    "all-gather": lambda array, n: collectives.all_gather(array, n, 1.0, 0.0),
    "reduce-scatter": lambda array, n: collectives.reduce_scatter(array, n, 1.0, 0.0),
    "all-reduce": lambda array, n: collectives.all_reduce(array, n, 1.0, 0.0),
    "all-to-all": lambda array, n: collectives.all_to_all(array, n, 1.0, 0.0),
    "collective-permute": lambda array, n: collectives.ppermute(array, 1.0, 0.0),
}


def link_bytes(kind: str, array_bytes: float, group_size: int) -> float:
    """Bytes a collective's formula charges at 1 byte/s: `kind` as the compiled program names it,
    `array_bytes` the array it is priced by (gathered, unreduced, or per device), over `group_size` devices."""
    return float(_FORMULAS[kind](array_bytes, group_size))


def executed_matmul_flops(x: Candidates) -> np.ndarray:
    """Matmul FLOPs one device executes per step, recomputation included, attention excluded:
    the layers' projections and MLP, and the output head (per candidate)."""
    return x.model.num_layers * price_matmuls(x).executed_flops + price_head(x).executed_flops


def priced_link_bytes(x: Candidates) -> dict[str, np.ndarray]:
    """Bytes per step of each collective family the price charges (fsdp_all_gather, fsdp_reduce_scatter,
    tensor, data_all_reduce, context), at 1 byte/s per link."""

    def unit(link: LinkColumns) -> LinkColumns:
        return LinkColumns(np.ones_like(link.bw), np.zeros_like(link.latency))

    unit_x = dataclasses.replace(
        x, links={name: unit(link) for name, link in x.links.items()}, ring_link=unit(x.ring_link)
    )
    # a layer's traffic as the price has it: its masks' averaged over the layers (local and global differ)
    _, cost = price_layer_attention(unit_x, Target.CPPLAN)
    context = context_traffic(
        cost, unit_x.remat_columns.recompute_attention, 0.0, hides_behind_attention=False, shares_hops=False
    )
    traffic = price_traffic(unit_x, price_matmuls(unit_x).weight_bytes, context)
    return traffic.per_step(x.model.num_layers)
