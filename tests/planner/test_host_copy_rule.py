"""pure tier: the search and `Plan.check` refuse a plan whose layer loop would copy one value of 2^32 bytes or
more to the host per device, which the TPU compiler aborts on (docs/compiler_aborts.md), with the rule's
sentence; smaller copies, steps of one layer and host devices are left alone."""

import dataclasses

import pytest

from cost_models.errors import CpplanError
from cost_models.models import get_model
from cost_models.pricing.offload import HOST_COPY_LIMIT_BYTES, host_copy_bytes, host_copy_violation
from planner.api import run_search
from planner.plan import Plan, make_mesh

pytestmark = pytest.mark.pure

FOUR_LAYERS = dataclasses.replace(get_model("llama3.1-8b"), num_layers=4)
OFFLOAD = {"decoder_layer_input": "offload", "context": "offload"}


def aborting_plan(**changes) -> Plan:
    """The plan the search chose before the rule (its compile aborts): 512K tokens per device, 4 GiB a layer."""
    plan = Plan(
        model=FOUR_LAYERS,
        topology="v5p:2x2x2",
        seq_len=131072,
        global_batch=32,
        mesh=make_mesh(fsdp=2, context=4),
        cp_strategy="ring",
        load_balance="zigzag",
        remat="custom",
        remat_custom=OFFLOAD,
        block_q=2048,
        block_kv=2048,
        loss_chunk_tokens=8192,
        fused_attention_backward=True,
    )
    return dataclasses.replace(plan, **changes)


def test_the_sentence_names_the_size_the_limit_and_the_evidence():
    assert host_copy_violation(HOST_COPY_LIMIT_BYTES - 1) is None
    sentence = host_copy_violation(HOST_COPY_LIMIT_BYTES)
    assert sentence.startswith("offloads 4.00 GiB per device in one host copy per layer, not under the 4 GiB")
    assert "llo_loop.cc:175 Check failed" in sentence and "docs/compiler_aborts.md" in sentence


def test_plan_check_refuses_a_copy_of_4_gib_and_passes_smaller_ones():
    with pytest.raises(CpplanError) as err:
        aborting_plan().check()
    assert str(err.value).startswith(
        "remat custom (decoder_layer_input=offload context=offload) offloads 4.00 GiB per device"
    )
    for name in OFFLOAD:  # either value alone is a 4 GiB copy (the attention output is as wide as the input)
        with pytest.raises(CpplanError, match="offloads 4.00 GiB per device"):
            aborting_plan(remat_custom={name: "offload"}).check()
    aborting_plan(global_batch=2).check()  # 256 MiB a layer: compiles
    aborting_plan(remat="full", remat_custom=()).check()  # nothing offloaded
    aborting_plan(model=dataclasses.replace(FOUR_LAYERS, num_layers=1)).check()  # no layer loop


def test_the_search_refuses_every_such_plan_and_says_why():
    result = run_search(FOUR_LAYERS, "128k", "v5p:2x2x2")
    assert result.case.global_batch == 32 and result.ranked  # 4M tokens a step still plan
    for ranked in result.ranked[:50]:
        ranked.plan.check()  # none of the plans offered is one the rule refuses
    refused = [r for r in result.rejections if r.category == "compiler"]
    assert refused and all(r.reason == host_copy_violation(HOST_COPY_LIMIT_BYTES) for r in refused)
    # the same plans with fewer sequences a step copy less and are searched as before
    small = run_search(FOUR_LAYERS, "128k", "v5p:2x2x2", global_batch=8)
    assert not [r for r in small.rejections if r.category == "compiler"]
    assert any(r.plan.offloaded for r in small.ranked)


def test_only_tpu_steps_with_a_layer_loop_count():
    def copy(plan: Plan) -> float:
        tokens = plan.global_batch * plan.seq_len / (plan.batch_shards * plan.cp_degree)
        return host_copy_bytes(
            plan.model,
            plan.remat,
            plan.remat_custom,
            chip=plan.topology_spec.chip,
            tokens_per_device=tokens,
            tensor=plan.axis_size("tensor"),
            act_bytes=2,
        )

    assert copy(aborting_plan()) == HOST_COPY_LIMIT_BYTES
    assert copy(aborting_plan(topology="cpu:8", physical_order=())) == 0  # XLA:CPU has no such copy
    assert copy(aborting_plan(model=dataclasses.replace(FOUR_LAYERS, num_layers=1))) == 0
    assert copy(aborting_plan(model=dataclasses.replace(FOUR_LAYERS, num_layers=2))) == HOST_COPY_LIMIT_BYTES
