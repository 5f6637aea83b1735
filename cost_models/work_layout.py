"""How cpplan's runtime cuts work into pieces, read by the runtime and priced by the cost model.

One definition serves both, so a change of piece size moves the prediction with the program.
"""
from __future__ import annotations

from cost_models.models import ModelSpec

MLP_CHUNK_TOKENS = 4096  # tokens per device per MLP chunk (each chunk its own checkpoint)
VOCAB_PIECE = 16384  # output-head columns gathered at once by the fused cross-entropy
ATTENTION_WEIGHT_ARRAYS = 4  # q, k, v, out


def residual_tokens(tokens_per_device, tensor):
    """Tokens of the residual stream one device holds and works on: its batch shard's tokens split
    over `tensor` too (sequence parallelism, `runtime.model.RESIDUAL`). The layer input, the
    norms, the residual sums and what a layer keeps of them live so; each branch gathers its normed
    input whole over `tensor` before the column-parallel matmuls (q/k/v, the MLP's inputs: heads
    and columns split, every token) and its row-parallel output is reduce-scattered back. MaxText
    splits the same arrays over `tensor` by their embed dimension instead (`activation_embed` ->
    tensor in the logical axis rules of 0.2.5's base.yml, and of its v5p configs' commit 76bd53b),
    so a device holds and normalises the same share there.

    Args:
        tokens_per_device: tokens of a device's batch shard (its sequences over the context axes);
            a number or an array over candidates.
        tensor: the `tensor` axis size (same form).
    Returns:
        The residual stream's tokens per device.
    """
    return tokens_per_device / tensor


def weight_arrays_per_layer(model: ModelSpec) -> int:
    """Weight arrays of one decoder layer (q, k, v, out, the MLP's matrices, a scale per norm: two
    in a sequential block, one in a parallel one): sharded arrays are gathered and their gradients
    reduce-scattered one array at a time."""
    return ATTENTION_WEIGHT_ARRAYS + model.decoder_block.norms + model.mlp_matrices


def tensor_collectives_per_layer(model: ModelSpec) -> int:
    """The tensor-parallel collectives of one layer's forward and backward, recomputation left
    out. With sequence parallelism each branch that reads the normed input gathers it over
    `tensor` and each branch output is reduce-scattered back, and the backward does the
    transposes: a sequential block's attention and MLP each gather and scatter (4 forward, 4
    backward); a parallel block gathers its one normed input for both and scatters their sum
    (2 forward, 2 backward)."""
    branches = 1 if model.decoder_block.parallel else 2  # gathered inputs, and scattered outputs
    return 2 * (branches + branches)  # forward, and the transposes backward


def vocab_pieces(vocab_slice: int) -> int:
    """The fewest equal pieces of at most `VOCAB_PIECE` columns a device's vocabulary splits into."""
    return next(n for n in range(1, vocab_slice + 1) if vocab_slice % n == 0 and vocab_slice // n <= VOCAB_PIECE)
