"""The runtime a plan is priced for, and the implementation traits in which runtimes differ.

cpplan's own runtime (the default) and MaxText 0.2.5 run the same plan with different code. Where that
changes memory, time or what can run, the difference is a trait; the price and the search read traits,
never a target's name. Evidence per trait: docs/provenance/cost_models.md#targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from cost_models.chips import GroupedKernel
from cost_models.errors import CpplanError
from cost_models.models import DecoderBlock, ModelSpec
from cost_models.vocabulary import _Named
from cost_models.work_layout import MLP_CHUNK_TOKENS

# MaxText's splash metadata per head and (q block × kv block): int32 `data_next` and `mask_next`,
# int8 `block_mask` (overflows SMEM for Ulysses 8 at 128K with blocks of 512)
MAXTEXT_SMEM_BYTES_PER_BLOCK_PAIR = 4 + 4 + 1


# the largest block MaxText's ring dK/dV kernel compiles with: its fp32 accumulators overflow
# the 16 MiB scoped VMEM at 1024
MAXTEXT_RING_MAX_BLOCK = 512

# the weight-group sizes over which MaxText's compiler forms the head's weight gradient as a
# windowed-einsum loop: 8 to 32 (with 4, 64 or 128: one matmul and an all-reduce; 5-7 never compiled)
MAXTEXT_HEAD_GRADIENT_LOOP_DEVICES = (8, 32)

# MaxText's load-balanced all-gather restores the gathered K and V to natural order before splash
# (`reorder_sequence(..., to_contiguous=True)`); its compile (v5p-128, context 64, 64K) copies, slices,
# reverses and joins them in 10 gathered-K/V sizes of HBM bytes per forward and puts dK/dV back in 9
MAXTEXT_ZIGZAG_KV_REORDER_PASSES = (10.0, 9.0)


# from this many devices on the fsdp axis the TPU compiler forms the q/k/v projections (which cpplan's
# runtime leaves to the SPMD partitioner) as windowed einsums: with fsdp 8 on v5p and tpu7x, batch
# 8 and 16; not with fsdp 4, where context made the weight group 8 (docs/provenance/cost_models.md#communication)
WINDOWED_PROJECTION_FSDP = 8


class ModelKind(str, Enum):
    """A mechanism a model may hold beyond a dense grouped-query decoder, which a runtime runs or refuses;
    its value is how a refusal names it."""

    EXPERTS = "mixture-of-experts MLPs"
    LATENT_ATTENTION = "multi-head latent attention"
    QK_NORM = "q/k norms"
    ATTENTION_SINKS = "attention sinks"
    GLOBAL_HEADS = "global layers of their own head shape"
    SHARED_KV = "keys and values of one projection"
    INTERLEAVED_EXPERTS = "expert layers between dense ones"
    QKV_BIAS = "biases on q, k and v"
    PER_LAYER_INPUTS = "per-layer input embeddings"
    KV_SHARED_LAYERS = "layers that reuse an earlier layer's keys and values"


def model_kinds(model: ModelSpec) -> tuple[ModelKind, ...]:
    """The mechanisms beyond a dense grouped-query decoder that `model` holds, in `ModelKind`'s order (Gemma
    3's q/k norms are its block's, `DecoderBlock.GEMMA3`, which a runtime that runs the block runs)."""
    present = {
        ModelKind.EXPERTS: model.experts is not None,
        ModelKind.LATENT_ATTENTION: model.latent is not None,
        ModelKind.QK_NORM: model.qk_norm and model.decoder_block is not DecoderBlock.GEMMA3,
        ModelKind.ATTENTION_SINKS: model.attention_sinks,
        ModelKind.GLOBAL_HEADS: model.global_attention is not None,
        ModelKind.SHARED_KV: model.shared_kv,
        ModelKind.INTERLEAVED_EXPERTS: model.experts is not None and model.experts.every > 1,
        ModelKind.QKV_BIAS: model.qkv_bias,
        ModelKind.PER_LAYER_INPUTS: model.per_layer_inputs is not None,
        ModelKind.KV_SHARED_LAYERS: model.kv_shared_layers > 0,
    }
    return tuple(kind for kind in ModelKind if present[kind])


class Target(_Named):
    """The runtime that runs a plan: cpplan's own, or MaxText 0.2.5 (its exported flags)."""

    CPPLAN = "cpplan"
    MAXTEXT = "maxtext"

    @property
    def aliases(self):
        return {"CPPLAN": ("ours", "default")}.get(self.name, ())

    @classmethod
    def kind(cls) -> str:
        return "target"

    @property
    def traits(self) -> "TargetTraits":
        return TRAITS[self]


