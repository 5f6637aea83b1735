"""The cost model's formulas against numbers worked out by hand."""

import dataclasses
import json

import numpy as np
import pytest

from cost_models.compute import (
    attention_extent,
    backward_core_share,
    causal_block_fraction,
    splash_row_groups,
    splash_smem_bytes,
    tile_efficiency,
)
from cost_models.errors import CpplanError
from cost_models.flops import model_flops_per_step
from cost_models.models import MODELS, DecoderBlock, ModelSpec, get_model
from cost_models.pricing.attention import price_attention
from cost_models.strategies import STRATEGIES
from cost_models.targets import TRAITS, Target, model_refusal
from planner import Plan, candidates_of, estimate, make_mesh

pytestmark = pytest.mark.pure
L8B = MODELS["llama3.1-8b"]


def test_llama31_8b_parameters():
    # embeddings 2 · 128256 · 4096 + final norm 4096; per layer q 4096², k+v 2·4096·1024,
    # o 4096², MLP 3·4096·14336, two norms 2·4096 = 218,112,000; 32 layers
    assert L8B.params_per_layer == 218_112_000
    assert L8B.num_params == 32 * 218_112_000 + 2 * 128256 * 4096 + 4096 == 8_030_261_248
    assert L8B.num_params * 4 == 32_121_044_992  # fp32 parameter bytes


def test_llama31_8b_flops_per_step_as_maxtext_counts():
    s = 8192
    ffn = 2 * s * 14336 * 4096 * 2 + 2 * s * 14336 * 4096
    qkv = 2 * s * 4096 * (32 + 2 * 8) * 128
    proj = 2 * s * 4096 * 32 * 128
    embedding = 2 * s * 4096 * 128256
    causal_attention = 4 * s * s * 32 * 128 / 2
    expected = ((ffn + qkv + proj) * 32 + embedding) * 3 + causal_attention * 32 * 3
    assert model_flops_per_step(L8B, s, 1) == pytest.approx(expected, rel=1e-15)
    assert model_flops_per_step(L8B, s, 4) == pytest.approx(4 * expected, rel=1e-15)


def test_derived_efficiencies():
    assert tile_efficiency(128, 256) == 0.5
    assert tile_efficiency(14336, 256) == 1.0
    assert tile_efficiency(100, 128) == pytest.approx(100 / 128)
    assert causal_block_fraction(4096, 512) == pytest.approx(9 / 16)  # 8 blocks: 36 of 64
    # zigzag, ring of 4, 8192 tokens, blocks of 512: chunks of 1024 → 2·4−1 full quarter blocks + 2 causal ones
    assert attention_extent(8192, 4, True, block_q=512, block_kv=512) == pytest.approx(1024**2 * (7 + 2 * 3 / 4))
    # no balancing: the last rank, 3 full blocks of 2048 and one causal (4 blocks: 10 of 16)
    assert attention_extent(8192, 4, False, block_q=512, block_kv=512) == pytest.approx(2048**2 * (3 + 10 / 16))
    # 128 × 128 blocks: an int8 block_mask entry and an int8 data_next index (largest 127) each
    assert splash_smem_bytes(131072, 131072, block_q=1024, block_kv=1024) == 128 * 128 * 2
    # 256 × 256 blocks: indices up to 255 need int16
    assert splash_smem_bytes(131072, 131072, block_q=512, block_kv=512) == 256 * 256 * 3
    # 256 query × 64 key blocks: a quarter of the entries, still int16 indices (largest 255)
    assert splash_smem_bytes(131072, 131072, block_q=512, block_kv=2048) == 256 * 64 * 3
    # 512-token query blocks against 2048-token key blocks over 4096 tokens: query block i
    # computes ceil((i+1)/4) key blocks, 1+1+1+1+2+2+2+2 = 12 of 512 × 2048 tokens — as square
    # blocks of 2048 (3 of 4), either way round
    assert attention_extent(4096, 1, False, block_q=512, block_kv=2048) == 12 * 512 * 2048 == 4096**2 * 3 / 4
    assert attention_extent(4096, 1, False, block_q=2048, block_kv=512) == 12 * 512 * 2048


def _plan(**kw):
    base = dict(
        model=L8B,
        topology="v5p:2x2x2",
        seq_len=131072,
        global_batch=1,
        mesh=make_mesh(context=8),
        cp_strategy="ring",
        load_balance="zigzag",
        remat="full",
        loss_chunk_tokens=8192,
    )
    base.update(kw)
    return Plan(**base)


