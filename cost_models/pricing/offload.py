"""Remat offload: the activations a policy offloads to pinned host memory (its named checkpoints, and
each layer's input where `custom` offloads it), the host memory they take, and the time their copies
add. XLA runs the copies asynchronously while the layer computes, so a layer's copies cost the step only
what they take beyond that layer's compute."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.candidates import Candidates
from cost_models.chips import Chip, ChipKind
from cost_models.models import ModelSpec
from cost_models.remat import CustomPlacements, remat_code, remat_table
from cost_models.topology import Topology
from cost_models.vocabulary import HostState, RematPolicy


def offloaded_bytes_per_layer(remat_cost_host, *, tokens_per_device, tensor, act_bytes):
    """Bytes one layer offloads per device: the offloaded values per token (before the tensor
    split, every checkpoint being split over tensor) for the device's tokens, in the activation
    dtype. Arrays or floats."""
    return tokens_per_device * remat_cost_host / tensor * act_bytes


# The TPU compiler ends its process (SIGABRT) compiling a copy between HBM and host memory of 2^32 bytes made
# inside a loop, as a layer loop copies each layer's offloaded values: `llo_loop.cc:175 Check failed:
# index_space_.start <= index_space_.limit (0 vs. -1)`, in EnqueueToHostIovaStridedDmaInGranulesRolledLoop.
# Seen deviceless with libtpu 0.0.52: cpplan's 4- and 8-layer Llama 3.1 8B steps on v5p (and, as reported, on
# tpu7x), and a 4 GiB value offloaded in a scan of 2 or 4 layers on v5p and tpu7x (8 GiB too); with 0.0.42.1 on
# v5p and v5e (2 layers). Copies of 3 GiB, 4 GiB - 512 KiB and 5 GiB compiled, and one layer (no loop) compiled
# at 4 GiB. A trip count of zero at multiples of 2^32 bytes is what a 32-bit byte count gives, so larger copies
# (which compile) are not trusted either: every copy of 2^32 bytes or more is refused.
# Evidence and commands: docs/compiler_aborts.md.
HOST_COPY_LIMIT_BYTES = 2**32
HOST_COPY_EVIDENCE = "docs/compiler_aborts.md"


def largest_host_copy_bytes(x: Candidates) -> np.ndarray:
    """Per candidate, the largest single copy to the host a step's layer loop makes on one device: its
    widest value offloaded a layer at a time, for the device's tokens; 0 on a host's devices and for a
    step of one layer (no loop). A 2-layer step counts: the small program aborts at 2 layers, though the
    compiler leaves cpplan's 2-layer offloading steps without a layer loop (`flat_offload_program`)."""
    if x.topology.chip.kind is not ChipKind.TPU or x.model.num_layers == 1:
        return np.zeros(np.shape(x.tensor))
    width = x.remat_columns.widest_offloaded_whole
    return offloaded_bytes_per_layer(
        width, tokens_per_device=x.tokens_per_device, tensor=x.tensor, act_bytes=x.act_bytes
    )


def host_copy_bytes(
    model: ModelSpec,
    policy: RematPolicy,
    custom: CustomPlacements,
    *,
    chip: Chip,
    tokens_per_device: float,
    tensor: int,
    act_bytes: int,
) -> float:
    """One plan's `largest_host_copy_bytes`: its layer loop's largest single copy to the host per device."""
    if chip.kind is not ChipKind.TPU or model.num_layers == 1:
        return 0.0
    width = remat_table(model, custom).widest_offloaded_whole[remat_code(policy)]
    return float(
        offloaded_bytes_per_layer(width, tokens_per_device=tokens_per_device, tensor=tensor, act_bytes=act_bytes)
    )


def host_copy_violation(copy_bytes: float) -> str | None:
    """The sentence that refuses a plan whose layer loop copies `copy_bytes` to the host at once per device
    (None where the TPU compiler makes such copies)."""
    if copy_bytes < HOST_COPY_LIMIT_BYTES:
        return None
    return (
        f"offloads {copy_bytes / 2**30:.2f} GiB per device in one host copy per layer, not under the "
        f"{HOST_COPY_LIMIT_BYTES / 2**30:.0f} GiB (2^32 bytes) at which the TPU compiler aborts inside a layer loop "
        f"(libtpu 0.0.42-0.0.52: llo_loop.cc:175 Check failed; {HOST_COPY_EVIDENCE}); more devices, fewer "
        f"sequences per step or less offloaded take it under"
    )


