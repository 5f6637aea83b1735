"""What each remat policy keeps for the backward pass, by MaxText's checkpoint names: the one
table from which both the price (bytes kept on device or in host memory, work recomputed) and
the runtime's jax checkpoint policy are derived.

The policies are MaxText's, read from its decoder (`Decoder.minimal_policy` and
`Decoder.get_remat_policy` in src/maxtext/layers/decoders.py, and
`maxtext_utils.get_save_and_offload_names` in src/maxtext/utils/maxtext_utils.py, repository
AI-Hypercomputer/maxtext at tag maxtext-v0.2.4, commit 538fe7a3f3376d94cf3f04e77741aa6d7e8efa45;
the per-name `custom` choices from src/maxtext/configs/base.yml there). A policy saves some
names on device (`save_only_these_names`), offloads some to pinned host memory
(`save_and_offload_only_these_names(offload_src="device", offload_dst="pinned_host")`) and
recomputes the rest from the layer input (MaxText's `decoder_layer_input`, here the scanned
layer's carry), which every policy keeps: on device, or, under `custom` with
`decoder_layer_input=offload` (as tpu-recipes' Llama 3.1 runs on v6e set it), in host memory.

Where our decoder's names differ from MaxText's:
- MaxText also names fused projections (`qkv_proj`, `kv_proj`, and `mlpwi` for a fused
  gate/up); a Llama decoder in either runs them unfused, so they map onto q/k/v and the two MLP
  inputs (`MAXTEXT_NAMES`).
- A plain (non-gated) MLP has one input projection: MaxText names it `mlpwi`, ours `mlpwi_0`
  (which `mlpwi` maps onto); `mlpwi_1` exists only in a gated MLP (width 0 otherwise).
- MaxText names the attention output twice, `context` (inside the attention op, with the
  log-sum-exp) and `attention_out` (after it); ours is `context`, output and log-sum-exp alike.
- As in MaxText, `query_proj` and `key_proj` are named after RoPE.
- `out_proj` and `mlpwo` are named after the reduce-scatter that ends their tensor-parallel
  matmul, so, like every other checkpoint and the layer input, they are split over `tensor`
  (sequence parallelism between the tensor-parallel matmuls).
- MaxText names MoE, MLA and other blocks' values too (`moe_mlpwi_0`, `mla_q`, ...); a dense
  Llama decoder has none, so a placement for them changes nothing.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

import numpy as np

from cost_models.chips import Chip
from cost_models.errors import CpplanError, unknown_name
from cost_models.models import ModelSpec
from cost_models.vocabulary import Placement, RematPolicy

POLICIES = tuple(RematPolicy)

# The attention output's name: splash's own residuals (its output and log-sum-exp) and the ring's
# go by it, so a policy that keeps "context" does not run the attention forward again. The layer's
# layout of that output is left unnamed (as in MaxText's attention op): it is kept once.
ATTENTION_OUTPUT = "context"


class Block(str, Enum):
    """The sub-block of a decoder layer a checkpoint belongs to."""

    ATTENTION_PROJECTIONS = "attention projections"
    ATTENTION = "attention"
    MLP = "mlp"


@dataclass(frozen=True)
class Checkpoint:
    """One named value of a decoder layer.

    `read_by_backward`: whether the backward of a sequential (Llama) layer reads the value. The
    MLP's output only enters the residual sum, whose result is the next layer's input (kept
    there), so nothing reads it: keeping it costs nothing and recomputing it never happens (jax
    drops unread recomputation). In a parallel block the out projection is such a value too
    (`is_read`).
    `gathered_input`: the value is a matmul whose input is all-gathered over `tensor` first
    (sequence parallelism): recomputing it repeats that gather.
    `scattered_output`: the value is reduce-scattered over `tensor` after its matmul:
    recomputing it repeats that reduce-scatter.
    """

    name: str
    block: Block
    read_by_backward: bool = True
    gathered_input: bool = False
    scattered_output: bool = False

    def width(self, model: ModelSpec) -> int:
        """Values per token of this checkpoint, before the tensor split."""
        kv = model.num_kv_heads * model.head_dim
        return {"query_proj": model.num_heads * model.head_dim, "key_proj": kv, "value_proj": kv,
                "out_proj": model.hidden, "mlpwi_0": model.intermediate,
                "mlpwi_1": model.intermediate if model.gated else 0,
                "mlpwo": model.hidden, ATTENTION_OUTPUT: model.num_heads * model.head_dim}[self.name]

    def is_matmul(self) -> bool:
        return self.block is not Block.ATTENTION

    def weight_size(self, model: ModelSpec) -> int:
        """Weights of the matmul that computes this checkpoint (its FLOPs per token, halved)."""
        if not self.is_matmul():
            raise CpplanError(f"checkpoint {self.name!r} is the attention's output, not a matmul's.")
        inner = model.intermediate if self.block is Block.MLP else model.num_heads * model.head_dim
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
QKV_CHECKPOINTS = tuple(c.name for c in CHECKPOINTS if c.block is Block.ATTENTION_PROJECTIONS and c.gathered_input)
MLP_INPUT_CHECKPOINTS = tuple(c.name for c in CHECKPOINTS if c.block is Block.MLP and c.gathered_input)
_BY_NAME = {c.name: c for c in CHECKPOINTS}
# The offloaded checkpoints a layer's attention backward reads, besides its input (the first norm's,
# for the q/k/v weight gradients): q, k, v and the attention output (the kernel's backward). The out projection,
# read only to form the MLP's input, and the MLP's own values, offloaded chunk by chunk inside the
# chunk loop and fetched chunk by chunk, are not among them. The backward's layer loop pipelines its
# host reads: the copies back of a layer's offloaded values start in the previous iteration and are
# carried into the layer's own, so they are in HBM from the start of its backward, and each stays
# until its last reader; the MLP's backward runs first, so these are held through it
# (`RematCost.fetched_ahead`). Read in deviceless compiles at 8 layers, where the layer loops stay
# (libtpu 0.0.52; the backward loop's carried `dynamic-slice-done`s on the host stacks, live at the
# MLP's peak): v5p `minimal_offloaded`, fsdp 4 x tensor 2 (q, k, v: 96 MiB); checked on v5p
# `qkv_proj_offloaded` and `custom` with the layer input (its input, 64 MiB, and q, k, v), tpu7x
# `custom` (q, 64 MiB), the 16-layer compiles, and v5p `custom` with the attention output offloaded
# (benchmarks/results/bench_memory_offload.md, session 6).
READ_BY_ATTENTION_BACKWARD = (*QKV_CHECKPOINTS, ATTENTION_OUTPUT)


def is_read(checkpoint: Checkpoint, model: "ModelSpec | None" = None) -> bool:
    """Whether the backward of `model`'s layer reads the value (a sequential block when no model).

    In a parallel block (`DecoderBlock.DEFAULT`) both reduce-scattered outputs, the out
    projection's and the MLP's, only enter the residual sum: no second norm reads the out
    projection, so, like the MLP's output, it is never kept nor recomputed.
    """
    parallel = model is not None and model.decoder_block.parallel
    return checkpoint.read_by_backward and not (parallel and checkpoint.scattered_output)
_MATMULS = tuple(c.name for c in CHECKPOINTS if c.is_matmul())  # MaxText's minimal_policy names

# MaxText's checkpoint names → ours (see the module docstring); a name of a block a dense Llama
# decoder does not have maps to nothing.
MAXTEXT_NAMES: dict[str, tuple[str, ...]] = {
    **{name: (name,) for name in CHECKPOINT_NAMES},
    "qkv_proj": QKV_CHECKPOINTS, "kv_proj": QKV_CHECKPOINTS[1:], "mlpwi": MLP_INPUT_CHECKPOINTS,
    "attention_out": (ATTENTION_OUTPUT,),
    **{name: () for name in ("moe_mlpwi_0", "moe_mlpwi_1", "moe_mlpwo", "query_wa_proj", "kv_wa_proj", "mla_q",
                             "mla_kv", "engram", "indexer_cutoff_threshold")},
}
# MaxText's name for a layer's input, the point every recomputation of the layer starts from
# (`checkpoint_name(inputs, "decoder_layer_input")` at the top of each of its decoder layers).
# MaxText 0.2.5 takes device, offload or remat for it (`RematLocation` in configs/types.py; the
# assertion against remat lived only in its older pyconfig_deprecated.py). Remat keeps it on
# device all the same: the name then is neither saved nor offloaded, and jax keeps a checkpointed
# function's own input for its backward. So it is device unless offloaded.
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

# The policies the search tries unless told otherwise. Each policy multiplies the candidates the
# search prices, so it tries three that span the trade: keep nothing (least memory), keep the
# attention projections (recompute attention and MLP: the usual long-context choice), keep
# everything (no recomputation). The others lie between these in both memory and time; the
# offloaded ones also use host memory, which the host shares with the input pipeline, so they are
# tried only when asked for (`--remat`), as is `custom`, which needs a placement per name.
SEARCHED_POLICIES = (RematPolicy.FULL, RematPolicy.SAVE_DOT_EXCEPT_MLP, RematPolicy.MINIMAL_WITH_CONTEXT)

# Every policy a search can try: all but `custom`, which needs the plan's own placements.
NAMED_POLICIES = tuple(p for p in RematPolicy if p is not RematPolicy.CUSTOM)

# ((name, Placement), ...) in `CUSTOM_NAMES` order; REMAT left out, and the layer input only there when offloaded
CustomPlacements = tuple
# The names a custom policy places: the layer input, then the checkpoints
CUSTOM_NAMES = (LAYER_INPUT, *CHECKPOINT_NAMES)


def custom_placements(choices: "Mapping[str, object] | Iterable[tuple[str, object]]", *,
                      maxtext_names: bool = False) -> CustomPlacements:
    """A custom policy's placements in canonical form (the form `Plan.remat_custom` holds).

    Args:
        choices: checkpoint name (or `LAYER_INPUT`) → placement (a `Placement` or its name:
            device, offload, remat). The layer input is on device unless offloaded (see
            `LAYER_INPUT` for why remat means device there).
        maxtext_names: also accept MaxText's names (`MAXTEXT_NAMES`: qkv_proj, mlpwi, ...), spread
            over ours.
    Returns:
        `((name, Placement), ...)` in `CUSTOM_NAMES` order: every checkpoint not recomputed, and
        the layer input when offloaded.
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
                raise CpplanError(f"{LAYER_INPUT} is given two placements, {out[name].value} and {where.value}; "
                                  f"give it one.")
            out[name] = where
            continue
        if name not in known:
            raise unknown_name("checkpoint name", name, (LAYER_INPUT, *known))
        for ours in known[name]:
            if out.get(ours, where) is not where:
                raise CpplanError(f"checkpoint {ours!r} is given two placements, {out[ours].value} and "
                                  f"{where.value} (via {name!r}); give it one.")
            out[ours] = where
    return tuple((n, out[n]) for n in CUSTOM_NAMES if out.get(n, Placement.REMAT) is not Placement.REMAT
                 and (n != LAYER_INPUT or out[n] is Placement.OFFLOAD))