def test_memory_components_by_hand():
    e = estimate(_plan())
    p = 8_030_261_248
    # over the 8-way weight-sharding group (context); no tensor axis here to split the embedding further
    assert e.hbm_bytes["params"] == p * 4 / 8
    # through the backward the 32 layers' fp32 gradients and the head's (4096 × 128256) in bf16; the
    # rest, the embedding's and the head's in fp32, at the update
    layer_p = 218_112_000
    assert e.hbm_bytes["layer_grads"] == 32 * layer_p * 4 / 8 and e.hbm_bytes["head_grad"] == 4096 * 128256 * 2 / 8
    assert e.hbm_bytes["layer_grads"] + e.hbm_bytes["head_grad"] + e.hbm_bytes["update_gradients"] == p * 4 / 8
    # every layer's weights cast to bf16, the norms' scales left out
    assert e.hbm_bytes["weight_casts"] == 32 * (layer_p - 2 * 4096) * 2 / 8
    assert e.hbm_bytes["optimizer"] == 2 * p * 4 / 8
    # with tensor=2 the runtime splits every weight over group × tensor, the input embedding too
    e2 = estimate(_plan(mesh=make_mesh(context=4, tensor=2)))
    assert e2.hbm_bytes["params"] == p / 8 * 4
    tokens = 131072 / 8
    # full remat keeps each layer's input (4096 bf16 values per token), split over tensor (sequence
    # parallelism)
    assert e.hbm_bytes["activations"] == 32 * tokens * 4096 * 2
    assert e2.hbm_bytes["activations"] == 32 * (131072 / 4) * 4096 / 2 * 2
    # one layer's backward, with gradients: attention-side values (residual, normed input, q/k/v,
    # context, out) for every token (Ulysses' call, K/V its own); the MLP's (gate, up, down) for one
    # 4096-token chunk
    attention_side = 3 * 4096 + (2 * 32 + 2 * 8) * 128
    mlp_side = 2 * 14336 + 4096
    ulysses = estimate(_plan(cp_strategy="ulysses", mesh=make_mesh(context_ulysses=8), load_balance="none"))
    assert ulysses.hbm_bytes["attention_working_set"] == 2 * tokens * attention_side * 2
    # the ring's backward runs in hops, K/V in its buffers, each holding q, the output, its gradient and
    # the hop's dq (32·128 each), the residual's gradient and (q recomputed) the normed input (4096 each);
    # all-gather's one call over the gathered K/V holds the same
    beside_kv = tokens * (4 * 32 * 128 + 2 * 4096) * 2
    assert e.hbm_bytes["attention_working_set"] == beside_kv
    assert estimate(_plan(cp_strategy="all_gather")).hbm_bytes["attention_working_set"] == beside_kv
    # the MLP's gathered input and its gradient for every token, the layer output's gradient and the
    # residual the MLP's norm read (on the residual stream's tokens: every token here), one chunk's
    # values, and the chunk loop's three gathered matrices, their three gradient sums and a chunk's new sum; under full
    # remat the attention's forward runs again first, and its values are held through it too
    assert (
        e.hbm_bytes["mlp_working_set"]
        == (4 * tokens * 4096 + 2 * 4096 * mlp_side + 7 * 4096 * 14336 + tokens * attention_side) * 2
    )
    # the fused loss: fp32 logits of 8192 tokens (all 16384 are not held) against one vocabulary
    # piece (128256 = 8 pieces of 16032), and that head piece gathered in bf16 with its fp32 gradient
    assert e.hbm_bytes["logits"] == 8192 * 16032 * 4
    assert e.hbm_bytes["head_buffers"] == 4096 * 16032 * (2 + 4)
    # weights gathered matrix by matrix: the MLP's 4096 × 14336, two in bf16 and one fp32 gradient
    assert e.hbm_bytes["collective_buffers"] == 4096 * 14336 * (2 + 2 + 4)
    unchunked = estimate(_plan(loss_chunk_tokens=0))
    assert unchunked.hbm_bytes["logits"] == tokens * 16032 * 4
    # the loss's input: the last layer's output (on the residual stream's tokens, here all of them) and,
    # on every token, its normed value, the loss loop's copy and the gradient the loop sums
    assert e.hbm_bytes["loss_input"] == 4 * tokens * 4096 * 2
    # the peak: static state plus a layer's backward, or the loss on the state less the layers'
    # gradients, never both phases at once
    b = e.hbm_bytes
    state = b["params"] + b["head_grad"] + b["optimizer"] + b["activations"] + b["weight_casts"]
    # in a layer: the attention side or the MLP side, not both
    layer = max(b["attention_working_set"] + b["attention_buffers"] + b["collective_buffers"], b["mlp_working_set"])
    loss = b["logits"] + b["head_buffers"] + b["loss_input"]
    assert e.hbm_bytes_per_device == max(state + b["layer_grads"] + layer, state + loss)


def test_ring_holds_blocks_all_gather_holds_full_length():
    ring = estimate(_plan())
    gather = estimate(_plan(cp_strategy="all_gather"))
    block = 131072 / 8
    kv_block = 2 * block * 8 * 128 * 2  # K and V of one ring block, bf16
    full_kv = 2 * 131072 * 8 * 128 * 2
    assert gather.hbm_bytes["attention_buffers"] == 2 * full_kv + block * 32 * 4  # K, V, dK, dV; fp32 lse
    # under full remat the attention's forward reruns before the MLP's backward, and its gathered K/V,
    # which the attention's backward reuses, are held through it; with the output kept (no rerun) the
    # backward's gather comes then too; under save_dot_except_mlp the rerun, and its gather, come after
    assert gather.hbm_bytes["mlp_working_set"] - ring.hbm_bytes["mlp_working_set"] == full_kv
    kept = [estimate(_plan(cp_strategy=s, remat="minimal_with_context")) for s in ("all_gather", "ring")]
    assert kept[0].hbm_bytes["mlp_working_set"] - kept[1].hbm_bytes["mlp_working_set"] == full_kv
    later = [estimate(_plan(cp_strategy=s, remat="save_dot_except_mlp")) for s in ("all_gather", "ring")]
    assert later[0].hbm_bytes["mlp_working_set"] == later[1].hbm_bytes["mlp_working_set"]
    # ring, beyond the working set: dq's fp32 sum and the one being formed, dK/dV's fp32 sums arriving
    # and being formed, the next block's K/V arriving; the strategy-independent fp32 lse
    q_block = block * 32 * 128
    assert ring.hbm_bytes["attention_buffers"] == pytest.approx(
        q_block * 4 * 2 + kv_block * (1 + 2 * 4 / 2) + block * 32 * 4
    )
    # ring memory is O(S/N): doubling the sequence and the ring keeps it
    ring16 = estimate(_plan(topology="v5p:2x2x4", seq_len=262144, mesh=make_mesh(context=16)))
    assert ring16.hbm_bytes["attention_buffers"] == pytest.approx(ring.hbm_bytes["attention_buffers"])