@dataclass(frozen=True)
class TargetTraits:
    """How one runtime implements what the price depends on.

    Attributes:
        target: the runtime.
        loss_splits_vocabulary: the loss forms each token chunk's logits one vocabulary piece at a time;
            otherwise each token tile holds its logits over the whole vocabulary (MaxText).
        logit_bytes: bytes of one logit as the loss holds it.
        layer_gradients_all_step: the layers' gradients are held all step, not only through their backward.
        ring_dq_partials: the ring's dK/dV kernel writes one fp32 partial dq per key block before summing.
        smem_bytes_per_block_pair: SMEM of splash's mask metadata per (q block × kv block); None: cpplan's.
        per_head_metadata: every head has its own splash metadata, rather than one table shared by heads.
        maxtext_rules: the search offers only plans that pass MaxText's own config checks (`maxtext_problems`).
        ring_kernel_max_block: the largest splash block the ring kernel compiles with (None: the VMEM rule only).
        offload_defers_head_gradient: under host offload the head's weight gradient is formed after the
            layers' backward, holding the logit gradient and the final norm's output through it.
        offload_holds_mlp_backward: under MLP-input offload a layer's backward holds the MLP's input
            projections and their gradients, all tokens, through the attention's backward.
        offload_defers_mlp_weight_gradients: under an offloading policy that recomputes the MLP but not the
            attention's output (kept, or offloaded), a layer's backward forms the MLP's weight gradients after
            the attention's backward, holding their operands through it: the input projections' recomputed
            outputs and their gradients, the gated product, the MLP's input and the layer output's gradient;
            where holding them passes XLA's rematerialization limit they are recomputed one at a time, down to
            one output and the gradient the rest are formed again from.
        offload_reads_next_layer_early: the backward layer loop starts its host reads of the next layer's
            offloaded values before this layer's attention backward, so they are held through it beside this
            layer's own (cpplan's runtime, read from its compile of the README's v5p:2x2x2 256K plan).
        head_gradient_loop_devices: the weight-group sizes (least, most) over which the head's weight gradient
            is a windowed-einsum loop, priced as deferred past the layers (the safe side); None: never.
        head_gradient_in_head_layout: the loss writes the head's gradient in the head's layout (no moves at the update).
        ring_hops_overlap_attention: a ring's K/V transfers overlap the attention of the block in hand.
        backward_shares_recomputed_hops: under a recomputed forward the backward's ring K/V hops are the
            recomputed forward's (its compiler shares them); cpplan's runtime sends them again.
        tokamax_ring_kernel: splash calls are the strategies' `maxtext_kernel_calls` (tokamax's kernels).
        weight_gathers_all_reduce_split_axes: where the weight group's axes split a physical dimension,
            weights are gathered as an all-reduce of zero-padded shards (twice the bytes).
        context_gradients_all_reduced: gradients of what is gathered over context are all-reduced, not scattered.
        mlp_chunk_tokens: tokens per device of one MLP chunk in a layer's backward (None: all at once).
        tokamax_splash_prunes_documents: the strategies it runs on tokamax's splash
            (`StrategySpec.maxtext_skips_other_documents`) skip the tiles whose segment ids do not meet
            (`cost_models.document_tiles`); elsewhere documents of varying length are computed as whole rows.
        kernels_prune_documents: every strategy's splash calls skip the tiles whose segment ids do not meet
            (cpplan's runtime prunes its tables by them, `runtime.splash.Kernel.with_segments`).
        windowed_projection_fsdp: the fsdp size from which a sequential block's q/k/v projections gather
            their weights and scatter their gradients as windowed einsums; None: never seen compiled.
        kv_buffers_working_set: where K/V are the strategy's buffers (a ring's hops, all-gather's gathered
            K/V) the attention's backward holds only what its kernels read and form (cpplan's runtime, read
            from its compiles); otherwise the whole working set is priced (tokamax's kernels, not read).
        layers_switch_masks: a model whose layers differ in mask runs each layer's attention as a switch
            between the masks' (cpplan's runtime, `runtime.model`), which the backward reruns whole whatever
            the policy keeps (read from its compiles).
        splash_rows_split_over_cores: a splash call is vmapped over groups of its (sequence × KV head) rows
            (of each packed row's own), one per core of the device (`compute.splash_row_groups`), so a
            megacore's two cores share even one sequence's backward (cpplan's runtime, `runtime.splash`);
            otherwise the calls are vmapped over the device's sequences alone (MaxText's
            layers/attention_op.py).
        fused_dq_partials_in_q_dtype: the fused backward's dq partials, one per key block, are in q's dtype
            (jax's splash, `_splash_attention_bwd_dkv`), not fp32 (tokamax's).
        fused_backward_in_key_chunks: a fused backward whose dq partials would pass their share of the HBM
            runs over chunks of its keys, each chunk's partials summed before the next
            (`compute.fused_backward_key_chunks`, cpplan's runtime, `runtime.splash.attend_bwd`).
        zigzag_kv_reorder_passes: (forward, backward) HBM bytes, in units of the gathered K/V's bytes, that a
            load-balanced all-gather layer moves outside the kernels laying the gathered K/V out in natural
            order (each forward, a recomputed one too) and their gradients back (the backward); None: not
            read from a compile (docs/measurements.md#all-gather-kv-reorder).
        table_split_on_hidden: the embedding table is split on its hidden dimension over the weight-sharding
            group and tensor (`runtime.model.embed_lookup`), so a slice off the TPU's lanes is copied into
            its lookup's layout (`pricing.memory.relaid_table_values`); False: no such copy read from a compile.
        expert_parallelism: runs the `expert` axis as expert parallelism (tokens sent to their experts'
            devices: MaxText); otherwise the axis is not searched (cpplan's runtime runs every expert on every
            device over its own tokens).
        model_kinds: the mechanisms beyond a dense grouped-query decoder (`ModelKind`) it runs; a model
            holding any other is refused (`model_refusal`). None: every kind (MaxText).
        grouped_kernel: the kernel of its experts' grouped matmuls, whose chip-row figures price them.
    """

    target: Target
    loss_splits_vocabulary: bool
    logit_bytes: int
    layer_gradients_all_step: bool
    ring_dq_partials: bool
    smem_bytes_per_block_pair: float | None
    per_head_metadata: bool
    maxtext_rules: bool
    ring_kernel_max_block: int | None = None
    offload_defers_head_gradient: bool = False
    offload_holds_mlp_backward: bool = False
    offload_defers_mlp_weight_gradients: bool = False
    offload_reads_next_layer_early: bool = False
    head_gradient_loop_devices: tuple[int, int] | None = None
    head_gradient_in_head_layout: bool = False
    ring_hops_overlap_attention: bool = True
    backward_shares_recomputed_hops: bool = False
    tokamax_ring_kernel: bool = False
    weight_gathers_all_reduce_split_axes: bool = False
    context_gradients_all_reduced: bool = False
    mlp_chunk_tokens: int | None = MLP_CHUNK_TOKENS
    tokamax_splash_prunes_documents: bool = False
    kernels_prune_documents: bool = False
    windowed_projection_fsdp: int | None = None
    kv_buffers_working_set: bool = False
    layers_switch_masks: bool = False
    splash_rows_split_over_cores: bool = False
    fused_dq_partials_in_q_dtype: bool = False
    fused_backward_in_key_chunks: bool = False
    zigzag_kv_reorder_passes: tuple[float, float] | None = None
    table_split_on_hidden: bool = False
    model_kinds: frozenset[ModelKind] | None = None
    expert_parallelism: bool = False
    grouped_kernel: GroupedKernel = GroupedKernel.TOKAMAX

    def prunes_documents(self, spec) -> bool:
        """Whether strategy `spec`'s kernel on this runtime skips the tiles of other packed documents of
        varying length (a fixed length is a static mask every kernel skips by)."""
        return self.kernels_prune_documents or (
            self.tokamax_splash_prunes_documents and spec.maxtext_skips_other_documents
        )


