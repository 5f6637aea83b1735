"""How cpplan's runtime cuts work into pieces, read by the runtime and priced by the cost model.

One definition serves both, so a change of piece size moves the prediction with the program.
"""
from __future__ import annotations

from cost_models.models import ModelSpec

MLP_CHUNK_TOKENS = 4096  # tokens per device per MLP chunk (each chunk its own checkpoint)
VOCAB_PIECE = 16384  # output-head columns gathered at once by the fused cross-entropy
# weight arrays of a decoder layer besides the MLP's: q, k, v, out and two norm scales
NON_MLP_WEIGHT_ARRAYS = 6
# a gated MLP's layer (gate, up, down): the count priced until communication reads `weight_arrays_per_layer`
WEIGHT_ARRAYS_PER_LAYER = NON_MLP_WEIGHT_ARRAYS + 3


def weight_arrays_per_layer(model: ModelSpec) -> int:
    """Weight arrays of one decoder layer (q, k, v, out, the MLP's matrices, two norm scales):
    sharded arrays are gathered and their gradients reduce-scattered one array at a time."""
    return NON_MLP_WEIGHT_ARRAYS + model.mlp_matrices


def vocab_pieces(vocab_slice: int) -> int:
    """The fewest equal pieces of at most `VOCAB_PIECE` columns a device's vocabulary splits into."""
    return next(n for n in range(1, vocab_slice + 1) if vocab_slice % n == 0 and vocab_slice // n <= VOCAB_PIECE)
