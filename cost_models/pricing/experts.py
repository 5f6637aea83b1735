"""The mixture-of-experts MLP of one decoder layer on one device, as MaxText's sparse matmul runs it: route
(the router's matmul, softmax and top k), permute (each token copied once per expert it is routed to, sorted
by expert), dispatch (with expert parallelism, the copies sent to the devices holding their experts: an
all-to-all over `expert`), the grouped matmuls (each of the device's experts over its group of rows),
combine's return all-to-all, unpermute and combine (the copies weighted and summed back per token). The
routed experts' weights are split by expert over `expert` (E/e experts a device) and otherwise sharded as
every other weight is (FSDP over the weight group less `expert`, columns over tensor); with e = 1 every device
routes its own tokens to every expert. Each step has its own price here; the dense layers of a model with a
dense lead are priced as any dense MLP (docs/provenance/moe_models.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.candidates import Candidates
from cost_models.chips import GroupedKernel
from cost_models.compute import tile_efficiency
from cost_models.pricing.capacity import capacity_seconds, slot_rows
from cost_models.vocabulary import Quantization

# HBM passes over the routed copies (tokens × top k × hidden) in one forward: the permute gathers them in
# expert order and writes them (2), the unpermute reads the grouped matmul's output and writes it back in
# token order (2), the combine reads it once more to weight and sum per token (1)
PERMUTE_PASSES = 5
# with expert parallelism, HBM passes more over the copies a device receives: MaxText sorts them again by its
# own experts after the dispatch (read, write) and back before the return all-to-all (read, write)
# (`local_permute` and `unsort_output_and_ra2a`, MaxText 0.2.5 layers/moe.py:2675, :2979)
LOCAL_PERMUTE_PASSES = 4
# the all-to-alls of one mixture-of-experts layer: the forward's dispatch and return, and their transposes in
# the backward (the forward's again where the remat policy recomputes the MLP)
DISPATCH_ALL_TO_ALLS = 2
# the routed copies (tokens × k rows, hidden-wide) a layer's backward holds at once without expert parallelism,
# read from MaxText 0.2.5's compile of DeepSeek-V3 at EP 1 (docs/moe_compiled.md, "shard_exp_on_fsdp"): the
# sorted input the input projections' weight gradients read, the output's gradient in expert order the output
# projection's weight gradient reads, and the recomputed expert output on its way back to token order
ROUTED_COPIES_HELD = 3


@dataclass(frozen=True)
class ExpertTimes:
    """One mixture-of-experts layer's MLP on one device, forward (arrays over candidates)."""

    router_s: np.ndarray  # the router's matmul (hidden × experts) on every token
    # the routed experts' grouped matmuls: a third of their forward, input-gradient and weight-gradient
    # kernels together, as the chip row's grouped-matmul figures time each (`Chip.grouped_matmul_seconds`);
    # on MaxText's dense capacity path, their dense matmuls over every slot (`capacity.capacity_seconds`)
    grouped_s: np.ndarray
    shared_s: np.ndarray  # the shared experts' dense matmuls
    # moving the routed copies into expert order and back, and combining them (on the capacity path, the
    # dispatch and combine einsums)
    permute_s: np.ndarray

    @property
    def matmul_s(self) -> np.ndarray:
        return self.router_s + self.grouped_s + self.shared_s

    @property
    def total_s(self) -> np.ndarray:
        return self.matmul_s + self.permute_s


def gathered_mlp_matrix_params(x: Candidates):
    """Weights of one MLP matrix of the widest layer as a device gathers it (`ModelSpec.mlp_matrix_params`):
    a mixture of experts' one matrix of each of its E/e experts and of the shared ones."""
    m = x.model
    if not m.experts:
        return m.mlp_matrix_params
    return np.maximum(expert_matrix_params(x), m.hidden * m.intermediate if m.moe_layers < m.num_layers else 0)


def expert_matrix_params(x: Candidates):
    """Weights of one MLP matrix of a mixture-of-experts layer as a device gathers it: one matrix of each of
    its E/e routed experts and of the shared ones (the model must have experts)."""
    m, e = x.model, x.model.experts
    return m.hidden * (e.count * e.intermediate / x.expert + e.shared * e.shared_width)


