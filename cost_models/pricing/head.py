"""The output head and the loss on one device: the projection to the vocabulary on the MXU and
the fp32 cross-entropy over its logits (HBM bound); with them, the other matmuls outside the layers: the
input embedding's projection to every layer's per-layer inputs (Gemma 4 E2B and E4B), and the input
embedding itself where it is looked up as a one-hot matmul (`Plan.one_hot_embedding`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.candidates import Candidates
from cost_models.compute import tile_efficiency
from cost_models.flops import head_forward_flops, per_layer_input_projection_flops

CE_BYTES_PER_LOGIT = 4 * 4  # fp32 logits: written, read for the log-sum-exp, gradient written and read
# A one-hot lookup's passes: the forward matmul, and the table's gradient (the one-hot input takes none).
# Each writes its [tokens, vocab] mask of one byte an element and reads it back (MaxText 0.2.5's compile of
# Gemma 3 12B at 32K with use_iota_embed=True: 1.319e14 FLOPs, two masks of 8.6 GB; docs/multislice.md).
ONE_HOT_PASSES = 2
ONE_HOT_MASK_BYTES = 2 * 1


@dataclass(frozen=True)
class HeadTimes:
    """The output head and loss of one step on one device (arrays over candidates)."""

    passes: int  # forward, two backward matmuls, and the chunked loss's recomputed logits
    matmul_s: np.ndarray  # the head's passes, the per-layer inputs' projection and a one-hot embedding's passes
    cross_entropy_s: np.ndarray
    one_hot_mask_s: np.ndarray | float  # a one-hot embedding's masks, written and read (HBM bound)
    executed_flops: np.ndarray


def price_head(x: Candidates) -> HeadTimes:
    """Prices the output head and the loss, per step, for every candidate."""
    model, chip = x.model, x.topology.chip
    passes = 3 + (1 if x.loss_chunk_tokens else 0)  # chunked loss recomputes each chunk's logits
    padding = tile_efficiency(model.hidden, chip.mxu_tile) * tile_efficiency(model.vocab / x.tensor, chip.mxu_tile)
    hbm_bw = x.topology.hbm_bw_per_device
    flops = head_forward_flops(model, x.tokens_per_device)
    # the per-layer inputs' projection runs before the layers, outside their remat: forward and backward once
    ple = model.per_layer_inputs
    ple_flops = 3 * per_layer_input_projection_flops(model, x.tokens_per_device) / x.tensor
    ple_columns = model.num_layers * ple.width / x.tensor if ple else 1
    ple_padding = tile_efficiency(model.hidden, chip.mxu_tile) * tile_efficiency(ple_columns, chip.mxu_tile)
    # a one-hot lookup multiplies [tokens, vocab] by the table [vocab, hidden]: the head's shape
    one_hot = ONE_HOT_PASSES if x.one_hot_embedding else 0
    head_flops = (passes + one_hot) * flops / x.tensor
    logits = x.tokens_per_device * model.vocab / x.tensor  # the head's outputs, and a one-hot mask's elements
    return HeadTimes(
        passes=passes,
        matmul_s=(head_flops / padding + ple_flops / ple_padding) / x.achievable_matmul_flops,
        cross_entropy_s=logits * CE_BYTES_PER_LOGIT / hbm_bw,
        one_hot_mask_s=one_hot * logits * ONE_HOT_MASK_BYTES / hbm_bw,
        executed_flops=head_flops + ple_flops,
    )
