"""The runtime a plan is priced for, and the implementation traits in which runtimes differ.

cpplan's own runtime (`Target.CPPLAN`, the default) and MaxText 0.2.5 (`Target.MAXTEXT`) run the
same plan with different code. Where that changes the memory, the time or what can run at all,
the difference is a trait here, each saying where it was read in MaxText's installed source or
seen in its deviceless compiles; the price and the search read traits, never a target's name.
"""
from __future__ import annotations

from dataclasses import dataclass

from cost_models.vocabulary import _Named
from cost_models.work_layout import MLP_CHUNK_TOKENS

# MaxText's splash metadata (tokamax's splash_attention_mask_info, as MaxText builds it): per head,
# `data_next` and `mask_next` (int32) and `block_mask` (int8) for every (q block × kv block). Ulysses
# 8 at 128K overflows the 1 MiB SMEM at blocks of 512 (4 heads: 2.4 MB) and fits at 1024, as its
# compiles showed (shared/ANCHORS.md).
MAXTEXT_SMEM_BYTES_PER_BLOCK_PAIR = 4 + 4 + 1


# MaxText's ring (tokamax's ring kernel) runs its dK/dV kernel with fp32 accumulators in scoped
# VMEM: at blocks of 1024 it needs 16.85 MiB > the compiler's 16 MiB (llama3.1-8b, ring 4 at 64K on
# v5p-8, its train_compile: CompileTimeScopedVmemOom in splash_mha_dkv_segmented_no_residuals), at
# 512 it compiles (the same plan, 47.3 GiB per device)
MAXTEXT_RING_MAX_BLOCK = 512