def routed_copy_bytes(x: Candidates):
    """Bytes of routed copies, hidden-wide, that MaxText's sparse matmul holds through a mixture-of-experts
    layer's backward where no all-to-all receives them (e = 1; with e > 1 the receive buffers,
    `receive_buffer_bytes`, are priced instead): `ROUTED_COPIES_HELD` of tokens × k rows in the compute dtype."""
    if not x.model.experts:
        return 0.0
    return np.where(x.expert > 1, 0.0, ROUTED_COPIES_HELD * dispatched_rows(x) * x.model.hidden * x.act_bytes)


def receive_buffer_bytes(x: Candidates, *, worst_case: bool):
    """Bytes a layer's MLP holds for the expert all-to-alls (0 without experts or expert parallelism): the
    buffer the dispatch receives the copies into and the one the grouped matmuls' output is returned from
    (`receive_buffer_rows` each), hidden-wide in the compute dtype; in the backward, their gradients' alike."""
    if not x.model.experts:
        return 0.0
    return 2 * receive_buffer_rows(x, worst_case=worst_case) * x.model.hidden * x.act_bytes


def expert_group_rows(x: Candidates) -> np.ndarray:
    """Rows of one expert's group on a device: the routed copies it runs (on average its own tokens' count,
    `dispatched_rows`) spread evenly over its E/e experts (random or balanced routing)."""
    return dispatched_rows(x) / local_experts(x)


def local_experts(x: Candidates) -> np.ndarray:
    """Routed experts each device holds: E / e."""
    return x.model.experts.count / x.expert


def dispatched_rows(x: Candidates) -> np.ndarray:
    """Routed copies a device runs through its experts: with balanced routing, on average its own tokens × k
    (with e = 1 exactly those; with e > 1 the ones the all-to-all brings it); on MaxText's dense capacity
    path, every expert's slots (`capacity.slot_rows`)."""
    if x.expert_capacity:
        return slot_rows(x)
    return np.asarray(x.tokens_per_device, dtype=float) * x.model.experts.per_token


def receive_buffer_rows(x: Candidates, *, worst_case: bool) -> np.ndarray:
    """Rows of the buffer a device receives the dispatched copies into (0 without expert parallelism): the
    balanced count, tokens × k; or, `worst_case`, the count MaxText allocates so that nothing drops with its
    default `ragged_buffer_factor` of -1: tokens × k × min(e, E/k) (`get_ragged_buffer_size`, MaxText 0.2.5
    layers/moe.py:2079)."""
    e = x.model.experts
    factor = np.minimum(x.expert, e.count / e.per_token) if worst_case and not x.expert_capacity else 1.0
    return np.where(x.expert > 1, dispatched_rows(x) * factor, 0.0)


def dispatch_bytes(x: Candidates) -> np.ndarray:
    """Bytes each device holds before and after one dispatch (or return) all-to-all: its tokens' routed copies,
    tokens × k × hidden in the compute dtype."""
    return dispatched_rows(x) * x.model.hidden * x.act_bytes


def routed_weight_bytes(x: Candidates) -> np.ndarray:
    """One layer's routed experts' weights, averaged over the layers, in the compute dtype, split over tensor
    (not yet over `expert`): the part of `MatmulTimes.weight_bytes` whose gathers run over the weight group
    less `expert`, each device gathering its own experts only (1/e of them)."""
    m = x.model
    if not m.experts:
        return 0.0 * x.tensor
    share = m.moe_layers / m.num_layers
    return share * m.experts.routed_params(m.hidden, m.mlp_inputs) * x.act_bytes / x.tensor


def grouped_matmul_efficiency(x: Candidates) -> np.ndarray:
    """Useful fraction of the chip's peak the routed experts' grouped matmuls reach, their three kernels
    (forward, input gradient, weight gradient) together (`grouped_seconds`)."""
    e, m = x.model.experts, x.model
    flops = 3 * 2.0 * dispatched_rows(x) * m.mlp_matrices * m.hidden * e.intermediate / x.tensor
    return flops / (3 * grouped_seconds(x) * x.topology.peak_flops_per_device)