def placements(policy: RematPolicy, custom: CustomPlacements = ()) -> dict[str, Placement]:
    """Where `policy` puts every checkpoint of a layer.

    Args:
        policy: the policy.
        custom: the placements of a `custom` policy (`custom_placements`); ignored otherwise.
    Returns:
        checkpoint name → `Placement`, for every name in `CHECKPOINT_NAMES`.
    """
    chosen = dict(custom) if policy is RematPolicy.CUSTOM else POLICY_PLACEMENTS[policy]
    return {n: chosen.get(n, Placement.REMAT) for n in CHECKPOINT_NAMES}


def layer_input_placement(policy: RematPolicy, custom: CustomPlacements = ()) -> Placement:
    """Where `policy` keeps each layer's input: DEVICE, or OFFLOAD under a `custom` policy that
    offloads `LAYER_INPUT` (no named policy does: MaxText's offloading presets name only the
    projections)."""
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


def recomputed(policy: RematPolicy, custom: CustomPlacements = (), *, model: "ModelSpec | None" = None
               ) -> tuple[str, ...]:
    """The checkpoints the backward under `policy` computes again: those it reads (`is_read`, in
    `model`'s block; a sequential one when no model) and neither keeps nor offloads."""
    return tuple(n for n in names_at(policy, Placement.REMAT, custom) if is_read(_BY_NAME[n], model))


