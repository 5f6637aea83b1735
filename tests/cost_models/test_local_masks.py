"""Local layers (sliding windows, chunks) against numbers worked out by hand and by brute force: the
blocks a call computes, the ring's hops, the model FLOPs, the kernel calls each strategy makes, the
layer pattern, zigzag's refusal, the MaxText refusal, Hugging Face configs, and what explain says."""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.errors import CpplanError
from cost_models.flops import layer_forward_flops, model_flops_per_step
from cost_models.masks import CAUSAL, FULL, AttentionMask, CallBlocks, call_blocks, chunked, hops_needed, sliding_window
from cost_models.models import MODELS, ModelSpec
from cost_models.strategies import STRATEGIES
from cost_models.vocabulary import CPStrategy
from planner import Plan, candidates_of, estimate, explain, make_mesh
from planner.maxtext import export_maxtext

pytestmark = pytest.mark.pure

GEMMA = MODELS["gemma3-12b"]
SMALL = MODELS["small"]  # 4 layers, 8 heads / 4 KV heads × 32
LOCAL = dataclasses.replace(SMALL, name="small-local", window=300, layer_pattern="LG")


def brute_blocks(mask, q_start, q_len, kv_start, kv_len, bq, bkv) -> CallBlocks:
    """The blocks of a call counted pair by pair."""
    seen = mask.allows(q_start + np.arange(q_len)[:, None], kv_start + np.arange(kv_len)[None, :])
    blocks = seen.reshape(q_len // bq, bq, kv_len // bkv, bkv)
    some, every = blocks.any(axis=(1, 3)), blocks.all(axis=(1, 3))
    return CallBlocks(int(some.sum()), int((some & ~every).sum()), int(some.sum(1).max()), int(some.sum(0).max()))


masks = st.one_of(
    st.just(CAUSAL),
    st.just(FULL),
    st.integers(1, 700).map(sliding_window),
    st.integers(1, 700).map(chunked),
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    mask=masks,
    bq=st.sampled_from([64, 128]),
    bkv=st.sampled_from([64, 128]),
    q_blocks=st.integers(1, 8),
    kv_blocks=st.integers(1, 8),
    q_start=st.integers(0, 12).map(lambda n: 64 * n),
    kv_start=st.integers(0, 12).map(lambda n: 64 * n),
)
def test_call_blocks_count_what_the_mask_leaves_pair_by_pair(mask, bq, bkv, q_blocks, kv_blocks, q_start, kv_start):
    args = (mask, q_start, q_blocks * bq, kv_start, kv_blocks * bkv, bq, bkv)
    assert call_blocks(*args) == brute_blocks(*args)


def test_block_visibility_by_hand():
    # a window of 300 over blocks of 128: the query block 512..639 sees keys 213..639 in some row
    any_, all_ = sliding_window(300).block_visibility(512, np.array([0, 128, 256, 384, 512, 640]), 128, 128)
    assert any_.tolist() == [False, True, True, True, True, False]
    # every query (512..639) sees every key of 384..511 only if 639 − 384 < 300: yes; 256..383: 639 − 256 ≥ 300
    assert all_.tolist() == [False, False, False, True, False, False]
    assert chunked(256).block_mask(256, np.array([0, 128, 256]), 128, 128).tolist() == [0, 0, 1]


def test_hops_needed_by_hand():
    assert hops_needed(sliding_window(1024), 8192, 8) == 1  # the window stays within one block back
    assert hops_needed(sliding_window(20000), 8192, 8) == 3  # ceil(19999 / 8192)
    assert hops_needed(sliding_window(20000), 8192, 2) == 1  # never past the ring
    assert hops_needed(chunked(8192), 16384, 8) == 0  # each block holds whole chunks
    assert hops_needed(chunked(8192), 4096, 8) == 2  # ceil(8191 / 4096)
    assert hops_needed(CAUSAL, 8192, 8) == 7 and hops_needed(FULL, 8192, 1) == 0


def test_the_layer_pattern_repeats_over_the_layers():
    assert [m.local for m in map(GEMMA.layer_mask, range(12))] == [True] * 5 + [False] + [True] * 5 + [False]
    assert GEMMA.layer_masks == ((CAUSAL, 8), (sliding_window(1024), 40))
    assert MODELS["mistral-7b-v0.1"].layer_masks == ((sliding_window(4096), 32),)
    assert SMALL.layer_masks == ((CAUSAL, 4),) and "window" not in SMALL.to_dict()
    assert ModelSpec.from_dict(GEMMA.to_dict()) == GEMMA
    with pytest.raises(CpplanError, match="layer_pattern='LLX'"):
        dataclasses.replace(SMALL, window=8, layer_pattern="LLX")
    with pytest.raises(CpplanError, match="needs a causal mask"):
        dataclasses.replace(SMALL, window=8, causal=False)
    with pytest.raises(CpplanError, match="sliding_window mask needs its length"):
        AttentionMask("sliding_window", 0)


def test_model_flops_count_a_local_layer_against_its_window():
    # one sequence of 4096 tokens, 8 heads × 32: a global layer 4·4096·4096·8·32/2, a local one of 300 keys
    global_, local = (layer_forward_flops(SMALL, 4096, 4096, m).attention for m in (CAUSAL, sliding_window(300)))
    assert global_ == 4 * 4096 * 4096 * 8 * 32 / 2 and local == 4 * 4096 * 300 * 8 * 32 / 2
    assert layer_forward_flops(SMALL, 256, 256, sliding_window(300)).attention == 4 * 256 * 256 * 8 * 32 / 2
    causal = model_flops_per_step(SMALL, 4096, 1)
    assert causal - model_flops_per_step(LOCAL, 4096, 1) == pytest.approx(3 * 2 * (global_ - local))


def plan(strategy, mesh, model=LOCAL, seq_len=16384, zigzag=False, **kw):
    return Plan(
        model=model,
        topology="v5p:2x2x2",
        seq_len=seq_len,
        global_batch=1,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        load_balance="zigzag" if zigzag else "none",
        block_q=512,
        block_kv=512,
        **kw,
    )


@pytest.mark.parametrize(
    "strategy, mesh, calls",
    [
        ("none", dict(fsdp=8), [(1, 16384, 16384, 0, 0)]),
        ("ulysses", dict(context_ulysses=4, fsdp=2), [(1, 16384, 16384, 0, 0)]),
        ("all_gather", dict(context=8), [(1, 2048, 16384, 14336, 0)]),
        # blocks of 2048: a window of 300 reaches one block back, from the last rank's 14336
        ("ring", dict(context=8), [(1, 2048, 2048, 14336, 14336), (1, 2048, 2048, 14336, 12288)]),
        ("usp", dict(context=4, context_ulysses=2), [(1, 4096, 4096, 12288, 12288), (1, 4096, 4096, 12288, 8192)]),
    ],
)
def test_each_strategy_calls_splash_on_the_window_it_needs(strategy, mesh, calls):
    x = dataclasses.replace(candidates_of(plan(strategy, mesh)), mask=LOCAL.local_mask)
    spec = STRATEGIES[CPStrategy.parse(strategy)]
    made = spec.kernel_calls(x, spec.layout(x))
    numbers = [[np.asarray(v).item() for v in (c.count, c.q_len, c.kv_len, c.q_start, c.kv_start)] for c in made]
    assert numbers == [list(map(float, c)) for c in calls]
    assert all(c.mask == LOCAL.local_mask for c in made)


def test_a_ring_of_local_layers_sends_only_the_hops_its_window_reaches():
    p = plan("ring", dict(context=8))
    spec = STRATEGIES[CPStrategy.RING]
    costs = {}
    for mask in (CAUSAL, LOCAL.local_mask):
        x = dataclasses.replace(candidates_of(p), mask=mask)
        costs[mask.local] = spec.cost(x, spec.layout(x), 1.0, 1.0)
    # forward one hop of the seven; backward one hop and one link home against seven hops and one home,
    # where a link home carries what a forward hop does
    hop = costs[True].forward_s
    assert hop * 7 == pytest.approx(costs[False].forward_s)
    backward_hop = (costs[False].backward_s - hop) / 7
    assert backward_hop > hop and costs[True].backward_s == pytest.approx(backward_hop + hop)
    local, full = estimate(p), estimate(plan("ring", dict(context=8), model=SMALL))
    assert local.compute_s["attention"] < 0.6 * full.compute_s["attention"]  # half the layers see 300 keys


def test_zigzag_and_maxtext_refuse_local_layers_by_name():
    with pytest.raises(CpplanError, match="has local layers .* natural order"):
        plan("ring", dict(context=8), zigzag=True).check()
    with pytest.raises(CpplanError, match="sliding window only in its gemma3 block"):
        export_maxtext(plan("ring", dict(context=8)))


CONFIG = {
    "model_type": "mistral",
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
}


@pytest.mark.parametrize(
    "extra, window, kind, pattern",
    [
        ({"sliding_window": 4096}, 4096, "sliding_window", "L"),
        ({"sliding_window": 4096, "use_sliding_window": False}, 0, "sliding_window", ""),
        ({"model_type": "qwen2", "sliding_window": 4096}, 0, "sliding_window", ""),  # Qwen2's default: off
        ({"sliding_window": None}, 0, "sliding_window", ""),
        ({"sliding_window": 512, "sliding_window_pattern": 3}, 512, "sliding_window", "LLG"),
        ({"sliding_window": 512, "sliding_window_pattern": 1}, 0, "sliding_window", ""),  # every layer global
        ({"sliding_window": 512, "use_sliding_window": True, "max_window_layers": 1}, 512, "sliding_window", "GLLL"),
        (
            {"sliding_window": 1024, "layer_types": ["sliding_attention", "full_attention"] * 2},
            1024,
            "sliding_window",
            "LGLG",
        ),
        (
            {"attention_chunk_size": 8192, "layer_types": ["chunked_attention"] * 3 + ["full_attention"]},
            8192,
            "chunked",
            "LLLG",
        ),
    ],
)
def test_hugging_face_configs_give_their_local_layers(extra, window, kind, pattern, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG, **extra}))
    model = ModelSpec.from_hf_config(path)
    assert (model.window, model.local_kind, model.layer_pattern) == (window, kind, pattern)


