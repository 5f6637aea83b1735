"""How cpplan's runtime cuts work into pieces: one definition, read by the runtime and priced by the cost
model, so a change of piece size moves the prediction with the program."""

from __future__ import annotations

from cost_models.models import ModelSpec

MLP_CHUNK_TOKENS = 4096  # tokens per device per MLP chunk (each chunk its own checkpoint)
VOCAB_PIECE = 16384  # output-head columns gathered at once by the fused cross-entropy
ATTENTION_WEIGHT_ARRAYS = 4  # q, k, v, out


def residual_tokens(tokens_per_device, tensor):
    """Tokens of the residual stream one device holds: its batch shard's tokens split over `tensor` too
    (sequence parallelism, `runtime.model.RESIDUAL`; docs/provenance/cost_models.md#work_layout)."""
    return tokens_per_device / tensor


def weight_arrays_per_layer(model: ModelSpec) -> int:
    """Weight arrays of one decoder layer (q, k, v, out, the MLP's matrices, a scale per norm), each
    gathered and its gradient reduce-scattered one at a time."""
    return ATTENTION_WEIGHT_ARRAYS + model.decoder_block.norms + model.mlp_matrices


def tensor_collectives_per_layer(model: ModelSpec) -> int:
    """The tensor-parallel collectives of one layer's forward and backward, recomputation left out (a
    gather and a scatter per branch, and their transposes)."""
    branches = 1 if model.decoder_block.parallel else 2  # gathered inputs, and scattered outputs
    return 2 * (branches + branches)  # forward, and the transposes backward


def vocab_pieces(vocab_slice: int) -> int:
    """The fewest equal pieces of at most `VOCAB_PIECE` columns a device's vocabulary splits into."""
    return next(n for n in range(1, vocab_slice + 1) if vocab_slice % n == 0 and vocab_slice // n <= VOCAB_PIECE)