@dataclass(frozen=True)
class RematCost:
    """Per-layer figures of remat choices (numpy arrays, one entry per choice).

    Every value is per token and before the `tensor` split; every checkpoint and the layer input
    are split over `tensor` (heads, MLP columns, or the sequence between the tensor-parallel
    matmuls), so a device holds these divided by `tensor`.
    """

    saved_on_device: np.ndarray  # values kept in HBM per token per layer, the layer input where kept there
    saved_on_host: np.ndarray  # values offloaded to host memory per token per layer, the layer input where offloaded
    kept_attention_side: np.ndarray  # of the attention side's checkpoints, values kept on device per token
    kept_mlp_side: np.ndarray  # of the MLP's checkpoints the backward reads, values kept on device per token
    fetched_ahead: np.ndarray  # of the offloaded values, the layer input and `READ_BY_ATTENTION_BACKWARD`, per token
    recompute_qkv_out: np.ndarray  # fraction of the q/k/v and out projections' FLOPs recomputed
    recompute_mlp: np.ndarray  # fraction of the MLP matmuls' FLOPs recomputed
    recompute_attention: np.ndarray  # forward attention passes recomputed
    recompute_tensor_collectives: np.ndarray  # tensor-parallel gathers/scatters repeated


def _row(model: ModelSpec, policy: RematPolicy, custom: CustomPlacements, offload_in_hbm: bool) -> tuple:
    def held(placement: Placement) -> Placement:  # where the value's HBM is counted
        return Placement.DEVICE if offload_in_hbm and placement is Placement.OFFLOAD else placement

    where = {n: held(p) for n, p in placements(policy, custom).items()}
    again = set(recomputed(policy, custom, model=model))

    def width(names, placement=None):
        return sum(_BY_NAME[n].width(model) for n in names
                   if is_read(_BY_NAME[n], model) and (placement is None or where[n] is placement))

    def fraction(block):  # of the block's matmul FLOPs
        sizes = {c.name: c.weight_size(model) for c in CHECKPOINTS if c.block is block}
        return sum(size for n, size in sizes.items() if n in again) / sum(sizes.values())

    # the backward gathers each gathered input again for its weight gradients whatever the policy
    # keeps (checkpoints are matmul outputs, never a gathered input); a recomputation shares it. A
    # parallel block gathers one normed input for both branches. Read in TPU compiles of both
    # blocks (benchmarks/results/compiler_counts.txt: the tpu7x parallel block under
    # minimal_with_context gathers 3 times over tensor per layer, not 2)
    gathers = 1 if model.decoder_block.parallel else len({c.block for c in CHECKPOINTS if c.gathered_input})
    scatters = sum(c.scattered_output and c.name in again for c in CHECKPOINTS)
    attention_side = [c.name for c in CHECKPOINTS if c.block is not Block.MLP]
    mlp_side = [c.name for c in CHECKPOINTS if c.block is Block.MLP]
    layer_input = held(layer_input_placement(policy, custom))
    return (model.hidden * (layer_input is Placement.DEVICE) + width(CHECKPOINT_NAMES, Placement.DEVICE),
            model.hidden * (layer_input is Placement.OFFLOAD) + width(CHECKPOINT_NAMES, Placement.OFFLOAD),
            width(attention_side, Placement.DEVICE), width(mlp_side, Placement.DEVICE),
            model.hidden * (layer_input is Placement.OFFLOAD)
            + width(READ_BY_ATTENTION_BACKWARD, Placement.OFFLOAD),
            fraction(Block.ATTENTION_PROJECTIONS), fraction(Block.MLP), float(ATTENTION_OUTPUT in again),
            gathers + scatters)


