"""Properties that hold for every plan: monotone costs, JSON and MaxText round trips."""

import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cost_models.errors import CpplanError
from cost_models.models import MODELS
from cost_models.pricing import backward_bytes
from cost_models.strategies import STRATEGIES, strategies_for
from cost_models.topology import get_topology
from cost_models.vocabulary import AXES, LoadBalance, RematPolicy
from planner import Plan, make_mesh
from planner.estimate import estimate
from planner.maxtext import maxtext_block, maxtext_problems
from planner.options import ordered_factorizations

pytestmark = pytest.mark.pure
TOPOLOGIES = ["cpu:8", "v5p:2x2x2", "v5p:4x4x4", "tpu7x:2x2x1", "v5e:4x4"]
MODEL_NAMES = ["tiny", "tiny-mha", "small", "llama3.1-8b", "llama2-7b"]


@st.composite
def plans(draw, topologies=TOPOLOGIES):
    topo = get_topology(draw(st.sampled_from(topologies)))
    # dense models: the expert axis is one device
    sizes = draw(st.sampled_from(ordered_factorizations(topo.num_devices, len(AXES), {AXES.index("expert"): 1})))
    mesh = dict(zip(AXES, sizes))
    strategy = draw(st.sampled_from(strategies_for(mesh["context"], mesh["context_ulysses"])))
    balanced = STRATEGIES[strategy].balances_load
    cp = mesh["context"] * mesh["context_ulysses"]
    seq_len = 2 * cp * draw(st.sampled_from([128, 256, 1024, 4096]))
    return Plan(
        model=MODELS[draw(st.sampled_from(MODEL_NAMES))],
        topology=topo.name,
        seq_len=seq_len,
        global_batch=mesh["data"] * mesh["fsdp"] * draw(st.integers(1, 3)),
        mesh=make_mesh(**mesh),
        axis_order=tuple(draw(st.permutations(AXES))),
        cp_strategy=strategy,
        load_balance=draw(st.sampled_from(list(LoadBalance))) if balanced else LoadBalance.NONE,
        remat=draw(st.sampled_from(list(RematPolicy))),
        block_q=128,
        block_kv=128,
        loss_chunk_tokens=draw(st.sampled_from([0, 1024])),
    )


@settings(max_examples=200, deadline=None)
@given(plans())
def test_plan_json_round_trip(plan):
    assert Plan.from_json(plan.to_json()) == plan


@settings(max_examples=100, deadline=None)
@given(plans())
def test_cost_and_memory_grow_with_sequence_length(plan):
    longer = dataclasses.replace(plan, seq_len=plan.seq_len * 2)
    try:
        a, b = estimate(plan), estimate(longer)
    except CpplanError:
        assume(False)  # heads or an axis order the strategy cannot run: not a plan the search makes
    assert b.step_time_s > a.step_time_s
    # the step's end (the optimizer's update) may be the peak, and it does not grow with length
    assert b.hbm_bytes_per_device >= a.hbm_bytes_per_device
    assert backward_bytes(b.hbm_bytes) > backward_bytes(a.hbm_bytes)
    assert b.model_flops > a.model_flops
    assert a.lower_bound_s <= a.step_time_s <= a.upper_bound_s * (1 + 1e-12)


@settings(max_examples=150, deadline=None)
@given(plans(topologies=["v5p:2x2x2", "v5p:4x4x4", "tpu7x:2x2x1", "v5p:2x2x1"]))
def test_maxtext_round_trip(plan):
    assume(not maxtext_problems(plan))  # plans MaxText refuses are refused by to_maxtext (tested elsewhere)
    try:
        plan.check()
    except CpplanError:
        assume(False)  # a plan cpplan itself cannot run is refused by to_maxtext too
    devices = plan.topology_spec.num_devices
    tokens_per_device = plan.seq_len * plan.global_batch // devices * plan.axis_size("tensor")
    block = maxtext_block(plan)
    plan = dataclasses.replace(
        plan,
        axis_order=AXES,
        physical_order=(),
        block_q=block,
        block_kv=block,
        loss_chunk_tokens=tokens_per_device // 2 if plan.loss_chunk_tokens else 0,
    )
    plan = Plan.from_dict(plan.to_dict())  # re-derive the default physical order
    assert Plan.from_maxtext(plan.to_maxtext()) == plan


def test_a_plan_cpplan_cannot_run_is_not_exported():
    plan = Plan(MODELS["llama3.1-8b"], "v5p:2x2x2", 131072, 1, make_mesh(context=8), cp_strategy="none")
    with pytest.raises(CpplanError, match="none cannot run this plan: none needs context = 1"):
        plan.to_maxtext()


def test_splash_blocks_the_runtime_cannot_use_are_refused_before_pricing():
    def gathered(block_q, load_balance):
        return Plan(
            MODELS["llama3.1-8b"],
            "v5p:2x2x2",
            16384,
            1,
            make_mesh(context=8),
            cp_strategy="all_gather",
            block_q=block_q,
            load_balance=load_balance,
        )

    # each device's 2048 queries against the gathered 16384 keys
    with pytest.raises(CpplanError, match=r"block_q=384, block_kv=512\) must divide .* \(q=2048, kv=16384\)"):
        estimate(gathered(384, "none"))
    # zigzag gives each device two runs of 1024 positions; a block of 2048 would straddle them
    with pytest.raises(CpplanError, match="query block 2048 straddles two load-balancing chunks of 1024 tokens"):
        gathered(2048, "zigzag").check()
    gathered(1024, "zigzag").check()
    gathered(2048, "none").check()


def test_maxtext_refuses_what_maxtext_refuses():
    # MaxText 0.2.5 balances USP's load over an even ring degree only
    plan = Plan(
        MODELS["tiny-mha"],
        "cpu:12",
        9216,
        1,
        make_mesh(context=3, context_ulysses=4),
        cp_strategy="usp",
        load_balance="zigzag",
    )
    with pytest.raises(CpplanError, match="even ring degree"):
        plan.to_maxtext()
    # cpplan replicates KV heads for Ulysses; MaxText does not
    plan = Plan(
        MODELS["llama3.1-8b"], "v5p:2x4x4", 262144, 2, make_mesh(context_ulysses=16, fsdp=2), cp_strategy="ulysses"
    )
    with pytest.raises(CpplanError, match="num_kv_heads=8 divisible by its degree 16"):
        plan.to_maxtext()


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(MODEL_NAMES),
    exponent=st.integers(10, 22),
    topology=st.sampled_from(["cpu:8", "v5p:2x2x2", "tpu7x:2x2x1", "v5p:4x4x4"]),
)
def test_a_rejected_candidate_never_ranks(model, exponent, topology):
    from planner.api import run_search

    res = run_search(model, 2**exponent, topology)
    ranked = {(r.plan.mesh_sizes, r.plan.cp_strategy, r.plan.load_balance, r.plan.remat) for r in res.ranked}
    for rej in res.rejections:
        key = (tuple(rej.mesh.values()), rej.strategy, rej.load_balance)
        assert not any(k[:3] == key and (rej.remat is None or k[3] is rej.remat) for k in ranked), rej
    assert all(r.estimate.fits for r in res.ranked)
    # in order of time, which the ranking reads to 12 significant digits (equal plans priced along different
    # paths tie, then go by headroom)
    times = [float(f"{r.estimate.step_time_s / (r.plan.global_batch * r.plan.seq_len):.12g}") for r in res.ranked]
    assert times == sorted(times)