def test_ring_hop_holds_what_the_hop_reads_and_forms():
    tokens = 131072 / 8
    # q kept (save_dot_except_mlp): the hop holds no normed input, which the projections' weight
    # gradients recompute after the hops
    kept = estimate(_plan(remat="save_dot_except_mlp"))
    assert kept.hbm_bytes["attention_working_set"] == tokens * (4 * 32 * 128 + 4096) * 2
    # USP's hops are the ring's; chunks of a ring block (16K of 8 blocks) need no hop, leaving one call,
    # whose backward holds the whole working set
    usp_mesh = make_mesh(context=4, context_ulysses=2)
    plain = estimate(_plan(cp_strategy="usp", mesh=usp_mesh, load_balance="none"))
    assert plain.hbm_bytes["attention_working_set"] == tokens * (4 * 32 * 128 + 2 * 4096) * 2
    # under zigzag USP's later sources' hops slice q's and the output gradient's halves anew and form
    # half a dq (32·128 / 2 beyond the ring's whole dq), beside the hop's bf16 dK/dV (2·8·128), in place
    # of the fp32 dK/dV sums a ring of 4 forms while a later hop follows (2·8·128 in fp32)
    usp = estimate(_plan(cp_strategy="usp", mesh=usp_mesh))
    excess = usp.hbm_bytes["attention_working_set"] - plain.hbm_bytes["attention_working_set"]
    assert excess == tokens * ((32 * 128 / 2 + 2 * 8 * 128) * 2 - 2 * 8 * 128 * 4)
    # a ring of 2 has no later hop: the sums are not formed beside them
    pair = make_mesh(context=2, context_ulysses=4)
    two = [estimate(_plan(cp_strategy="usp", mesh=pair, load_balance=b)) for b in ("zigzag", "none")]
    assert (
        two[0].hbm_bytes["attention_working_set"] - two[1].hbm_bytes["attention_working_set"]
        == tokens * (32 * 128 / 2 + 2 * 8 * 128) * 2
    )
    # on tpu7x, whose layout moves write new buffers, the recomputed output laid out anew for the out
    # projection's weight gradient is held through the hops too (32·128 a token); not with the output kept
    tpu7x = dict(cp_strategy="usp", mesh=usp_mesh, topology="tpu7x:2x2x1")
    moved = estimate(_plan(**tpu7x)).hbm_bytes["attention_working_set"] - usp.hbm_bytes["attention_working_set"]
    assert moved == tokens * 32 * 128 * 2
    kept_output = [
        estimate(_plan(**t, remat="minimal_with_context")) for t in (tpu7x, dict(tpu7x, topology="v5p:2x2x2"))
    ]
    assert kept_output[0].hbm_bytes["attention_working_set"] == kept_output[1].hbm_bytes["attention_working_set"]
    # nor with the out projection kept, which the recomputed forward then does not form from it
    kept_proj = [estimate(_plan(**t, remat="save_dot_except_mlp")) for t in (tpu7x, dict(tpu7x, topology="v5p:2x2x2"))]
    assert kept_proj[0].hbm_bytes["attention_working_set"] == kept_proj[1].hbm_bytes["attention_working_set"]
    # kept q/k/v are the hop's q and K/V, not copies beside them: USP's hops hold no more buffers for them;
    # MaxText's whole working set (tokamax's hops not read) holds their kernel layout as copies (32·128 + 2·8·128)
    full, kept_qkv = (estimate(_plan(cp_strategy="usp", mesh=usp_mesh, remat=r)) for r in ("full", "save_qkv_proj"))
    assert kept_qkv.hbm_bytes["attention_buffers"] == full.hbm_bytes["attention_buffers"]
    theirs = [
        estimate(_plan(cp_strategy="usp", mesh=usp_mesh, remat=r), target="maxtext") for r in ("full", "save_qkv_proj")
    ]
    assert (
        theirs[1].hbm_bytes["attention_buffers"] - theirs[0].hbm_bytes["attention_buffers"]
        == tokens * (32 * 128 + 2 * 8 * 128) * 2
    )
    chunks = dataclasses.replace(L8B, window=16384, local_kind="chunked")
    no_hop = estimate(_plan(model=chunks, load_balance="none"))
    assert no_hop.hbm_bytes["attention_working_set"] == 2 * tokens * (3 * 4096 + (2 * 32 + 2 * 8) * 128) * 2
    # MaxText's ring (tokamax's kernel), whose hops have not been read, is priced with the whole set
    maxtext = estimate(_plan(), target="maxtext")
    assert maxtext.hbm_bytes["attention_working_set"] >= 2 * tokens * (3 * 4096 + (2 * 32 + 2 * 8) * 128) * 2


def test_remat_recompute_is_executed_not_model_flops():
    full = estimate(_plan())
    keep = estimate(_plan(remat="minimal_with_context"))
    assert full.model_flops == keep.model_flops
    assert full.executed_flops_per_device > keep.executed_flops_per_device
    assert full.hbm_bytes["activations"] < keep.hbm_bytes["activations"]


def test_mfu_and_throughput_definitions():
    e = estimate(_plan())
    assert e.mfu == pytest.approx(e.model_flops / (e.step_time_s * 8 * 459e12))
    assert e.tokens_per_s_per_chip == pytest.approx(131072 / e.step_time_s / 8)
    assert e.lower_bound_s <= e.step_time_s <= e.upper_bound_s


def test_zigzag_balances_ring_work():
    balanced = estimate(_plan())
    unbalanced = estimate(_plan(load_balance="none"))
    ratio = unbalanced.compute_s["attention"] / balanced.compute_s["attention"]
    assert 1.7 < ratio < 2.0  # (2N−1)/N for N=8 is 1.875, less block effects