def remat_table(model: ModelSpec, custom: CustomPlacements = (), *, offload_in_hbm: bool = False) -> RematCost:
    """What each policy (indexed by `remat_code`) keeps and recomputes for `model`.

    Args:
        model: the model.
        custom: the placements the `custom` row stands for.
        offload_in_hbm: the HBM a policy holds where its offloaded values stay in HBM as well
            (`offloads_leave_hbm` false): each is counted as kept on device, none as on the host.
    Returns:
        The `RematCost` columns, one entry per policy of `POLICIES`.
    """
    return RematCost(*np.array([_row(model, p, custom, offload_in_hbm) for p in POLICIES], dtype=float).T)


# At most this many layers, an offloading step on a chip whose compiler peels its layer loops (the
# row's `offload_peels_layer_loops`) has no layer loop, and its offloads do not leave HBM. To
# pipeline host transfers the compiler peels one iteration off each layer loop; at 2 layers that
# leaves loops of one trip, which it inlines, and in that flat program it completes each offloaded
# value's host write late, next to the backward's read, so the device copy is held through the step
# (1 layer: no loop at all). The compiles it was read from and checked on are cited in the chip rows
# (benchmarks/results/bench_memory_offload.md, session 9, has the figures).
FLAT_OFFLOAD_MAX_LAYERS = 2


def offloads_leave_hbm(chip: Chip, num_layers: int) -> bool:
    """Whether a step's offloaded values leave HBM once written to the host: where the chip's
    compiler does not peel the layer loops (not seen off TPUs), or where the loops survive the peel
    (more than `FLAT_OFFLOAD_MAX_LAYERS` layers)."""
    return not chip.offload_peels_layer_loops or num_layers > FLAT_OFFLOAD_MAX_LAYERS


def remat_code(policy: RematPolicy) -> int:
    """The policy's index in `POLICIES` (the rows of `remat_table`)."""
    return POLICIES.index(policy)
