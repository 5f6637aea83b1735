"""HBM-bound work: a decoder layer's elementwise ops (norms, residual adds, RoPE, the MLP's
activation, a per-layer input's gate, norm and residual add), the copies its layer loop makes of the values
the remat policy keeps, and the AdamW update."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.candidates import Candidates
from cost_models.pricing.memory import kept_copy_values
from cost_models.work_layout import MLP_CHUNK_TOKENS, residual_tokens

ADAMW_BYTES_PER_PARAM = 7 * 4 + 6  # read p, g, m, v and write p, m, v in fp32; a bf16 copy of p
ELEMENTWISE_PASSES_BACKWARD = 2.0  # backward of an elementwise op reads the input and the output grad, writes one grad
NORM_PASSES = 2  # an RMSNorm reads its input and writes its output
ADD_PASSES = 3  # a residual add reads two arrays and writes their sum
COPY_PASSES = 2  # a copy reads its source and writes its destination


@dataclass(frozen=True)
class ElementwiseTimes:
    """One decoder layer's elementwise work on one device (arrays over candidates)."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    recompute_s: np.ndarray  # what the remat policy runs again in the backward
    kept_copies_s: np.ndarray  # of `forward_s` and `backward_s`, the layer loop's copies of the kept values

    @property
    def total_s(self) -> np.ndarray:
        return self.forward_s + self.backward_s + self.recompute_s


def price_elementwise(x: Candidates, *, mlp_chunk_tokens: int | None = MLP_CHUNK_TOKENS) -> ElementwiseTimes:
    """Prices one decoder layer's elementwise work for every candidate.

    Norms and residual adds run on the residual stream (`residual_tokens`: sequence parallelism), RoPE and
    the MLP's activation on every token, heads and columns split over tensor. A parallel block has one norm,
    and its out projection's epilogue reads the MLP's partial sums before one residual add, as the TPU
    compiler fuses it (docs/provenance/cost_models.md#elementwise). A layer loop copies the kept values
    into its stacks in the forward and the MLP's out of them in the backward (`kept_copy_values`; the
    target's MLP chunks as `mlp_chunk_tokens`).
    """
    model, tokens, hbm_bw = x.model, x.tokens_per_device, x.topology.hbm_bw_per_device
    residual = residual_tokens(tokens, x.tensor)
    # the activation reads each input projection's output and writes their activated product (averaged over
    # the layers where some MLPs are wider)
    activation_width = (model.mlp_inputs + 1) * model.mean_mlp_width
    # a per-layer input (Gemma 4 E2B, E4B): its activated gate times the layer's input, split as the MLP's, then
    # a norm and a residual add on the residual stream
    ple = model.per_layer_inputs
    gate_width = (2 + 1) * ple.width if ple else 0
    split_width = (
        2 * (model.num_heads + model.num_kv_heads) * model.head_dim + activation_width + gate_width
    ) / x.tensor
    block = model.decoder_block
    norms, adds = block.norms + (ple is not None), (1 if block.parallel else 2) + (ple is not None)
    residual_width = (norms * NORM_PASSES + adds * ADD_PASSES) * model.hidden
    branch_sum_width = model.hidden if block.parallel else 0  # the MLP's partial sums, read by the epilogue
    forward_s = (residual * residual_width + tokens * (branch_sum_width + split_width)) * x.act_bytes / hbm_bw
    remat = x.remat_columns
    # a policy that recomputes the projections runs the whole layer's forward again; one that
    # recomputes only the MLP, its activation
    activation_recompute_s = (remat.recompute_mlp > 0) * tokens * activation_width * x.act_bytes / x.tensor / hbm_bw
    recompute_s = np.where(remat.recompute_qkv_out > 0, forward_s, activation_recompute_s)
    to_stacks, from_stacks = kept_copy_values(x, mlp_chunk_tokens)
    copy_s = COPY_PASSES * x.act_bytes / hbm_bw
    return ElementwiseTimes(
        forward_s + to_stacks * copy_s,
        ELEMENTWISE_PASSES_BACKWARD * forward_s + from_stacks * copy_s,
        recompute_s,
        (to_stacks + from_stacks) * copy_s,
    )


def optimizer_seconds(x: Candidates) -> np.ndarray:
    """Seconds of one AdamW update of a device's shard of the parameters (HBM bound)."""
    shards = x.weight_group * x.tensor
    return x.model.num_params / shards * ADAMW_BYTES_PER_PARAM / x.topology.hbm_bw_per_device