@pytest.mark.parametrize(
    "extra, says",
    [
        ({"layer_types": ["linear_attention"] * 4}, "'linear_attention'"),
        ({"sliding_window": "4k"}, "sliding_window='4k' must be a positive integer"),
        ({"layer_types": ["chunked_attention", "sliding_attention"] * 2}, "not both"),
        (
            {"sliding_window": 512, "layer_types": ["sliding_attention"] * 3},
            "names 3 layers but num_hidden_layers is 4",
        ),
        ({"sliding_window": 512, "sliding_window_pattern": 0}, "sliding_window_pattern=0 must be a positive integer"),
        ({"sliding_window": 512, "layer_types": "sliding_attention"}, "must be a list of one type per layer"),
        ({"sliding_window": 512, "max_window_layers": 1.5}, "max_window_layers=1.5 must be an integer of 0 or more"),
    ],
)
def test_hugging_face_local_layers_that_cannot_be_priced_are_refused(extra, says, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG, **extra}))
    with pytest.raises(CpplanError, match=says):
        ModelSpec.from_hf_config(path)


def test_explain_says_what_the_masks_change():
    e = explain("gemma3-12b", "1M", "v5p-256")
    local = e.to_dict()["local_layers"]
    assert local["layers"] == {"causal": 8, "sliding_window of 1024 tokens": 40}
    assert local["attention_s"] < local["attention_s_if_global"] / 3
    assert e.best.load_balance.value == "none"  # zigzag is refused with local layers
    assert "if every layer attended globally" in str(e).splitlines()[1]


