"""What each remat policy keeps for the backward pass, by MaxText's checkpoint names: the one table
from which both the price (bytes kept on device or on the host, work recomputed) and the runtime's jax
checkpoint policy derive. A policy saves some names on device, offloads some to pinned host memory and
recomputes the rest from the layer input, which every policy keeps. Sources and how our names map onto
MaxText's: docs/provenance/cost_models.md#remat.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

import numpy as np

from cost_models.chips import Chip
from cost_models.errors import CpplanError, unknown_name
from cost_models.models import ModelSpec
from cost_models.vocabulary import Placement, RematPolicy

POLICIES = tuple(RematPolicy)

# The attention output's name, which splash's residuals and the ring's share, so keeping it skips the
# attention's forward rerun; the layer's layout of it is left unnamed (as in MaxText): kept once.
ATTENTION_OUTPUT = "context"


class Block(str, Enum):
    """The sub-block of a decoder layer a checkpoint belongs to."""

    ATTENTION_PROJECTIONS = "attention projections"
    ATTENTION = "attention"
    MLP = "mlp"


@dataclass(frozen=True)
class Checkpoint:
    """One named value of a decoder layer.

    Attributes:
        read_by_backward: a sequential layer's backward reads it. In Llama's block the MLP's output only
            enters the residual sum, so keeping it is free and it is never recomputed; the blocks where
            it is read (a mixture of experts, Gemma 3's post-norm) are `is_read`'s.
        gathered_input: its matmul's input is all-gathered over `tensor` first; recomputing repeats that.
        scattered_output: it is reduce-scattered over `tensor` after its matmul; recomputing repeats that.
    """

    name: str
    block: Block
    read_by_backward: bool = True
    gathered_input: bool = False
    scattered_output: bool = False

    def width(self, model: ModelSpec) -> float:
        """Values per token of this checkpoint, before the tensor split (the MLP's averaged over the layers
        where some are wider, `ModelSpec.mean_mlp_width`)."""
        kv = model.num_kv_heads * model.head_dim
        return {
            "query_proj": model.num_heads * model.head_dim,
            "key_proj": kv,
            "value_proj": kv,
            "out_proj": model.hidden,
            "mlpwi_0": model.mean_mlp_width,
            "mlpwi_1": model.mean_mlp_width if model.gated else 0,
            "mlpwo": model.hidden,
            ATTENTION_OUTPUT: model.num_heads * model.head_dim,
        }[self.name]

    def is_matmul(self) -> bool:
        return self.block is not Block.ATTENTION

    def weight_size(self, model: ModelSpec) -> float:
        """Weights of the matmul that computes this checkpoint (its FLOPs per token, halved)."""
        if not self.is_matmul():
            raise CpplanError(f"checkpoint {self.name!r} is the attention's output, not a matmul's.")
        inner = model.mean_mlp_width if self.block is Block.MLP else model.num_heads * model.head_dim
        return self.width(model) * (inner if self.name in ("out_proj", "mlpwo") else model.hidden)


CHECKPOINTS = (
    Checkpoint("query_proj", Block.ATTENTION_PROJECTIONS, gathered_input=True),
    Checkpoint("key_proj", Block.ATTENTION_PROJECTIONS, gathered_input=True),
    Checkpoint("value_proj", Block.ATTENTION_PROJECTIONS, gathered_input=True),
    Checkpoint(ATTENTION_OUTPUT, Block.ATTENTION),
    Checkpoint("out_proj", Block.ATTENTION_PROJECTIONS, scattered_output=True),
    Checkpoint("mlpwi_0", Block.MLP, gathered_input=True),
    Checkpoint("mlpwi_1", Block.MLP, gathered_input=True),
    Checkpoint("mlpwo", Block.MLP, read_by_backward=False, scattered_output=True),
)
CHECKPOINT_NAMES = tuple(c.name for c in CHECKPOINTS)
# the projections whose input is gathered over tensor, in order: the attention's q, k, v, and the
# MLP's inputs (a plain MLP has the first only)
# the projections made before the attention (q, k, v): the ones whose input is gathered
QKV_PROJECTIONS = tuple(c for c in CHECKPOINTS if c.block is Block.ATTENTION_PROJECTIONS and c.gathered_input)
QKV_CHECKPOINTS = tuple(c.name for c in QKV_PROJECTIONS)
MLP_INPUT_CHECKPOINTS = tuple(c.name for c in CHECKPOINTS if c.block is Block.MLP and c.gathered_input)
MLP_OUTPUT = "mlpwo"
_BY_NAME = {c.name: c for c in CHECKPOINTS}
# The offloaded values a layer's attention backward reads: fetched an iteration ahead, they are held
# through the MLP's backward, which runs first (docs/provenance/cost_models.md#remat).
READ_BY_ATTENTION_BACKWARD = (*QKV_CHECKPOINTS, ATTENTION_OUTPUT)


def is_read(checkpoint: Checkpoint, model: "ModelSpec | None" = None) -> bool:
    """Whether the backward of `model`'s layer reads the value (a sequential block when no model); in a
    parallel block the reduce-scattered outputs, like the MLP's, only enter the residual sum. A mixture of
    experts' combine weights each expert's output by its router weight, whose gradient reads that output:
    its MLP output is read (a toy MoE layer's gradient program runs the output matmul again: docs/moe_misses.md);
    so does a block that norms the MLP's output before the sum (Gemma 3's: MaxText's compile recomputes it,
    docs/multislice.md)."""
    parallel = model is not None and model.decoder_block.parallel
    output_read = model is not None and (model.experts is not None or model.decoder_block.post_norms)
    return (checkpoint.read_by_backward or (output_read and checkpoint.name == MLP_OUTPUT)) and not (
        parallel and checkpoint.scattered_output
    )


_MATMULS = tuple(c.name for c in CHECKPOINTS if c.is_matmul())  # MaxText's minimal_policy names

# MaxText's checkpoint names → ours: fused projections spread over their parts; names of blocks a
# dense Llama decoder lacks (MoE, MLA, ...) map to nothing.
MAXTEXT_NAMES: dict[str, tuple[str, ...]] = {
    **{name: (name,) for name in CHECKPOINT_NAMES},
    "qkv_proj": QKV_CHECKPOINTS,
    "kv_proj": QKV_CHECKPOINTS[1:],
    "mlpwi": MLP_INPUT_CHECKPOINTS,
    "attention_out": (ATTENTION_OUTPUT,),
    **{
        name: ()
        for name in (
            "moe_mlpwi_0",
            "moe_mlpwi_1",
            "moe_mlpwo",
            "query_wa_proj",
            "kv_wa_proj",
            "mla_q",
            "mla_kv",
            "engram",
            "indexer_cutoff_threshold",
        )
    },
}
# MaxText's name for a layer's input, where every recomputation starts. Under remat jax keeps a
# checkpointed function's own input all the same, so it is on device unless offloaded.
LAYER_INPUT = "decoder_layer_input"


def _device(*names: str) -> dict[str, Placement]:
    return {n: Placement.DEVICE for n in names}


def _offload(*names: str) -> dict[str, Placement]:
    return {n: Placement.OFFLOAD for n in names}


# Where each named policy puts each checkpoint it does not recompute (absent names: REMAT).
POLICY_PLACEMENTS: dict[RematPolicy, dict[str, Placement]] = {
    RematPolicy.MINIMAL_WITH_CONTEXT: _device(*_MATMULS, ATTENTION_OUTPUT),
    RematPolicy.MINIMAL: _device(*_MATMULS),
    RematPolicy.SAVE_DOT_WITH_CONTEXT_EXCEPT_MLP: _device(*QKV_CHECKPOINTS, ATTENTION_OUTPUT, "out_proj"),
    RematPolicy.SAVE_DOT_EXCEPT_MLPWI: _device(*QKV_CHECKPOINTS, "out_proj", "mlpwo"),
    RematPolicy.SAVE_DOT_EXCEPT_MLP: _device(*QKV_CHECKPOINTS, "out_proj"),
    RematPolicy.SAVE_QKV_PROJ: _device(*QKV_CHECKPOINTS),
    RematPolicy.QKV_PROJ_OFFLOADED: _offload(*QKV_CHECKPOINTS),
    RematPolicy.SAVE_OUT_PROJ: _device("out_proj"),
    RematPolicy.MINIMAL_OFFLOADED: _offload(*_MATMULS),
    RematPolicy.FULL: {},
    RematPolicy.CUSTOM: {},  # the plan's own placements (`Plan.remat_custom`)
}

# The policies searched unless told otherwise (each multiplies the candidates): keep nothing, the attention
# projections, the attention's projections and output (no attention rerun without the MLP's memory),
# everything, or `custom` as `SEARCHED_CUSTOM` places it; the named offloading ones only when asked for.
SEARCHED_POLICIES = (
    RematPolicy.FULL,
    RematPolicy.SAVE_DOT_EXCEPT_MLP,
    RematPolicy.SAVE_DOT_WITH_CONTEXT_EXCEPT_MLP,
    RematPolicy.MINIMAL_WITH_CONTEXT,
    RematPolicy.CUSTOM,
)

# ((name, Placement), ...) in `CUSTOM_NAMES` order; REMAT left out, and the layer input only there when offloaded
CustomPlacements = tuple
# The names a custom policy places: the layer input, then the checkpoints
CUSTOM_NAMES = (LAYER_INPUT, *CHECKPOINT_NAMES)


def custom_placements(
    choices: "Mapping[str, object] | Iterable[tuple[str, object]]", *, maxtext_names: bool = False
) -> CustomPlacements:
    """A custom policy's placements in canonical form (as `Plan.remat_custom` holds them).

    Args:
        choices: checkpoint name (or `LAYER_INPUT`) → placement (a `Placement` or its name).
        maxtext_names: also accept MaxText's names (`MAXTEXT_NAMES`), spread over ours.
    Returns:
        `((name, Placement), ...)` in `CUSTOM_NAMES` order: every checkpoint not recomputed, and the
        layer input when offloaded.
    Raises:
        CpplanError: an unknown name or placement, or one name given two placements.
    """
    pairs = list(choices.items()) if isinstance(choices, Mapping) else list(choices)
    known = MAXTEXT_NAMES if maxtext_names else {n: (n,) for n in CHECKPOINT_NAMES}
    out: dict[str, Placement] = {}
    for pair in pairs:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], str)):
            raise CpplanError(f"custom remat placement {pair!r} must be (checkpoint name, placement).")
        name, where = pair[0], Placement.parse(pair[1])
        if name == LAYER_INPUT:
            if out.get(name, where) is not where:
                raise CpplanError(
                    f"{LAYER_INPUT} is given two placements, {out[name].value} and {where.value}; give it one."
                )
            out[name] = where
            continue
        if name not in known:
            raise unknown_name("checkpoint name", name, (LAYER_INPUT, *known))
        for ours in known[name]:
            if out.get(ours, where) is not where:
                raise CpplanError(
                    f"checkpoint {ours!r} is given two placements, {out[ours].value} and "
                    f"{where.value} (via {name!r}); give it one."
                )
            out[ours] = where
    return tuple(
        (n, out[n])
        for n in CUSTOM_NAMES
        if out.get(n, Placement.REMAT) is not Placement.REMAT and (n != LAYER_INPUT or out[n] is Placement.OFFLOAD)
    )


# What a search tries under `custom`: the attention's output and each layer's input offloaded, the rest
# recomputed, as MaxText's long-context recipes run their 2M and 4M rows (no attention rerun, and of a
# layer's values only its gradients' working set in HBM; docs/provenance/cost_models.md#remat).
SEARCHED_CUSTOM = (custom_placements({ATTENTION_OUTPUT: Placement.OFFLOAD, LAYER_INPUT: Placement.OFFLOAD}),)


def remat_label(policy: RematPolicy, custom: CustomPlacements = ()) -> str:
    """A policy's name; a custom one's with its placements, as MaxText's flags give them."""
    if policy is not RematPolicy.CUSTOM:
        return policy.value
    return f"custom ({' '.join(f'{name}={where.value}' for name, where in custom) or 'all recomputed'})"


def placements(policy: RematPolicy, custom: CustomPlacements = ()) -> dict[str, Placement]:
    """Where `policy` (with `custom`'s placements, under `custom`) puts each of `CHECKPOINT_NAMES`."""
    chosen = dict(custom) if policy is RematPolicy.CUSTOM else POLICY_PLACEMENTS[policy]
    return {n: chosen.get(n, Placement.REMAT) for n in CHECKPOINT_NAMES}


def layer_input_placement(policy: RematPolicy, custom: CustomPlacements = ()) -> Placement:
    """Where `policy` keeps each layer's input: DEVICE, or OFFLOAD under a `custom` policy that
    offloads `LAYER_INPUT` (MaxText's offloading presets name only projections)."""
    chosen = dict(custom) if policy is RematPolicy.CUSTOM else {}
    return chosen.get(LAYER_INPUT, Placement.DEVICE)


def names_at(policy: RematPolicy, where: Placement, custom: CustomPlacements = ()) -> tuple[str, ...]:
    """The checkpoint names `policy` puts at `where`, in `CHECKPOINT_NAMES` order."""
    return tuple(n for n, p in placements(policy, custom).items() if p is where)


def kept_names(policy: RematPolicy, custom: CustomPlacements = ()) -> tuple[str, ...]:
    """The checkpoint names `policy` keeps on device (what the runtime's jax policy saves)."""
    return names_at(policy, Placement.DEVICE, custom)


def offloaded_names(policy: RematPolicy, custom: CustomPlacements = ()) -> tuple[str, ...]:
    """The names `policy` offloads to host memory (what the runtime's jax policy offloads):
    `LAYER_INPUT` first where offloaded, then checkpoints in `CHECKPOINT_NAMES` order."""
    layer_input = (LAYER_INPUT,) if layer_input_placement(policy, custom) is Placement.OFFLOAD else ()
    return layer_input + names_at(policy, Placement.OFFLOAD, custom)


def recomputed(
    policy: RematPolicy, custom: CustomPlacements = (), *, model: "ModelSpec | None" = None
) -> tuple[str, ...]:
    """The checkpoints the backward under `policy` computes again: those it reads (`is_read`, in
    `model`'s block; a sequential one when no model) and neither keeps nor offloads."""
    return tuple(n for n in names_at(policy, Placement.REMAT, custom) if is_read(_BY_NAME[n], model))


@dataclass(frozen=True)
class RematCost:
    """Per-layer figures of remat choices (arrays, one entry per choice), per token and before the
    `tensor` split: every checkpoint and the layer input are split over `tensor`."""

    saved_on_device: np.ndarray  # values kept in HBM per token per layer, the layer input where kept there
    saved_on_host: np.ndarray  # values offloaded to host memory per token per layer, the layer input where offloaded
    offloaded_mlp_side: np.ndarray  # of the MLP's checkpoints, values offloaded per token
    kept_attention_side: np.ndarray  # of the attention side's checkpoints, values kept on device per token
    kept_mlp_side: np.ndarray  # of the MLP's checkpoints the backward reads, values kept on device per token
    kept_attention_operands: np.ndarray  # of `READ_BY_ATTENTION_BACKWARD`, values kept on device per token
    fetched_ahead: np.ndarray  # of the offloaded values, the layer input and `READ_BY_ATTENTION_BACKWARD`, per token
    recompute_qkv_out: np.ndarray  # fraction of the q/k/v and out projections' FLOPs recomputed
    recompute_mlp: np.ndarray  # fraction of the MLP matmuls' FLOPs recomputed
    recompute_attention: np.ndarray  # forward attention passes recomputed
    recompute_tensor_collectives: np.ndarray  # tensor-parallel gathers/scatters repeated
    widest_offloaded_whole: np.ndarray  # of the values offloaded a layer at a time (not per MLP chunk), the widest


def _row(model: ModelSpec, policy: RematPolicy, custom: CustomPlacements, offload_in_hbm: bool) -> tuple:
    def held(placement: Placement) -> Placement:  # where the value's HBM is counted
        return Placement.DEVICE if offload_in_hbm and placement is Placement.OFFLOAD else placement

    where = {n: held(p) for n, p in placements(policy, custom).items()}
    again = set(recomputed(policy, custom, model=model))

    def width(names, placement=None):
        return sum(
            _BY_NAME[n].width(model)
            for n in names
            if is_read(_BY_NAME[n], model) and (placement is None or where[n] is placement)
        )

    def fraction(block):  # of the block's matmul FLOPs
        sizes = {c.name: c.weight_size(model) for c in CHECKPOINTS if c.block is block}
        return sum(size for n, size in sizes.items() if n in again) / sum(sizes.values())

    # the backward gathers each gathered input again for its weight gradients whatever the policy keeps;
    # a recomputation shares that gather, and a parallel block gathers one normed input for both branches
    gathers = 1 if model.decoder_block.parallel else len({c.block for c in CHECKPOINTS if c.gathered_input})
    scatters = sum(c.scattered_output and c.name in again for c in CHECKPOINTS)
    attention_side = [c.name for c in CHECKPOINTS if c.block is not Block.MLP]
    mlp_side = [c.name for c in CHECKPOINTS if c.block is Block.MLP]
    layer_input = held(layer_input_placement(policy, custom))
    # each layer's copies to the host: the layer input and the attention side's values whole, the MLP's
    # a token chunk at a time (`MLP_CHUNK_TOKENS`)
    whole = [model.hidden * (layer_input is Placement.OFFLOAD)] + [
        _BY_NAME[n].width(model)
        for n in attention_side
        if where[n] is Placement.OFFLOAD and is_read(_BY_NAME[n], model)
    ]
    return (
        model.hidden * (layer_input is Placement.DEVICE) + width(CHECKPOINT_NAMES, Placement.DEVICE),
        model.hidden * (layer_input is Placement.OFFLOAD) + width(CHECKPOINT_NAMES, Placement.OFFLOAD),
        width(mlp_side, Placement.OFFLOAD),
        width(attention_side, Placement.DEVICE),
        width(mlp_side, Placement.DEVICE),
        width(READ_BY_ATTENTION_BACKWARD, Placement.DEVICE),
        model.hidden * (layer_input is Placement.OFFLOAD) + width(READ_BY_ATTENTION_BACKWARD, Placement.OFFLOAD),
        fraction(Block.ATTENTION_PROJECTIONS),
        fraction(Block.MLP),
        float(ATTENTION_OUTPUT in again),
        gathers + scatters,
        max(whole),
    )


@lru_cache(maxsize=64)
def remat_table(
    model: ModelSpec, custom: CustomPlacements = (), *, offload_in_hbm: bool = False, presets: tuple = ()
) -> RematCost:
    """What each policy of `POLICIES`, then each custom placement of `presets`, keeps and recomputes for `model`
    (worked out once per model: every priced column reads it; its arrays are read-only, as they are shared).

    Args:
        custom: the placements the `custom` row stands for.
        offload_in_hbm: count every offloaded value as kept on device, none on the host (for steps
            whose offloads do not leave HBM: `offloads_leave_hbm`).
        presets: further custom placements, a row each after `POLICIES`' (`remat_code`).
    """
    rows = [_row(model, p, custom, offload_in_hbm) for p in POLICIES]
    rows += [_row(model, RematPolicy.CUSTOM, preset, offload_in_hbm) for preset in presets]
    table = np.array(rows, dtype=float).T
    table.setflags(write=False)
    return RematCost(*table)


def choice_placements(custom: CustomPlacements = (), presets: tuple = ()) -> list[dict[str, Placement]]:
    """The placements of each row of `remat_table(model, custom, presets=presets)`."""
    return [placements(p, custom) for p in POLICIES] + [placements(RematPolicy.CUSTOM, c) for c in presets]


# At most this many layers, an offloading step on a chip that peels its layer loops is left with no
# layer loop (docs/provenance/cost_models.md#remat).
FLAT_OFFLOAD_MAX_LAYERS = 2


def offloads_leave_hbm(chip: Chip, num_layers: int) -> bool:
    """Whether a step's offloaded values are gone from HBM in its layers' backward: all but a step of one
    layer on a chip that peels the layer loops, whose one backward reads them as the host writes end."""
    return not chip.offload_peels_layer_loops or num_layers > 1


def flat_offload_program(chip: Chip, num_layers: int) -> bool:
    """Whether an offloading step of this depth is left with no layer loop and yet frees its offloaded
    values by its layers' backward: 2 to `FLAT_OFFLOAD_MAX_LAYERS` layers on a chip that peels the loops.
    Through its forward and the loss it holds what a loop would have freed (`flat_program_held`)."""
    return chip.offload_peels_layer_loops and 1 < num_layers <= FLAT_OFFLOAD_MAX_LAYERS


def remat_code(policy: RematPolicy, custom: CustomPlacements = (), presets: tuple = ()) -> int:
    """The row of `remat_table(..., presets=presets)` for `policy`: a custom policy placed as one of
    `presets` has that preset's row, any other policy its index in `POLICIES`."""
    if policy is RematPolicy.CUSTOM and custom in presets:
        return len(POLICIES) + presets.index(custom)
    return POLICIES.index(policy)
