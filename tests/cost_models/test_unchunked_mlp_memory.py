"""An MLP with no chunk loop (MaxText's) holds its input and that input's gradient once in a layer's
backward; cpplan's chunk loop holds a chunk's own copy of each beside them."""

import numpy as np
import pytest

from cost_models.pricing.memory import mlp_input_copies, price_memory
from cost_models.pricing.step import price_layer_attention
from cost_models.targets import Target
from planner.estimate import candidates_of, estimate
from planner.maxtext import read_maxtext

pytestmark = pytest.mark.pure

# the published Llama 3.1 405B v5p-1024 run (benchmarks/public_runs.csv): fsdp 512, 2 × 8K a device,
# `custom` with the attention output (`context`) and the MLP's output (`mlpwo`) offloaded
RUN_405B = (
    "model_name=llama3.1-405b per_device_batch_size=2 ici_fsdp_parallelism=-1 max_target_length=8192 "
    "attention=flash remat_policy=custom context=offload mlpwo=offload num_vocab_tiling=4 sa_block_q=2048 "
    "sa_block_kv=2048 compile_topology=v5p-1024 compile_topology_num_slices=1 weight_dtype=float32 dtype=bfloat16"
)
TOKENS, HIDDEN, INTERMEDIATE, LAYERS, DEVICES = 2 * 8192, 16384, 53248, 126, 512
# q (128 heads), k and v (8 each), the out projection, the MLP's three matrices and the two norms' scales
LAYER_PARAMS = HIDDEN * (128 + 2 * 8) * 128 + 128 * 128 * HIDDEN + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN


def test_the_405b_runs_mlp_backward_by_hand():
    e = estimate(read_maxtext(RUN_405B).plan, target="maxtext")
    by_hand = (
        # the MLP's input and its gradient, every token (one buffer each: no chunk copies them)
        2 * TOKENS * HIDDEN * 2
        # the layer output's gradient and the residual the MLP's norm read
        + 2 * TOKENS * HIDDEN * 2
        # both input projections' outputs and their gradients, every token
        + 2 * 2 * TOKENS * INTERMEDIATE * 2
        # the three gathered bf16 matrices and their three bf16 gradients
        + 6 * HIDDEN * INTERMEDIATE * 2
        # the offloaded attention output (128 heads of 128), fetched ahead for the attention's backward
        + TOKENS * 128 * 128 * 2
        # MaxText's stacked fp32 layer gradients, held through the layers' backward
        + LAYERS * LAYER_PARAMS * 4 / DEVICES
    )
    assert e.hbm_bytes["mlp_working_set"] == pytest.approx(by_hand, rel=1e-12)
    # 23.27e9 bytes, 21.67 GiB: one GiB less than the MLP's input and gradient counted twice, which put
    # the run that ran at 96.0 GiB of 95.73
    assert by_hand / 2**30 == pytest.approx(21.672, abs=1e-3)
    assert e.hbm_bytes_per_device / 2**30 == pytest.approx(95.00, abs=0.01) and e.fits


def test_one_chunk_of_every_token_differs_from_no_chunk_loop_by_the_chunks_copies():
    """The same candidates priced with a chunk loop of one chunk over every token and with none: the loop
    holds the chunk's own copy of the MLP's input and the chunk's gradient, 2 · tokens · hidden values."""
    x = candidates_of(read_maxtext(RUN_405B).plan)
    traits = Target.MAXTEXT.traits
    attention, context = price_layer_attention(x, Target.MAXTEXT)
    layout = attention.layout

    def mlp(chunk):
        return price_memory(
            x,
            layout,
            context,
            mlp_chunk_tokens=chunk,
            head_gradient_in_head_layout=traits.head_gradient_in_head_layout,
            kv_buffers_working_set=traits.kv_buffers_working_set,
            layers_switch_masks=traits.layers_switch_masks,
        ).mlp_working_set

    one_chunk, no_loop = mlp(TOKENS), mlp(None)
    assert np.ravel(one_chunk - no_loop)[0] == 2 * TOKENS * HIDDEN * 2
    assert (mlp_input_copies(None), mlp_input_copies(4096)) == (0, 1)