def test_from_hf_config(tmp_path):
    cfg = {
        "model_type": "qwen2",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = get_model(str(path))
    assert (spec.num_layers, spec.hidden, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (4, 256, 8, 2, 32)
    assert spec.qkv_bias and spec.tie_embeddings
    assert spec.embedding_params == 1000 * 256 + 256
    assert get_model(str(tmp_path)) == spec  # a directory holding config.json
    cfg["model_type"] = "gpt2"
    path.write_text(json.dumps(cfg))
    with pytest.raises(CpplanError, match="model_type='gpt2' is not supported"):
        get_model(str(path))


def test_a_gemma3_text_config_reads_as_gemma3s_block(tmp_path):
    """Gemma 3's decoder (transformers' Gemma3TextConfig; its defaults where the config leaves fields out: five
    local layers to each global one, a tied head, gelu_pytorch_tanh): four norms a layer and q/k norms, which
    cpplan's runtime runs; counted by hand."""
    cfg = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 6,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 256,
        "sliding_window": 32,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = get_model(str(path))
    assert spec.decoder_block is DecoderBlock.GEMMA3 and spec.qk_norm and spec.tie_embeddings
    assert (spec.window, spec.layer_pattern, spec.mlp_activations) == (32, "LLLLLG", ("gelu", "linear"))
    # a layer: q and out 64·4·16 = 4096 each, k and v 64·2·16 = 2048 each; q and k norms 16 each; four norms of
    # 64; the MLP 3·64·128 = 24576: 37152. Six of them, the embedding 256·64 (the head tied) and the final norm
    assert spec.params_per_layer == 4096 * 2 + 2048 * 2 + 2 * 16 + 4 * 64 + 24576 == 37152
    assert spec.num_params == 6 * 37152 + 256 * 64 + 64
    assert model_refusal(Target.CPPLAN, spec) is None
    assert "has q/k norms" in model_refusal(Target.CPPLAN, dataclasses.replace(spec, decoder_block="llama2"))
    with pytest.raises(CpplanError, match="decoder_block=gemma3 norms q and k per head: give qk_norm=true"):
        dataclasses.replace(spec, qk_norm=False)


def test_unknown_model_names_the_closest():
    with pytest.raises(CpplanError, match="Did you mean 'llama3.1-70b'"):
        get_model("llama3.1-70")
    with pytest.raises(CpplanError, match="multiple of num_kv_heads"):
        ModelSpec("bad", 2, 64, 6, 4, 16, 128, 256)


def test_interpreted_splash_pays_per_grid_step_and_operand_byte():
    from cost_models.compute import splash_step_costs

    # 8 query heads × 256 tokens, 4 kv heads × 1024 tokens, blocks of 256: 8 × 1 × 4 = 32 steps.
    # q-shaped array 8·256·32·2 = 131072 B, k-shaped 4·1024·32·2 = 262144 B; the forward
    # touches q, o, k, v (786432 B), the backward q, dO, dq, q, dO | k, v, k, v, dk, dv (2228224 B)
    fwd, bwd = splash_step_costs(
        8, 4, 256, 1024, head_dim=32, act_bytes=2, block_q=256, block_kv=256, per_step_s=1e-4, per_step_byte_s=1e-9
    )
    assert fwd == pytest.approx(32 * (1e-4 + 786432e-9))
    assert bwd == pytest.approx(32 * (2e-4 + 2228224e-9))


def test_ring_kernel_calls_as_the_runtime_makes_them():
    import numpy as np
    from small_candidates import one_candidate

    from cost_models.strategies import STRATEGIES
    from cost_models.vocabulary import CPStrategy

    def calls(topology, zigzag):
        x = one_candidate(CPStrategy.RING, topology, ring=4, zigzag=zigzag)
        ring = STRATEGIES[CPStrategy.RING]
        return [
            (
                float(c.count[0] if np.ndim(c.count) else c.count),
                float(np.ravel(c.q_len)[0]),
                float(np.ravel(c.kv_len)[0]),
            )
            for c in ring.kernel_calls(x, ring.layout(x))
        ]

    # a 512-token block, causal; three hops: under zigzag half attend all queries to the source's
    # first chunk, half the second query chunk to all of it
    assert calls("v5p:2x2x1", True) == [(1, 512, 512), (1.5, 512, 256), (1.5, 256, 512)]
    # without zigzag only earlier sources compute: all three on the last rank of a TPU slice,
    # half of them on the average rank of a host whose devices share cores
    assert calls("v5p:2x2x1", False)[:2] == [(1, 512, 512), (3, 512, 512)]
    assert calls("cpu:4", False)[:2] == [(1, 512, 512), (1.5, 512, 512)]


def test_maxtext_ring_visits_every_block_of_every_hop_with_the_fused_backward():
    import numpy as np
    from small_candidates import one_candidate

    from cost_models.compute import dq_partial_bytes, splash_step_costs
    from cost_models.strategies import STRATEGIES
    from cost_models.vocabulary import CPStrategy

    for strategy, ulysses in ((CPStrategy.RING, 1), (CPStrategy.USP, 2)):
        x = one_candidate(strategy, ring=4, ulysses=ulysses, zigzag=True)
        spec = STRATEGIES[strategy]
        layout = spec.layout(x)
        calls = spec.maxtext_kernel_calls(x, layout)
        # tokamax's ring kernel: the local call and three hops, each over the whole 512 × 512 grid
        shape = [
            (
                float(np.ravel(c.count)[0]),
                float(np.ravel(c.q_len)[0]),
                float(np.ravel(c.kv_len)[0]),
                c.causal,
                c.fused_backward,
            )
            for c in calls
        ]
        assert shape == [(1, 512, 512, True, True), (3, 512, 512, False, True)], strategy
        # both runtimes merge the three hops into the local call's results, in splash's layout: the
        # head of 32 laid out in a TPU's 128 lanes
        fwd, bwd = spec.merge_bytes(x, layout, calls)
        q_values = 8 / ulysses * 512 * 128
        kv_values = 4 / ulysses * 512 * 128
        assert float(np.ravel(fwd)[0]) == 3 * q_values * (4 + 4 + 2)
        assert float(np.ravel(bwd)[0]) == 3 * 12 * (q_values + 2 * kv_values)
    # one call merges nothing
    x = one_candidate(CPStrategy.ALL_GATHER, ring=4, zigzag=True)
    spec = STRATEGIES[CPStrategy.ALL_GATHER]
    assert spec.merge_bytes(x, spec.layout(x), spec.maxtext_kernel_calls(x, spec.layout(x))) == (0.0, 0.0)
    # the fused backward: one grid instead of two, and the fp32 dq partials of 4 key blocks read
    # back by their sum, plus its result: 4 B × 8·256·32 × (4 + 1) = 1310720 B at 1e-12 s/B
    assert dq_partial_bytes(8, 256, 1024, head_dim=32, block_kv=256) == 4 * 8 * 256 * 32 * 5
    _, two_grids = splash_step_costs(
        8, 4, 256, 1024, head_dim=32, act_bytes=2, block_q=256, block_kv=256, per_step_s=1e-4, per_step_byte_s=0.0
    )
    _, fused = splash_step_costs(
        8,
        4,
        256,
        1024,
        head_dim=32,
        act_bytes=2,
        block_q=256,
        block_kv=256,
        per_step_s=1e-4,
        per_step_byte_s=0.0,
        fused_backward=True,
        hbm_s_per_byte=1e-12,
    )
    assert two_grids == pytest.approx(32 * 2e-4) and fused == pytest.approx(32 * 1e-4 + 1310720e-12)


def test_host_collectives_use_their_measured_rates():
    from cost_models.collectives import Collectives

    host = Collectives((("all_gather", 1e9, 1e-4), ("all_to_all", 1e9, 0.0)))
    # an 8 MB gather over 8 devices copies 7/8 of it in: 7 ms, plus 0.1 ms
    assert host.all_gather(8e6, 8, 1e12, 0.0) == pytest.approx(7.1e-3)
    # a kind not measured falls back to the links given
    assert host.reduce_scatter(8e6, 8, 1e12, 0.0) == pytest.approx(7e-6)
    # shared memory: an all-to-all copies in the 3/4 of A it does not keep (the torus's A·n/4W does not apply)
    assert host.all_to_all(1e6, 4, 5e9, 1.0) == pytest.approx(7.5e-4)
    assert Collectives().all_to_all(1e6, 4, 1e9, 0.0) == pytest.approx(1e-3)


def _one_sequence_per_device(**kw):
    """Llama 3.1 8B, 8192 tokens, one sequence on each of 4 v5p chips, no context parallelism."""
    base = dict(
        model=L8B,
        topology="v5p:2x2x1",
        seq_len=8192,
        global_batch=4,
        mesh=make_mesh(fsdp=4),
        remat="full",
        block_q=512,
        block_kv=512,
    )
    base.update(kw)
    return Plan(**base)


def test_block_kv_is_priced():
    narrow, wide = estimate(_one_sequence_per_device()), estimate(_one_sequence_per_device(block_kv=2048))
    # SMEM: 16 × 16 blocks of 8192 tokens, then 16 × 4; int8 mask entry and int8 index each
    assert narrow.smem_bytes == 16 * 16 * 2
    assert wide.smem_bytes == 16 * 4 * 2
    # the diagonal wastes 8192 · (2048 − 512) / 2 more token pairs per head; 4 FLOPs per pair and
    # head dimension, 32 query heads, 128 dims; forward, backward (the row's ratio) and the full
    # remat's recomputed forward, 32 layers, at v5p's 459 TFLOP/s per chip and its attention
    # efficiency. The grids: 16 × 4 steps per head instead of 16 × 16, and the diagonal's blocks
    # 2048 keys wide instead of 512, each paid by forward, recomputed forward and two backward grids
    chip = candidates_of(_one_sequence_per_device()).topology.chip
    extra_pairs = 8192 * (2048 - 512) / 2
    # (cpplan's runtime splits the one sequence's 8 KV heads into a group per v5p core, so the backward
    # keeps both busy; it runs the dq and dk/dv kernels, whose MXU time is the row's unfused factor times
    # the fused backward's)
    backward = 1 / backward_core_share(splash_row_groups(1 * 8, chip.cores_per_device), chip.cores_per_device)
    assert backward == 1
    unfused_ratio = chip.attention_backward_over_forward * chip.attention_unfused_backward_factor
    extra_math_s = (2 + unfused_ratio * backward) * 4 * 32 * 128 * extra_pairs / (459e12 * chip.attention_efficiency)
    extra_steps_s = (2 + 2 * backward) * chip.attention_block_overhead_s * 32 * (16 * 4 - 16 * 16)
    extra_masked_s = (2 + 2 * backward) * chip.attention_masked_element_s * 32 * 8192 * (2048 - 512)
    extra_s = 32 * (extra_math_s + extra_steps_s + extra_masked_s)
    assert extra_steps_s < 0 < extra_math_s  # the v5p row measures both costs
    assert wide.compute_s["attention"] - narrow.compute_s["attention"] == pytest.approx(extra_s, rel=1e-9)
    assert (wide.step_time_s > narrow.step_time_s) == (extra_s > 0)


def test_larger_key_blocks_take_fewer_grid_steps():
    import dataclasses

    from cost_models.pricing.attention import price_attention
    from cost_models.strategies import STRATEGIES
    from cost_models.vocabulary import CPStrategy

    def attention(block_kv):
        x = candidates_of(_one_sequence_per_device(model=MODELS["small"], topology="cpu:4", block_kv=block_kv))
        topology = x.topology
        stepping_chip = dataclasses.replace(topology.chip, attention_block_overhead_s=1e-5)
        stepping = dataclasses.replace(topology, chip=stepping_chip)
        x = dataclasses.replace(x, case=dataclasses.replace(x.case, topology=stepping))
        return price_attention(x, STRATEGIES[CPStrategy.NONE])

    # one sequence × 8 query heads, 16 query blocks × (16 or 4) key blocks, 10 µs a step;
    # the backward runs two grids
    for block_kv, kv_blocks in ((512, 16), (2048, 4)):
        times = attention(block_kv)
        assert times.grid_forward_s == pytest.approx(8 * 16 * kv_blocks * 1e-5)
        assert times.grid_backward_s == pytest.approx(2 * 8 * 16 * kv_blocks * 1e-5)


def test_layer_and_head_builders_by_hand():
    from cost_models.pricing.elementwise import price_elementwise
    from cost_models.pricing.head import price_head
    from cost_models.pricing.matmul import price_matmuls

    x = candidates_of(_one_sequence_per_device())
    # v5p per chip at the row's measured matmul efficiency; every dimension a multiple of 128
    peak, hbm_bw = 459e12 * x.topology.chip.matmul_efficiency, 2.76e12
    tokens = 8192
    matmuls = price_matmuls(x)
    projections = 2 * tokens * 4096 * (32 + 2 * 8) * 128 + 2 * tokens * 4096 * 32 * 128
    mlp = 2 * tokens * 3 * 4096 * 14336
    assert matmuls.projections_s == pytest.approx(projections / peak)
    assert matmuls.mlp_s == pytest.approx(mlp / peak)
    assert matmuls.forward_s == pytest.approx((projections + mlp) / peak)  # the math outlasts reading 436 MB
    # full remat: every projection again, and the MLP's gate and up; not its down projection, whose
    # output no backward reads (jax drops that recomputation)
    assert matmuls.recompute_s == pytest.approx((projections + mlp * 2 / 3) / peak)
    assert matmuls.executed_flops == pytest.approx(4 * projections + (3 + 2 / 3) * mlp)
    # norms and residual adds on 10 full-width values per token; RoPE on q and k (2 · 40 heads · 128);
    # SwiGLU's 3 · 14336; bf16 read or written once each
    # and the layer loop copies full remat's one kept value, the layer input, into its stack (read, written)
    elementwise = price_elementwise(x)
    ops = tokens * (10 * 4096 + 2 * 40 * 128 + 3 * 14336) * 2 / hbm_bw
    assert elementwise.kept_copies_s == pytest.approx(tokens * 4096 * 2 * 2 / hbm_bw)
    assert elementwise.forward_s == pytest.approx(ops + elementwise.kept_copies_s)
    assert elementwise.backward_s == pytest.approx(2 * ops)
    head = price_head(x)
    # forward and two backward matmuls against the 128256-token vocabulary; 16 bytes per fp32 logit
    assert head.matmul_s == pytest.approx(3 * 2 * tokens * 4096 * 128256 / peak)
    assert head.cross_entropy_s == pytest.approx(tokens * 128256 * 16 / hbm_bw)


def test_communication_hides_in_one_window_per_layer():
    from cost_models.overlap import FAMILIES, Overlap
    from cost_models.pricing.communication import ContextTraffic, Traffic, context_traffic, price_exposure
    from cost_models.strategies import CPCost

    def overlap(fraction):
        return Overlap({f: fraction for f in FAMILIES}, {}, "test")

    context = ContextTraffic(forward_s=2.0, backward_s=4.0, exposed_forward_s=0.5, exposed_backward_s=1.0)
    traffic = Traffic(
        weight_gather_s=3.0,
        backward_gather_s=3.0,
        gradient_scatter_s=2.0,
        head_gather_s=0.25,
        head_scatter_s=0.25,
        embedding_s=0.25,
        tensor_s=0.25,
        data_all_reduce_s=0.125,
        context=context,
    )
    exposed = price_exposure(traffic, layer_forward_s=4.0, layer_backward_s=6.0, num_layers=10, overlap=overlap(1.0))
    # forward: gather 3 + hidden ring 1.5 in a 4 s window → 0.5 out; backward: gather 3 + scatter 2
    # + hidden ring 3 in 6 s → 2 out, the tensor traffic (2.5 ms a layer) hiding beside them; ten
    # layers, and the head's and embedding's traffic never hidden
    assert exposed.fsdp == pytest.approx(10 * (0.5 + 0.0125 + 2.0 + 0.0125) + 0.5)
    assert exposed.context == pytest.approx(10 * (0.5 + 1.0))
    assert (exposed.embedding, exposed.tensor, exposed.data_all_reduce) == (0.25, pytest.approx(0.0), 0.125)
    no_window = price_exposure(traffic, layer_forward_s=4.0, layer_backward_s=6.0, num_layers=10, overlap=overlap(0.0))
    assert no_window.fsdp == pytest.approx(10 * (3.0 + 5.0) + 0.5) and no_window.tensor == 0.25
    # what the compiler does not overlap hides nowhere: half of each gather (twice a layer) and of
    # the scatter is exposed; the other half fits the windows beside the strategy's hidden traffic
    half = price_exposure(traffic, layer_forward_s=4.0, layer_backward_s=6.0, num_layers=10, overlap=overlap(0.5))
    assert half.fsdp == pytest.approx(10 * (2 * 1.5 + 1.0) + 0.5)
    # a recomputed forward sends its traffic again, less what it makes unnecessary; only the
    # overlapped fraction of what the spec hides is hidden
    cost = CPCost(
        forward_s=2.0,
        backward_s=4.0,
        exposed_forward_s=0.5,
        exposed_backward_s=1.0,
        buffer_bytes=0.0,
        recompute_reuses_s=0.5,
    )
    assert context_traffic(cost, 1.0, 0.0, hides_behind_attention=True, shares_hops=False) == ContextTraffic(
        2.0, 5.5, 2.0, 5.5
    )
    assert context_traffic(cost, 1.0, 1.0, hides_behind_attention=True, shares_hops=False) == ContextTraffic(
        2.0, 5.5, 0.5, 1.0
    )
    # a strategy whose spec hides nothing offers the overlapped fraction of all its traffic to the window
    assert context_traffic(cost, 1.0, 0.5, hides_behind_attention=False, shares_hops=False) == ContextTraffic(
        2.0, 5.5, 1.0, 2.75
    )
    # where the target's compiler shares the ring's hops with the recomputed forward, they are reused too
    shared = dataclasses.replace(cost, recompute_shared_hops_s=1.0)
    assert context_traffic(shared, 1.0, 0.0, hides_behind_attention=True, shares_hops=True) == ContextTraffic(
        2.0, 4.5, 2.0, 4.5
    )
    assert context_traffic(shared, 1.0, 0.0, hides_behind_attention=True, shares_hops=False) == ContextTraffic(
        2.0, 5.5, 2.0, 5.5
    )


def test_splash_vmem_rule_follows_what_each_compiler_grants():
    """The compilers' scoped VMEM for one kernel: 16 MiB by default on v5p, raised by flag up to its
    VMEM (65472 KiB), where splash compiles at blocks of 2048 (27.9M) and 4096 × 2048; 32 MiB by
    default on tpu7x, where 2048 compiles without the flag but for the fused backward's dK/dV step
    (38.06M). The rule's estimate of a grid step (38 MiB at 2048 with that step's own buffers, 124 MiB at
    4096) takes 2048 on both, asks the flag for it on both, and refuses 4096, which neither compiled at
    any limit."""
    import dataclasses

    import planner
    from cost_models.compute import scoped_vmem_limit_kib, splash_vmem_bytes, splash_vmem_problem
    from cost_models.topology import get_topology

    v5p, tpu7x = get_topology("v5p-16").chip, get_topology("tpu7x-16").chip
    # the forward's step, then the fused dK/dV step's own: dK and dV in fp32, the fp32 dq partial and dO
    # blocks double-buffered, the log-sum-exp and its delta 128 lanes wide in fp32
    forward = 2048 * 2048 * 6 + 2048 * 384 * 4 + 2 * 8192 * 128 * 2
    fused = 2 * 2048 * 128 * 4 + 2 * 2048 * 128 * 6 + 2 * 2048 * 128 * 4
    assert splash_vmem_bytes(2048, 2048, head_dim=128, act_bytes=2) == forward + fused == 38 * 2**20
    for chip in (v5p, tpu7x):
        assert splash_vmem_problem(2048, 2048, head_dim=128, act_bytes=2, chip=chip) is None
        problem = splash_vmem_problem(4096, 4096, head_dim=128, act_bytes=2, chip=chip)
        assert "4096×4096 need about 124.0 MiB" in problem
    assert scoped_vmem_limit_kib(2048, 2048, head_dim=128, act_bytes=2, chip=v5p) == 65472
    assert scoped_vmem_limit_kib(1024, 1024, head_dim=128, act_bytes=2, chip=v5p) is None
    assert scoped_vmem_limit_kib(2048, 2048, head_dim=128, act_bytes=2, chip=tpu7x) == 65472
    plan = planner.plan("llama3.1-8b", "128k", "v5p-16", global_batch_tokens="128k")
    wide = dataclasses.replace(plan, block_q=2048, block_kv=2048)
    assert wide.scoped_vmem_limit_kib == 65472 and planner.estimate(wide).step_time_s > 0
    with pytest.raises(CpplanError, match="scoped VMEM"):
        planner.estimate(dataclasses.replace(plan, block_q=4096, block_kv=4096))


def test_axes_on_whole_dimensions_by_hand():
    from cost_models.placement import axes_on_whole_dimensions

    torus = (4, 4, 4)
    assert axes_on_whole_dimensions((64,), torus) and axes_on_whole_dimensions((16, 4), torus)
    assert axes_on_whole_dimensions((1, 4, 16), torus)  # axes of one device take no dimension
    assert not axes_on_whole_dimensions((8, 8), torus)  # 8 = 4 × 2: a dimension split in two
    assert not axes_on_whole_dimensions((32, 2), torus)
    assert axes_on_whole_dimensions((8,), torus)  # one axis splits nothing between axes
    assert axes_on_whole_dimensions((8, 2), (8, 2, 1)) and not axes_on_whole_dimensions((4, 4), (8, 2, 1))


def test_ulysses_holds_only_kept_values_in_both_layouts():
    # the all-to-all lays the working set's own q/K/V/out out for the kernel; what the policy keeps (q, K
    # and V under save_qkv_proj: 32 + 2·8 heads of 128 per token) is held in both layouts, as under USP
    tokens = 8 * 16384 / 8
    kw = dict(topology="v5p:2x2x2", seq_len=16384, global_batch=8, mesh=make_mesh(context_ulysses=8))
    kept = estimate(_plan(cp_strategy="ulysses", load_balance="none", remat="save_qkv_proj", **kw))
    recomputed = estimate(_plan(cp_strategy="ulysses", load_balance="none", remat="full", **kw))
    # one fp32 value per query (8 sequences of 16384 after the exchange) and local head (32 / 8)
    per_query = 8 * 16384 * (32 / 8) * 4
    assert kept.hbm_bytes["attention_buffers"] == tokens * (32 + 2 * 8) * 128 * 2 + per_query
    assert recomputed.hbm_bytes["attention_buffers"] == per_query


def test_log_sum_exp_held_lane_wide_on_tpu7x():
    # Ulysses over 2 (fsdp 4) on tpu7x, full remat: per token of the device, the working set is twice the
    # attention side's values (hidden 4096, q/k/v/out (2·32 + 2·8)·128, the residual stream's 2·4096),
    # bf16: 90112 bytes; one fp32 value per local query (seq 16384 of them) and head (32/2): 2·16·4 = 128
    # bytes. Before the kernels, the lane-wide log-sum-exp (128 fp32 lanes, 2·16·512 = 16384 bytes) and its
    # slicing copy are live beside the recomputed values but no q/k/v gradient (48·128·2) and no residual
    # stream gradient (8192·2): 90112 − 12288 − 16384 + 128 + 2·16384 = 94336 bytes, 4096 over the kernels'
    tokens = 8 * 16384 / 8
    kw = dict(seq_len=16384, global_batch=8, mesh=make_mesh(fsdp=4, context_ulysses=2), remat="full")
    tpu7x = estimate(_plan(topology="tpu7x:2x2x1", cp_strategy="ulysses", load_balance="none", **kw))
    assert tpu7x.hbm_bytes["attention_working_set"] == tokens * 90112
    assert tpu7x.hbm_bytes["attention_buffers"] == tokens * 128
    assert tpu7x.hbm_bytes["lse_relayout"] == tokens * 4096
    # v5p's compiler slices it as the kernel writes it; a ring's backward reads the merged one
    assert (
        estimate(_plan(topology="v5p:2x2x2", cp_strategy="ulysses", load_balance="none", **kw)).hbm_bytes[
            "lse_relayout"
        ]
        == 0
    )
    ring = dict(kw, mesh=make_mesh(fsdp=4, context=2))
    assert estimate(_plan(topology="tpu7x:2x2x1", **ring)).hbm_bytes["lse_relayout"] == 0


def test_one_layer_step_keeps_the_log_sum_exp_lane_wide_on_tpu7x():
    # with no layer loop to stack (and slice) the kept values, a one-layer step that keeps the attention
    # output keeps the kernel's lane-wide log-sum-exp: 128 fp32 lanes per query (16384) and head (32)
    def activations(layers, remat):
        model = dataclasses.replace(L8B, name=f"l8b-{layers}l", num_layers=layers)
        mesh = make_mesh(fsdp=8)
        plan = _plan(model=model, topology="tpu7x:2x2x1", seq_len=16384, global_batch=8, mesh=mesh, remat=remat)
        return estimate(dataclasses.replace(plan, cp_strategy="none", load_balance="none")).hbm_bytes["activations"]

    lanes = 16384 * 32 * 128 * 4
    assert activations(1, "minimal_with_context") == activations(2, "minimal_with_context") / 2 + lanes
    assert activations(1, "full") == activations(2, "full") / 2


def test_heads_narrower_than_a_lane_take_whole_lanes_in_splashs_layout():
    import numpy as np
    from small_candidates import one_candidate

    from cost_models.strategies import STRATEGIES
    from cost_models.strategies.base import lane_ratio
    from cost_models.vocabulary import CPStrategy
    from planner import plan

    # small's head of 32 in a TPU's 128 lanes: 4× its bytes; a host lays it out as it is
    tpu, host = (one_candidate(CPStrategy.RING, topology, ring=4, zigzag=True) for topology in ("v5p:2x2x1", "cpu:4"))
    assert lane_ratio(tpu) == 4.0 and lane_ratio(host) == 1.0
    # a ring of 4 over one 2048-token sequence: blocks of 512 tokens, 8 query and 4 KV heads of 32, three
    # hops; in flight, the next hop's K/V (2 · 512 · 4 · 32 · 2 B) and dK/dV's fp32 sums arriving (twice
    # that), as they are; forming, dq's fp32 sum and the one being formed (512 · 8 · 32 · 8 B) and the
    # dK/dV sums (2 · 512 · 4 · 32 · 4 B), lane-padded
    kv_block, q_block = 2 * 512 * 4 * 32 * 2, 512 * 8 * 32
    for x, ratio in ((tpu, 4), (host, 1)):
        spec = STRATEGIES[CPStrategy.RING]
        cost = spec.cost(x, spec.layout(x), np.zeros(1), np.zeros(1))
        in_flight, forming = kv_block * 3, q_block * 8 + kv_block * 2
        assert float(np.ravel(cost.buffer_bytes)[0]) == in_flight + ratio * forming

    def notes(model, topology):
        return estimate(plan(model, "4k", topology, global_batch_tokens="4k")).notes

    # what the price still leaves out is said
    (note,) = notes("small", "v5p:2x2x1")
    assert note.startswith("head_dim 32 is not a multiple of the TPU's 128 lanes") and "lane-padded (4×" in note
    assert notes("llama3.1-8b", "v5p:2x2x1") == () and notes("small", "cpu:8") == ()


def test_a_zigzag_hop_holds_half_a_dq_and_its_dkv_unless_a_later_hops_sums_are_larger():
    from small_candidates import one_candidate

    from cost_models.strategies import STRATEGIES
    from cost_models.strategies.ring import zigzag_hop_excess
    from cost_models.vocabulary import CPStrategy

    def excess(ring, zigzag=True):
        x = one_candidate(CPStrategy.RING, "cpu:4", ring=ring, zigzag=zigzag)
        return float(zigzag_hop_excess(x, STRATEGIES[CPStrategy.RING].layout(x))[0])

    # a ring of two over 2048 tokens: one hop, 1024 queries of 8 heads and keys of 4 heads of 32; half a dq
    # (1024 · 8 · 32 / 2) and the hop's dK/dV (2 · 1024 · 4 · 32), bf16
    assert excess(2) == (1024 * 8 * 32 / 2 + 2 * 1024 * 4 * 32) * 2
    # a ring of four: a later hop's fp32 dK/dV sums (2 · 512 · 4 · 32 · 4 B) are larger: nothing more
    assert excess(4) == 0.0
    assert excess(2, zigzag=False) == 0.0


def test_a_plan_of_heads_of_64_the_compiler_refused_is_priced_as_not_fitting():
    from planner import evaluate

    # llama3.2-1b, 54 × 64K on v5p-8 under all-gather 2 × fsdp 2, remat full: the compiler needs 109.8 GiB
    # of 95.7 (docs/measurements.md, "Heads narrower than a lane"); with the head counted as it is, 94.87
    mesh = {"fsdp": 2, "context": 2}
    e = evaluate("llama3.2-1b", "64k", "v5p-8", strategy="all_gather", mesh=mesh, global_batch=54)
    assert not e.fits and e.hbm_bytes_per_device == pytest.approx(109.8 * 2**30, rel=0.05)


def test_a_layers_forward_by_hand():
    # minimal_with_context keeps q/k/v's projections (32·128 + 2·8·128), the out projection and the MLP's
    # down projection (4096 each), its two input projections (14336 each) and the attention output (32·128)
    kept = 6144 + 4096 + 4096 + 2 * 14336 + 4096
    tokens = 11 * 131072 / 8
    e = estimate(_plan(remat="minimal_with_context", global_batch=11))
    assert e.hbm_bytes["activations"] == 32 * tokens * kept * 2
    # at the MLP of a layer of the loop: its kept values in their own buffers (copied into the stacks as
    # it ends), the layer input and the residual sum, the MLP's input, its three matrices
    assert e.hbm_bytes["forward_working_set"] == (tokens * kept + 3 * tokens * 4096 + 3 * 4096 * 14336) * 2
    # so many kept values a layer: the forward holds more than any layer's backward
    forward, backward = _forward_and_backward(e.hbm_bytes)
    assert forward > backward and e.hbm_bytes_per_device == forward
    # full remat keeps the layer input alone; the backward holds more
    full = estimate(_plan(global_batch=11))
    assert full.hbm_bytes["forward_working_set"] == (4 * tokens * 4096 + 3 * 4096 * 14336) * 2
    forward, backward = _forward_and_backward(full.hbm_bytes)
    assert forward < backward and full.hbm_bytes_per_device == backward
    # on v5p a layer whose kernel writes the log-sum-exp the backward reads (Ulysses' one call, not the
    # ring's hops, merged) holds it lane-wide, fp32 × 128 lanes a query and head, to the layer's end;
    # tpu7x slices it at once: 11 sequences × 128K queries × 4 heads a device
    ulysses = dict(cp_strategy="ulysses", mesh=make_mesh(context_ulysses=8), load_balance="none")
    chips = [
        estimate(_plan(**ulysses, remat="minimal_with_context", global_batch=11, topology=t)).hbm_bytes
        for t in ("v5p:2x2x2", "tpu7x:2x2x1")
    ]
    assert chips[0]["forward_working_set"] - chips[1]["forward_working_set"] == 11 * 131072 * 4 * 128 * 4
    ring_tpu7x = estimate(_plan(remat="minimal_with_context", global_batch=11, topology="tpu7x:2x2x1"))
    assert ring_tpu7x.hbm_bytes["forward_working_set"] == e.hbm_bytes["forward_working_set"]
    # a step of one layer has no layer loop: its kept values are formed in place
    one = estimate(_plan(model=dataclasses.replace(L8B, num_layers=1), remat="minimal_with_context", global_batch=11))
    assert one.hbm_bytes["forward_working_set"] == (3 * tokens * 4096 + 3 * 4096 * 14336) * 2


def _forward_and_backward(b: dict) -> tuple[float, float]:
    """A layer's forward on the state before any gradient; the static state with a layer's backward (its
    attention side or its MLP side), or the loss on the state less the layers' gradients."""
    state = b["params"] + b["optimizer"] + b["activations"] + b["weight_casts"]
    forward = state + b["forward_working_set"]
    attention = b["attention_working_set"] + b["attention_buffers"] + b["lse_relayout"] + b["collective_buffers"]
    layer = state + b["layer_grads"] + b["head_grad"] + max(attention, b["mlp_working_set"])
    return forward, max(layer, state + b["head_grad"] + b["logits"] + b["head_buffers"] + b["loss_input"])


def test_backward_core_share_by_hand():
    # the backward's only parallel grid dimension is the vmapped batch: on two cores one sequence keeps
    # one busy, two keep both, three take two rounds on one core (3 of 4 core-rounds), four both twice
    assert list(backward_core_share([1, 2, 3, 4], 2)) == [0.5, 1.0, 0.75, 1.0]
    assert list(backward_core_share([1, 3], 1)) == [1.0, 1.0]


def test_sequences_and_groups_keep_v5p_cores_busy_in_the_backward():
    # v5p's megacore: MaxText's backward of 2 sequences per device runs both cores, so its MXU time is
    # what 1 sequence takes on one core; cpplan's runtime splits even 1 sequence's 8 KV heads over both,
    # so its backward per sequence is the same at 1 and 2; the forward's heads run on both cores in each
    one, two = (candidates_of(_one_sequence_per_device(global_batch=b)) for b in (4, 8))
    mxu_backward = lambda a: (a.backward_s - a.grid_backward_s - a.merge_backward_s).item()
    for target, growth in ((Target.MAXTEXT, 1.0), (Target.CPPLAN, 2.0)):
        a1, a2 = (price_attention(x, STRATEGIES[x.strategy], traits=TRAITS[target]) for x in (one, two))
        assert a2.math_forward_s.item() == pytest.approx(2 * a1.math_forward_s.item(), rel=1e-12)
        assert mxu_backward(a2) == pytest.approx(growth * mxu_backward(a1), rel=1e-12)


def test_maxtext_lays_gathered_zigzag_kv_out_in_hbm_passes_by_hand():
    # all-gather over context=8 at 128K: the gathered K and V are 2 × 131072 × 8 KV heads × 128 × 2 bytes;
    # MaxText's compile moves 10 of those per forward laying them out in natural order and 9 putting
    # dK/dV back; unbalanced layers and cpplan's runtime (not read from a compile) move none of it
    kv_bytes = 2 * 131072 * 8 * 128 * 2
    hbm_s = 1.0 / candidates_of(_plan()).topology.hbm_bw_per_device
    spec = STRATEGIES["all_gather"]
    merge = {}
    for target in (Target.MAXTEXT, Target.CPPLAN):
        for balance in ("zigzag", "none"):
            x = candidates_of(_plan(cp_strategy="all_gather", load_balance=balance))
            a = price_attention(x, spec, traits=TRAITS[target])
            merge[target, balance] = (float(np.squeeze(a.merge_forward_s)), float(np.squeeze(a.merge_backward_s)))
    assert merge[Target.MAXTEXT, "zigzag"] == pytest.approx((10 * kv_bytes * hbm_s, 9 * kv_bytes * hbm_s), rel=1e-12)
    assert merge[Target.MAXTEXT, "none"] == merge[Target.CPPLAN, "zigzag"] == merge[Target.CPPLAN, "none"] == (0, 0)