def grouped_seconds(
    x: Candidates, mlp_chunk_tokens: int | None = None, kernel: GroupedKernel = GroupedKernel.TOKAMAX
) -> np.ndarray:
    """A third of the seconds of one layer's routed-expert grouped matmuls, forward and backward (each input
    projection and the output projection; the backward's input gradient as a forward, its weight gradient
    with the row's own figures), per device: the chip row's measured model of a grouped matmul
    (`Chip.grouped_matmul_seconds`), each device running its E/e experts (`local_experts`) over the routed
    copies it holds (`dispatched_rows`), with the figures of the runtime's `kernel`; where the runtime runs
    the MLP a chunk of `mlp_chunk_tokens` tokens at a time (cpplan's), one call per chunk over that chunk's
    copies."""
    chip, m, e = x.topology.chip, x.model, x.model.experts
    fp8 = x.quantization is Quantization.FP8_FULL

    def one(rows: float, tensor: float, groups: float) -> float:
        width = e.intermediate / tensor
        shapes = [(m.hidden, width)] * m.mlp_inputs + [(width, m.hidden)]
        return (
            sum(
                2 * chip.grouped_matmul_seconds(groups, rows, k, n, fp8=fp8, kernel=kernel)
                + chip.grouped_matmul_seconds(groups, rows, k, n, weight_grad=True, fp8=fp8, kernel=kernel)
                for k, n in shapes
            )
            / 3
        )

    rows = dispatched_rows(x)
    calls = np.ones_like(rows)
    if mlp_chunk_tokens:
        calls = np.ceil(np.asarray(x.tokens_per_device, dtype=float) / mlp_chunk_tokens)
        rows = rows / calls
    rows, tensor, groups = np.broadcast_arrays(
        rows, np.asarray(x.tensor, dtype=float), np.asarray(local_experts(x), dtype=float)
    )
    triples, where = np.unique(
        np.stack([rows.ravel(), tensor.ravel(), groups.ravel()], axis=1), axis=0, return_inverse=True
    )
    seconds = np.array([one(r, s, g) for r, s, g in triples])
    return calls * seconds[np.ravel(where)].reshape(rows.shape)


def price_experts(
    x: Candidates, mlp_chunk_tokens: int | None = None, kernel: GroupedKernel = GroupedKernel.TOKAMAX
) -> ExpertTimes:
    """Prices one mixture-of-experts layer's MLP for every candidate (the model must have experts), its grouped
    matmuls a call per MLP chunk where the runtime chunks it (`grouped_seconds`); its permutes at the
    chip's measured passes for XLA's (`Chip.ragged_dot_permute_passes`), else `PERMUTE_PASSES` counted."""
    m, tensor = x.model, x.tensor
    e = m.experts
    tokens = np.asarray(x.tokens_per_device, dtype=float)
    tile, achievable = x.topology.chip.mxu_tile, x.achievable_matmul_flops
    router_s = 2.0 * tokens * m.hidden * e.count / (achievable * tile_efficiency(e.count, tile))
    if x.expert_capacity:  # MaxText's dense path: slots, einsums, no sort
        grouped_s, permute_s = capacity_seconds(x)
    else:
        grouped_s = grouped_seconds(x, mlp_chunk_tokens, kernel)
    shared_s = 0.0 * tokens
    if e.shared:  # a dense MLP of the shared experts' widths together, its columns split over tensor
        width = e.shared * e.shared_width / tensor
        columns = tile_efficiency(m.hidden, tile) * tile_efficiency(width, tile)
        shared_s = tokens * 2.0 * m.mlp_matrices * m.hidden * width / (achievable * columns)
    if not x.expert_capacity:
        measured = x.topology.chip.ragged_dot_permute_passes if kernel is GroupedKernel.XLA_RAGGED_DOT else 0.0
        passes = (measured or PERMUTE_PASSES) + np.where(x.expert > 1, LOCAL_PERMUTE_PASSES, 0)
        permute_s = passes * dispatch_bytes(x) / x.topology.hbm_bw_per_device
    return ExpertTimes(router_s=router_s, grouped_s=grouped_s, shared_s=shared_s, permute_s=permute_s)
