"""A model with a full (non-causal) mask (`ModelSpec.causal=False`), against numbers worked out by
hand: its FLOPs, the kernel calls and attention extent of every strategy, the zigzag refusal,
the explain line, the MaxText export refusal, and the corpus runs that ran so."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from cost_models.compute import attention_extent
from cost_models.errors import CpplanError
from cost_models.flops import layer_forward_flops, model_flops_per_step
from cost_models.models import MODELS, ModelSpec
from cost_models.pricing.attention import price_attention
from planner import Plan, candidates_of, estimate, evaluate, explain, make_mesh
from planner.maxtext import export_maxtext
from validation.corpus import CAUSAL_FLASH_SINCE, plan_of, read_corpus

pytestmark = pytest.mark.pure

# 4 layers, hidden 256, 8 query heads / 4 KV heads × 32, MLP 512, vocabulary 256
CAUSAL = MODELS["small"]
FULL = dataclasses.replace(CAUSAL, name="small-encoder", causal=False)


def test_the_mask_is_a_validated_model_field():
    assert CAUSAL.causal and all(m.causal for m in MODELS.values())  # every named model is a decoder
    with pytest.raises(CpplanError, match="causal='no' must be true or false"):
        dataclasses.replace(CAUSAL, causal="no")
    assert ModelSpec.from_dict(FULL.to_dict()) == FULL and FULL.to_dict()["causal"] is False
    plan = Plan(
        model=FULL, topology="v5p:2x2x1", seq_len=4096, global_batch=1, mesh=make_mesh(context=4), cp_strategy="ring"
    )
    assert Plan.from_json(plan.to_json()) == plan and not Plan.from_json(plan.to_json()).model.causal
    row = {k: v for k, v in CAUSAL.to_dict().items() if k != "causal"}  # models written before the field
    assert ModelSpec.from_dict(row) == CAUSAL


def test_model_flops_count_every_pair_of_a_full_mask():
    s = 1024
    # per layer forward: q, k, v 2·s·256·(8+2·4)·32; out 2·s·256·8·32; MLP 2·s·3·256·512;
    # attention 4·s·s·8·32 over every pair (a causal mask counts half)
    qkv, out, mlp = 2 * s * 256 * 16 * 32, 2 * s * 256 * 8 * 32, 2 * s * 3 * 256 * 512
    full_attention = 4 * s * s * 8 * 32
    assert (qkv, out, mlp, full_attention) == (268_435_456, 134_217_728, 805_306_368, 1_073_741_824)
    layer = layer_forward_flops(FULL, s, s)
    assert (layer.qkv, layer.out_proj, layer.mlp, layer.attention) == (qkv, out, mlp, full_attention)
    assert layer_forward_flops(CAUSAL, s, s).attention == full_attention / 2
    head = 2 * s * 256 * 256
    # forward once, backward twice: 3 · (4 layers + the head)
    assert model_flops_per_step(FULL, s, 1) == 3 * (4 * (qkv + out + mlp + full_attention) + head) == 27_783_069_696
    assert model_flops_per_step(FULL, s, 1) - model_flops_per_step(CAUSAL, s, 1) == 3 * 4 * full_attention / 2


# strategy, mesh on 4 devices, (count, query tokens, key tokens) of each call at 4096 tokens,
# query heads in the kernel, and the token pairs per head its device computes
CASES = [
    ("none", dict(fsdp=4), [(1, 4096, 4096)], 8, 4096 * 4096),
    ("all_gather", dict(context=4), [(1, 1024, 4096)], 8, 1024 * 4096),
    ("ulysses", dict(context_ulysses=4), [(1, 4096, 4096)], 2, 4096 * 4096),
    # the local block, then all three hops whole, on every rank
    ("ring", dict(context=4), [(1, 1024, 1024), (3, 1024, 1024)], 8, 4 * 1024 * 1024),
    ("usp", dict(context=2, context_ulysses=2), [(1, 2048, 2048), (1, 2048, 2048)], 4, 2 * 2048 * 2048),
]


@pytest.mark.parametrize("topology", ["v5p:2x2x1", "cpu:4"])
@pytest.mark.parametrize("strategy,mesh,calls,q_heads,pairs", CASES, ids=[c[0] for c in CASES])
def test_every_strategy_computes_every_block(strategy, mesh, calls, q_heads, pairs, topology):
    plan = Plan(
        model=FULL,
        topology=topology,
        seq_len=4096,
        global_batch=4,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        block_q=512,
        block_kv=512,
    )
    plan.check()
    spec, shape = plan.strategy_spec, plan.shape
    layout = spec.layout(shape)
    listed = [(float(c.count), float(c.q_len), float(c.kv_len)) for c in spec.kernel_calls(shape, layout)]
    assert listed == calls  # on chips and on a host's shared cores alike: every rank does the same
    assert not any(c.causal for c in spec.kernel_calls(shape, layout))
    assert float(layout.q_heads) == q_heads
    assert sum(n * q * kv for n, q, kv in calls) == pairs
    assert attention_extent(4096, layout.ring, False, block_q=512, block_kv=512, causal=False) == pairs
    x = candidates_of(plan)
    attention = price_attention(x, spec)
    sequences = 4 / (plan.axis_size("data") * plan.axis_size("fsdp"))
    assert float(attention.forward_flops[0]) == 4 * sequences * q_heads * 32 * pairs
    assert float(attention.smem_bytes[0]) == 0  # a full mask keeps no metadata
    # the causal model does less: the blocks above the diagonal are skipped (even on the busiest rank)
    causal_plan = dataclasses.replace(plan, model=CAUSAL)
    assert float(price_attention(candidates_of(causal_plan), spec).forward_flops[0]) < float(attention.forward_flops[0])


def test_zigzag_is_refused_for_a_full_mask():
    with pytest.raises(
        CpplanError,
        match=r"load_balance=zigzag: .*'small-encoder' attends with a full \(non-causal\) "
        r"mask .*same work; plan with load_balance='none'",
    ):
        Plan(
            model=FULL,
            topology="v5p:2x2x1",
            seq_len=4096,
            global_batch=1,
            mesh=make_mesh(context=4),
            cp_strategy="ring",
            load_balance="zigzag",
        )
    zigzag = Plan(
        model=CAUSAL,
        topology="v5p:2x2x1",
        seq_len=4096,
        global_batch=1,
        mesh=make_mesh(context=4),
        cp_strategy="all_gather",
        load_balance="zigzag",
    )
    shape = dataclasses.replace(zigzag.shape, model=FULL)
    violation = zigzag.strategy_spec.check(shape)
    assert violation.category == "load balance" and "full (non-causal) mask" in violation.reason
    # the search does not offer it, and says why when only zigzag is allowed
    found = explain(FULL, 4096, "v5p:2x2x1", global_batch=4, load_balance="zigzag", strategies=["ring"])
    assert found.best is None
    assert {r.reason for r in found.result.rejections} == {
        "only zigzag was allowed; a full (non-causal) mask has nothing to balance"
    }


def test_evaluate_defaults_to_no_balancing_under_a_full_mask():
    """A ring plan given without load_balance is balanced for a causal model and not for a full
    mask (zigzag would be refused there): the balanced causal ring halves the work the full mask
    computes on every rank."""
    full = evaluate(FULL, 4096, "v5p:2x2x1", strategy="ring", mesh={"context": 4})
    causal = evaluate(CAUSAL, 4096, "v5p:2x2x1", strategy="ring", mesh={"context": 4})
    none = evaluate(CAUSAL, 4096, "v5p:2x2x1", strategy="ring", mesh={"context": 4}, load_balance="none")
    assert causal.step_time_s != none.step_time_s  # the causal default is zigzag
    assert full.step_time_s > causal.step_time_s  # every block computed


def test_explain_says_the_mask_and_lists_no_zigzag_ties():
    full = explain(FULL, 8192, "v5p:2x2x1", global_batch=4)
    text = str(full)
    assert text.splitlines()[1].startswith("attention: full (non-causal) mask: every query sees every key")
    plans = [r.plan for r in full.result.ranked]
    assert plans and all(p.load_balance.value == "none" for p in plans)
    causal = explain(CAUSAL, 8192, "v5p:2x2x1", global_batch=4)
    assert "non-causal" not in str(causal)
    assert any(r.plan.load_balance.value == "zigzag" for r in causal.result.ranked)
    json.loads(full.to_json())


def test_maxtext_export_refuses_a_full_mask():
    plan = Plan(model=FULL, topology="v5p:2x2x1", seq_len=4096, global_batch=4, mesh=make_mesh(fsdp=4))
    with pytest.raises(
        CpplanError,
        match=r"MaxText cannot run this plan: model 'small-encoder' attends with a full "
        r"\(non-causal\) mask.*runs its llama2 and default decoder blocks causal",
    ):
        export_maxtext(plan)
    export_maxtext(dataclasses.replace(plan, model=CAUSAL))


def test_full_mask_prices_more_attention_time():
    # a balanced causal ring does about half of a full one's work on each rank
    plans = [
        Plan(
            model=m,
            topology="v5p:2x2x1",
            seq_len=32768,
            global_batch=1,
            mesh=make_mesh(context=4),
            cp_strategy="ring",
            load_balance=balance,
        )
        for m, balance in ((CAUSAL, "zigzag"), (FULL, "none"))
    ]
    causal, full = (estimate(p) for p in plans)
    assert full.compute_s["attention"] > 1.5 * causal.compute_s["attention"]
    assert full.compute_s["matmul"] == pytest.approx(causal.compute_s["matmul"])
    assert np.isfinite(full.mfu) and full.model_flops > causal.model_flops


def test_corpus_runs_before_causal_flash_are_priced_with_a_full_mask():
    runs = read_corpus(Path(__file__).resolve().parents[2] / "benchmarks" / "public_runs.csv")
    early = [r for r in runs if r.row["date"] < CAUSAL_FLASH_SINCE]
    # the 24 v5e runs of the MaxText README at e47fa1b (2023-10-31); the v5p table (2023-12-15) ran causal
    assert len(early) == 24 and all(r.run_id.startswith("v5e-") and not r.plan.model.causal for r in early)
    assert all(r.plan.model.causal for r in runs if r not in early)
    # the attention path without flash (a dot product under MaxText's causal decoder mask) stays causal
    row = dict(
        early[0].row,
        maxtext_flags=early[0]
        .row["maxtext_flags"]
        .replace("enable_flash_attention=true", "enable_flash_attention=false"),
    )
    assert plan_of(row, "test")[0].model.causal
