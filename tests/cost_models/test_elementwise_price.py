"""The elementwise price under tensor parallelism, computed by hand: norms and residual adds on the
residual stream's tensor-th of the tokens (sequence parallelism), RoPE and the MLP's activation on
every token with heads and columns split, and the parallel block's branch sum read on every token."""

import dataclasses

import pytest

from cost_models.models import MODELS
from cost_models.pricing.elementwise import price_elementwise
from cost_models.work_layout import residual_tokens
from planner import Plan, make_mesh
from planner.estimate import candidates_of, estimate

pytestmark = pytest.mark.pure

SEQUENTIAL = MODELS["llama3.1-8b"]  # hidden 4096, 32 heads, 8 KV heads of 128, SwiGLU over 14336
PARALLEL = dataclasses.replace(SEQUENTIAL, name="llama3.1-8b-parallel", decoder_block="default")
HBM_BW = 2.76e12  # v5p
TOKENS = 8192  # one sequence per batch shard


def plan(model, *, tensor, remat="full"):
    """Llama 3.1 8B widths at 8192 tokens on 8 v5p chips: fsdp × tensor, one sequence per batch shard."""
    return Plan(
        model=model,
        topology="v5p:2x2x2",
        seq_len=TOKENS,
        global_batch=8 // tensor,
        mesh=make_mesh(fsdp=8 // tensor, tensor=tensor),
        remat=remat,
        block_q=512,
        block_kv=512,
    )


def forward_by_hand(*, tensor, parallel):
    """Seconds of one layer's elementwise forward, bf16, each array read or written once per pass."""
    rope_and_activation = (2 * (32 + 8) * 128 + 3 * 14336) / tensor  # q and k read and written; SwiGLU
    if parallel:
        # one norm (read, write) and one add (two reads, one write) on a tensor-th of the tokens;
        # the MLP's partial sums read once more on every token by the out projection's epilogue
        per_token = (2 + 3) * 4096 / tensor + 4096 + rope_and_activation
    else:
        per_token = (2 * 2 + 2 * 3) * 4096 / tensor + rope_and_activation  # two norms, two adds
    return TOKENS * per_token * 2 / HBM_BW


@pytest.mark.parametrize("tensor", [1, 2, 4, 8])
@pytest.mark.parametrize("model", [SEQUENTIAL, PARALLEL], ids=["sequential", "parallel"])
def test_elementwise_forward_by_hand(model, tensor):
    x = candidates_of(plan(model, tensor=tensor))
    assert x.tokens_per_device[0] == TOKENS and residual_tokens(x.tokens_per_device, x.tensor)[0] == TOKENS / tensor
    times = price_elementwise(x)
    expected = forward_by_hand(tensor=tensor, parallel=model.decoder_block.parallel)
    # full remat keeps the layer input (a tensor-th of its hidden per token), copied into the layer stack
    # as the layer ends (read and written); none of the MLP's values to copy out in the backward
    copy = TOKENS * 4096 / tensor * 2 * 2 / HBM_BW
    assert times.kept_copies_s[0] == pytest.approx(copy)
    assert times.forward_s[0] == pytest.approx(expected + copy)
    assert times.backward_s[0] == pytest.approx(2 * expected)
    assert times.recompute_s[0] == pytest.approx(expected)  # full remat runs the forward again


def test_sequence_parallelism_shrinks_norms_and_adds_not_the_split_work():
    # at tensor 8 the norms and adds of the sequential block cost an eighth of what they cost whole:
    # 10 · 4096 values per token, 7/8 of them gone (what the price charged before it followed the layout)
    whole, split = (price_elementwise(candidates_of(plan(SEQUENTIAL, tensor=t))) for t in (1, 8))
    whole, split = (t.forward_s[0] - t.kept_copies_s[0] for t in (whole, split))  # the ops, not the loop's copies
    saved = TOKENS * 10 * 4096 * 2 / HBM_BW * 7 / 8
    rope_and_activation = TOKENS * (2 * 40 * 128 + 3 * 14336) * 2 / HBM_BW * 7 / 8
    assert whole - split == pytest.approx(saved + rope_and_activation) and split < whole / 4


def test_the_step_prices_what_the_builder_says():
    # the step's HBM-bound elementwise term: every layer's forward, backward (twice the forward) and
    # full remat's recomputation, the layer input's copy into the layer stack, and the loss's cross-entropy
    from cost_models.pricing.head import price_head

    for model in (SEQUENTIAL, PARALLEL):
        x = candidates_of(plan(model, tensor=4))
        copy = TOKENS * 4096 / 4 * 2 * 2 / HBM_BW
        layers = model.num_layers * (4 * forward_by_hand(tensor=4, parallel=model.decoder_block.parallel) + copy)
        assert estimate(plan(model, tensor=4)).hbm_s["elementwise"] == pytest.approx(
            layers + price_head(x).cross_entropy_s[0]
        )