TRAITS: dict[Target, TargetTraits] = {
    # cpplan's runtime: a fused, chunked cross-entropy; one downcast metadata table shared by heads;
    # the head's gradient formed in the head's layout; splash tables pruned by segment ids; grouped-query
    # decoders, dense or with mixture-of-experts MLPs (`runtime.experts`), q, k and v with or without biases
    Target.CPPLAN: TargetTraits(
        Target.CPPLAN,
        model_kinds=frozenset({ModelKind.EXPERTS, ModelKind.QKV_BIAS}),
        grouped_kernel=GroupedKernel.XLA_RAGGED_DOT,
        loss_splits_vocabulary=True,
        logit_bytes=4,
        layer_gradients_all_step=True,
        ring_dq_partials=False,
        smem_bytes_per_block_pair=None,
        per_head_metadata=False,
        maxtext_rules=False,
        head_gradient_in_head_layout=True,
        kernels_prune_documents=True,
        windowed_projection_fsdp=WINDOWED_PROJECTION_FSDP,
        kv_buffers_working_set=True,
        layers_switch_masks=True,
        splash_rows_split_over_cores=True,
        fused_dq_partials_in_q_dtype=True,
        fused_backward_in_key_chunks=True,
        offload_reads_next_layer_early=True,
        table_split_on_hidden=True,
    ),
    # MaxText 0.2.5, as its source and deviceless compiles show
    Target.MAXTEXT: TargetTraits(
        Target.MAXTEXT,
        loss_splits_vocabulary=False,
        logit_bytes=4,
        layer_gradients_all_step=False,
        ring_dq_partials=True,
        smem_bytes_per_block_pair=MAXTEXT_SMEM_BYTES_PER_BLOCK_PAIR,
        per_head_metadata=True,
        maxtext_rules=True,
        ring_kernel_max_block=MAXTEXT_RING_MAX_BLOCK,
        offload_defers_head_gradient=True,
        offload_holds_mlp_backward=True,
        offload_defers_mlp_weight_gradients=True,
        head_gradient_loop_devices=MAXTEXT_HEAD_GRADIENT_LOOP_DEVICES,
        ring_hops_overlap_attention=False,
        backward_shares_recomputed_hops=True,
        tokamax_ring_kernel=True,
        weight_gathers_all_reduce_split_axes=True,
        context_gradients_all_reduced=True,
        mlp_chunk_tokens=None,
        tokamax_splash_prunes_documents=True,
        zigzag_kv_reorder_passes=MAXTEXT_ZIGZAG_KV_REORDER_PASSES,
        expert_parallelism=True,
    ),
}