def host_capacity_bytes(topology: Topology) -> float:
    """Host memory per device: the chip row's host memory per chip over its devices."""
    return topology.chip.host_memory_bytes_per_chip / topology.devices_per_chip


def host_link_bw(topology: Topology) -> float:
    """Bytes/s one device's copies get over its chip's host link (shared by the chip's devices)."""
    return topology.chip.host_link_bw_bytes_per_s / topology.devices_per_chip


def host_bytes_needed(
    model: ModelSpec,
    policy: RematPolicy,
    custom: CustomPlacements,
    *,
    tokens_per_device: float,
    tensor: int,
    act_bytes: int,
) -> float:
    """Host memory one device's offloaded activations take over a step (every layer's), for
    `tokens_per_device` tokens outside attention."""
    per_token = remat_table(model, custom).saved_on_host[remat_code(policy)]
    return float(
        model.num_layers
        * offloaded_bytes_per_layer(per_token, tokens_per_device=tokens_per_device, tensor=tensor, act_bytes=act_bytes)
    )


@dataclass(frozen=True)
class OffloadTimes:
    """Per-candidate columns (s per step, bytes per device)."""

    host_bytes: np.ndarray  # host memory the offloaded activations take
    transfer_s: np.ndarray  # the copies to the host and back, all layers
    exposed_s: np.ndarray  # the part of them no compute hides


def price_offload(x: Candidates, *, layer_forward_s, layer_backward_s) -> OffloadTimes:
    """What the candidates' offloaded checkpoints cost, given one layer's forward and backward compute."""
    layer_bytes = offloaded_bytes_per_layer(
        x.remat_columns.saved_on_host, tokens_per_device=x.tokens_per_device, tensor=x.tensor, act_bytes=x.act_bytes
    )
    one_way_s = layer_bytes / host_link_bw(x.topology)
    layers = x.model.num_layers
    exposed = np.maximum(0.0, one_way_s - layer_forward_s) + np.maximum(0.0, one_way_s - layer_backward_s)
    return OffloadTimes(host_bytes=layers * layer_bytes, transfer_s=layers * 2 * one_way_s, exposed_s=layers * exposed)


def state_bytes(model: ModelSpec, *, weight_shards, param_bytes: int, mu_bytes: int) -> dict[HostState, object]:
    """Bytes per device of each kind of training state: the weights in their dtype, and AdamW's moments
    (the first in `mu_bytes`, the second in the weights' dtype), each split over `weight_shards` devices."""
    shard = model.num_params / weight_shards
    return {HostState.PARAMS: shard * param_bytes, HostState.OPTIMIZER: shard * (mu_bytes + param_bytes)}


@dataclass(frozen=True)
class StateOffloadTimes:
    """Per-candidate columns for the state kept on the host between steps (s per step, bytes per device)."""

    host_bytes: np.ndarray  # host memory the state takes
    transfer_s: np.ndarray  # its copies to HBM and back, each step
    exposed_s: np.ndarray  # the part of them no compute hides


def price_state_offload(x: Candidates, *, layers_s) -> StateOffloadTimes:
    """What keeping `x.state_on_host` on the host costs, given the layers' compute (forward and backward, all
    layers). MaxText 0.2.5's step copies all of it to HBM at its start and back after the update (the compile
    holds it all step: docs/maxtext_offload.md, "State on the host"): the weights' copy in is waited for by the
    first layer, the moments' runs beside the layers, and the copies back follow the update."""
    sizes = state_bytes(x.model, weight_shards=x.weight_shards, param_bytes=x.param_bytes, mu_bytes=x.mu_bytes)
    one_way = {h: sizes[h] * (h in x.state_on_host) / host_link_bw(x.topology) for h in HostState}
    params_s, moments_s = one_way[HostState.PARAMS], one_way[HostState.OPTIMIZER]
    return StateOffloadTimes(
        host_bytes=sum(sizes[h] * (h in x.state_on_host) for h in HostState),
        transfer_s=2 * (params_s + moments_s),
        exposed_s=2 * params_s + moments_s + np.maximum(0.0, moments_s - layers_s),
    )