def test_packed_documents_make_every_layer_causal_within_its_document():
    packed = dataclasses.replace(GEMMA, documents=8192)
    assert packed.layer_masks == ((sliding_window(1024), 40), (chunked(8192), 8))
    assert dataclasses.replace(GEMMA, documents=512).local_mask == chunked(512)  # the window spans documents
    assert packed.all_global() == dataclasses.replace(GEMMA, window=0, layer_pattern="")
    with pytest.raises(CpplanError, match="documents=-1 must be an integer of 0 or more"):
        dataclasses.replace(SMALL, documents=-1)
    with pytest.raises(CpplanError, match="full .* mask with documents"):
        dataclasses.replace(SMALL, documents=512, causal=False)


def test_explain_prices_8k_documents_in_a_million_token_row():
    e = explain(dataclasses.replace(MODELS["llama3.1-8b"], documents=8192), "1M", "v5p-256")
    local = e.to_dict()["local_layers"]
    assert local["layers"] == {"chunked of 8192 tokens": 32}
    assert local["attention_s"] < local["attention_s_if_global"] / 50  # a hundredth of the pairs, in blocks
    assert "rows packed from documents of 8K tokens" in str(e).splitlines()[1]


def test_a_window_or_documents_as_long_as_the_sequence_bound_nothing():
    mistral = MODELS["mistral-7b-v0.1"]  # a 4096-token window on every layer
    assert mistral.within(4097) == (mistral, None)
    unbounded, note = mistral.within(4096)
    assert unbounded == dataclasses.replace(mistral, window=0, layer_pattern="") and not unbounded.has_local_layers
    assert "the local layers' window of 4096 tokens" in note
    packed = dataclasses.replace(SMALL, documents=65536)
    assert packed.within(65536)[0] == SMALL
    # priced as the unpacked row: the same plan, at the same price, and the explanation says why
    e, plain = explain(packed, "64k", "v5p-16"), explain(SMALL, "64k", "v5p-16")
    assert (e.best, e.estimate.step_time_s) == (plain.best, plain.estimate.step_time_s)
    assert "Note: as long as the whole 65536-token sequence or longer: documents of 65536 tokens" in str(e)