def get_target(target: "str | Target | None", model: ModelSpec | None = None) -> Target:
    """A target by name; None: cpplan's own runtime, or MaxText for a `model` that cpplan's runtime does
    not run (`model_refusal`).

    Raises:
        CpplanError: an unknown name (listing the known ones), or a target that does not run `model`.
    """
    if target is None:
        return Target.MAXTEXT if model is not None and model_refusal(Target.CPPLAN, model) else Target.CPPLAN
    chosen = Target.parse(target)
    refusal = model_refusal(chosen, model) if model is not None else None
    if refusal:
        raise CpplanError(f"target {chosen.value!r}: {refusal}")
    return chosen


def model_refusal(target: Target, model: ModelSpec) -> str | None:
    """Why `target` does not run `model` (None: it does): the mechanisms the model holds that the target's
    `TargetTraits.model_kinds` leaves out."""
    runs = target.traits.model_kinds
    if runs is None:
        return None
    refused = [kind.value for kind in model_kinds(model) if kind not in runs]
    if not refused:
        return None
    ran = " or ".join(kind.value for kind in ModelKind if kind in runs)
    return (
        f"model {model.name!r} has {' and '.join(refused)}, which cpplan's runtime does not run (it runs "
        f"grouped-query decoders{', dense or with ' + ran if ran else ''}); plan and price it for MaxText "
        f"(`--target maxtext`, the default for such models) and run it there (`cpplan export --format maxtext`)."
    )