# MaxText 0.2.5's TPU compiles of llama3.1-8b (full remat, dumped HLO: bench_maxtext_offload.md) form
# the output head's weight gradient as a windowed-einsum loop (`bf16[2,512,128256]` matmuls in a
# while) when it is reduce-scattered over 8 devices or more (v5p-16 ring 8 and all-gather 8, tpu7x-8
# USP 4×2 and ring 8), as one matmul and an all-reduce (`bf16[4096,128256]`) over 4 (v5p-8 ring 4 at
# 64K, 128K and 256K, even with libtpu's windowed-einsum threshold at 0 MiB). Only the loop is
# deferred in full remat: after the layers' backward for ring 8 × 128K on v5p-16 (35.02 GiB; 31.52
# with the loop turned off, --xla_tpu_enable_windowed_einsum_for_reduce_scatter=false) and USP 4×2 ×
# 64K on tpu7x-8, before it for ring 8 × 64K (22.34 GiB) and all-gather 8 × 128K (26.14) on v5p-16.
# No compile over 5-7 devices was made.
MAXTEXT_HEAD_GRADIENT_LOOP_DEVICES = 8


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
        loss_splits_vocabulary: the loss forms each token chunk's logits one piece of the
            vocabulary at a time (cpplan's fused cross-entropy); otherwise each token tile holds
            its logits over the whole vocabulary at once (MaxText: `num_vocab_tiling` splits
            tokens, not the vocabulary — maxtext/utils/vocabulary_tiling.py reshapes the hidden
            states to (num_vocab_tiling, tokens / num_vocab_tiling, emb)).
        logit_bytes: bytes of one logit as the loss holds it (fp32 in both).
        layer_gradients_all_step: the decoder layers' gradients are held all step (cpplan's
            runtime); otherwise only while the layers run backward, after the loss has freed its
            logits (MaxText: the scanned layers' gradients are the backward loop's results). The
            loss then holds the output head gathered whole and its fp32 gradient before the
            reduce-scatter.
        ring_dq_partials: the ring's dK/dV kernel writes one fp32 partial dq per key block, all
            of them before they are summed: f32[kv_len / block_kv, heads, q_len, head_dim] per
            sequence (MaxText: tokamax's `splash_mha_dkv_segmented_no_residuals` in its ring
            kernel, read in the compiled HLO of its train_compile, e.g. f32[16,32,8192,128] for
            32 heads of 8192 tokens at blocks of 512); cpplan's ring accumulates dq in place.
            They live only around the kernel, in a layer's backward (its dumped buffer
            assignments: ring 4 at 128K, 144K and 256K on v5p-8, USP 4×2 at 64K on tpu7x-8, each
            peaking there, with the loss's logits freed or, where the head's gradient is
            deferred, its logit gradient held).
        smem_bytes_per_block_pair: SMEM of splash's mask metadata per (q block × kv block);
            `per_head_metadata` says whether every head has its own (MaxText's tokamax splash
            over a multi-head mask, for Ulysses: the strategies' `maxtext_per_head_metadata`) or
            all share one (cpplan; MaxText's jax splash for all-gather, which compiled at 512K
            with blocks of 512 on v5p-16, and its ring kernel, which takes a single-head mask with
            downcast metadata, tokamax_ring_attention.py).
        per_head_metadata: see `smem_bytes_per_block_pair`.
        ring_kernel_max_block: the largest splash block the target's ring kernel compiles with
            (None: no limit beyond the shared VMEM rule).
        maxtext_rules: the search offers only plans that pass the strategies' `maxtext_problems`
            (MaxText's own configs/types.py checks), so an exported plan is never refused.
        offload_defers_head_gradient: under a remat policy that offloads to the host, the
            output head's weight gradient is formed after the decoder layers' backward, so the
            loss's logit gradient (tokens × vocabulary over tensor, in the compute dtype) and the
            final norm's output (tokens × hidden) are held through every layer's backward (MaxText:
            its compile of llama3.1-8b, ring 4 × 128K on v5p-8 under `minimal_offloaded` holds
            `bf16[32768,128256]` from the loss to the head's `dot_general` after the backward layer
            loop, and so at 144K; its `remat_policy=full` twins at 128K and 256K form the head's
            gradient in the loss and hold only that, `bf16[4096,128256]`). cpplan's runtime
            finishes each layer's gradients in its layer (`runtime/layer_gradients.py`).
        head_gradient_loop_devices: from how many devices of the weight group (fsdp × both
            context axes) the target's compiler forms the head's weight gradient as a
            windowed-einsum loop (collective matmul: the fp32 shard accumulated while the logit
            gradient's pieces pass round the group) instead of one matmul and an all-reduce
            (None: never). Its scheduler may place that loop after the layers' backward, holding
            the logit gradient through it, whatever the policy; whether it does is not a rule of
            the program, so it is priced as held wherever the loop is: the verdict-safe side
            (`MAXTEXT_HEAD_GRADIENT_LOOP_DEVICES` gives the compiles). Either deferral needs a
            loss of one vocabulary tile: with `num_vocab_tiling` > 1 MaxText's loss is a custom VJP whose
            backward sums the head's gradient over its tiles (utils/vocabulary_tiling.py; its tpu7x
            ring 8 × 64K compile at 2 tiles holds only that sum, `f32[512,128256]`).
        offload_holds_mlp_backward: under a policy that offloads the MLP's input projections, a
            layer's backward holds the MLP's input-projection outputs and their gradients, for
            all the device's tokens (MaxText does not chunk its MLP), through the attention's
            backward: the compiler schedules the MLP's weight-gradient matmuls after the
            attention's kernels (the same compile: the two `bf16[32768,14336]` values fetched from
            the host and the two gradients made from them are live at the ring's dK/dV kernel, and
            read by the `mlpwi` weight-gradient fusions after it; its twin holds none of them there).
        head_gradient_in_head_layout: the loss writes the output head's gradient into the head's
            own layout, so the optimizer's update writes over the head and its moments in place
            (cpplan's runtime: `runtime/loss.py`'s backward writes each vocabulary piece's
            gradient into its columns; its deviceless tpu7x compiles alias the update's outputs to
            the head and both moments). Otherwise the update holds the head and its moments moved
            into the gradient's layout (`optimizer_update`). MaxText's update was not read in its
            compiles (every one of its bench_maxtext plans peaks in the layers' backward), so it
            is priced with the moves: the larger figure.
        ring_hops_overlap_attention: the compiler schedules a ring's K/V transfers around the
            attention of the block in hand (cpplan's runtime: the overlap it compiles with,
            `cost_models.overlap`); otherwise they are waited for (MaxText: its compiled ring and
            USP steps at 64 devices put no kernel between a forward hop's collective-permute start
            and done; docs/measurements.md).
        tokamax_ring_kernel: the splash calls are the strategies' `maxtext_kernel_calls`: the
            ring's hops (ring, USP) on tokamax's ring kernel with the fused backward (MaxText:
            tokamax ring_attention_kernel.py; its build_splash_config sets use_fused_bwd_kernel=True),
            the other strategies' on its default splash.
        weight_gathers_all_reduce_split_axes: where the weight group's axes split a physical
            dimension between them, the compiler gathers each weight as an all-reduce of
            zero-padded shards (twice an all-gather's bytes); MaxText: USP 8 × 8 and 32 × 2 on
            v5p-128, not all-gather, ring or USP 16 × 4 (docs/measurements.md).
        context_gradients_all_reduced: the gradients of what is gathered over the context axes
            (the weights, all-gather's K/V) are all-reduced whole rather than reduce-scattered;
            MaxText: every strategy at 64 devices (docs/measurements.md).
        mlp_chunk_tokens: tokens per device of one MLP chunk in a layer's backward (cpplan's
            runtime: `MLP_CHUNK_TOKENS`, each chunk its own checkpoint), or None where the MLP runs
            on all the device's tokens at once (MaxText: its `MlpBlock` has no chunk loop; its
            compiles hold `bf16[tokens, intermediate]` values, e.g. `bf16[32768,14336]` above).
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
    head_gradient_loop_devices: int | None = None
    head_gradient_in_head_layout: bool = False
    ring_hops_overlap_attention: bool = True
    tokamax_ring_kernel: bool = False
    weight_gathers_all_reduce_split_axes: bool = False
    context_gradients_all_reduced: bool = False
    mlp_chunk_tokens: int | None = MLP_CHUNK_TOKENS


TRAITS: dict[Target, TargetTraits] = {
    # cpplan's runtime: a fused, chunked cross-entropy over vocabulary pieces; masks evaluated in
    # the kernel; one downcast metadata table shared by heads (cost_models.compute prices its SMEM);
    # the head's gradient formed in the head's layout
    Target.CPPLAN: TargetTraits(Target.CPPLAN, loss_splits_vocabulary=True, logit_bytes=4,
                                layer_gradients_all_step=True,
                                ring_dq_partials=False, smem_bytes_per_block_pair=None,
                                per_head_metadata=False, maxtext_rules=False, head_gradient_in_head_layout=True),
    # MaxText 0.2.5: full-vocabulary fp32 logits per token tile; its ring kernel's per-key-block dq
    # partials (at head_dim 128 and blocks of 512, one byte per head × local query × local key, around
    # the kernel: shared/ANCHORS.md, bench_maxtext and its offload notes); splash metadata per head,
    # int32, for Ulysses; the head's gradient deferred past the layers under offload and where it is a
    # windowed-einsum loop, and the offloaded MLP values held through the attention's backward
    # (bench_maxtext_offload.md)
    Target.MAXTEXT: TargetTraits(Target.MAXTEXT, loss_splits_vocabulary=False, logit_bytes=4,
                                 layer_gradients_all_step=False,
                                 ring_dq_partials=True,
                                 smem_bytes_per_block_pair=MAXTEXT_SMEM_BYTES_PER_BLOCK_PAIR,
                                 per_head_metadata=True, maxtext_rules=True,
                                 ring_kernel_max_block=MAXTEXT_RING_MAX_BLOCK,
                                 offload_defers_head_gradient=True, offload_holds_mlp_backward=True,
                                 head_gradient_loop_devices=MAXTEXT_HEAD_GRADIENT_LOOP_DEVICES,
                                 ring_hops_overlap_attention=False, tokamax_ring_kernel=True,
                                 weight_gathers_all_reduce_split_axes=True,
                                 context_gradients_all_reduced=True,
                                 mlp_chunk_tokens=None),
}


def get_target(target: "str | Target | None") -> Target:
    """A target by name (None: cpplan's own runtime).

    Raises:
        CpplanError: an unknown name (listing the known ones).
    """
    return Target.CPPLAN if target is None else Target.parse(target)
