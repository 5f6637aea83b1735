"""MaxText's dense mixture-of-experts path, `sparse_matmul=False` with a `capacity_factor` (a plan's
`expert_capacity`), as MaxText 0.2.5 runs it (layers/moe.py `generate_masks`, `dense_matmul`): no sort
and no grouped matmul. Per sequence each expert has C = int(ceil(S·k/E)·factor) slots, its routed tokens
one-hot in them (overflow dropped); the tokens are dispatched into the slots by an einsum over that mask
("BSM,BSEC -> EBCM"), every expert runs dense matmuls over all its slots, filled or not, and the outputs
are combined back per token by a second einsum ("EBCM,BSEC -> BSM") with the router's weights in the
mask. With expert parallelism the slots are what the all-to-all moves. Traced on a published Mixtral run
in docs/moe_misses.md (section 3).
"""

from __future__ import annotations

import numpy as np

from cost_models.candidates import Candidates
from cost_models.compute import tile_efficiency


def slots_per_sequence(x: Candidates) -> np.ndarray:
    """C: each expert's slots in one sequence as a device holds it (its tokens split over both context axes)."""
    e = x.model.experts
    local = np.asarray(x.seq_len / (x.ring * x.ulysses), dtype=float)
    per_expert = np.ceil(local * e.per_token / e.count)
    return np.floor(np.maximum(per_expert * x.expert_capacity, x.expert_capacity))


def slot_rows(x: Candidates) -> np.ndarray:
    """Rows a device's experts run: every expert's C slots in each of its sequences (E·B·C), however many are
    filled: about `expert_capacity` times the routed copies."""
    return np.asarray(x.sequences_per_device, dtype=float) * x.model.experts.count * slots_per_sequence(x)


def capacity_seconds(x: Candidates) -> tuple[np.ndarray, np.ndarray]:
    """(the experts' dense matmuls over their slots, the dispatch and combine einsums) of one layer's MLP
    forward, per device, at the row's dense matmul rate: the einsums each 2·tokens·hidden·E·C FLOPs
    (a token's row against every slot of every expert in its sequence), the experts 2·slots·hidden·F per
    matrix, F split over tensor."""
    m, e = x.model, x.model.experts
    tile, achievable = x.topology.chip.mxu_tile, x.achievable_matmul_flops
    width = e.intermediate / x.tensor
    columns = tile_efficiency(m.hidden, tile) * tile_efficiency(width, tile)
    experts_s = slot_rows(x) * 2.0 * m.mlp_matrices * m.hidden * width / (achievable * columns)
    tokens = np.asarray(x.tokens_per_device, dtype=float)
    einsums_s = 2 * 2.0 * tokens * m.hidden * e.count * slots_per_sequence(x) / achievable
    return experts_s, einsums_s
