"""The embedding table's relaid copies (cost_models.pricing.memory.relaid_table_values), by hand, on
bench_memory's Gemma 3 rows: gemma3-12b's table (262208 × 3840) split on hidden over fsdp 4 on v6e:2x2
leaves each device 960 columns, off the TPU's 128 lanes. Its deviceless compiles (docs/measurements.md,
"An embedding slice off the lanes") lay the table out vocabulary-minor at the step's entry and copy it into
f32[262208,960]{1,0}, 1024 columns padded: tied, from the forward to the update (`copy.441`), and the two
moments at the update (`copy.438`, `copy.439`); untied, the table and its moments at the update alone.
Llama's block over 8 v5p devices copies its slices of 120 and 320 columns (padded by 6.7% and 20%) as well,
and reads slices of 192, 288, 64 and 16 columns (padded by a third or more) in place.
"""

import dataclasses

import pytest

from cost_models.models import MODELS
from planner import Plan, estimate, make_mesh

pytestmark = pytest.mark.pure
PADDED_SLICE = 262208 * 1024  # values of one relaid copy: 960 columns padded to 8 × 128 lanes


def _plan(model="gemma3-12b", topology="v6e:2x2", fsdp=4, data=1, **fields) -> Plan:
    spec = dataclasses.replace(MODELS[model], num_layers=2, **fields)
    return Plan(
        model=spec,
        topology=topology,
        seq_len=8192,
        global_batch=fsdp * data,
        mesh=make_mesh(fsdp=fsdp, data=data),
        cp_strategy="none",
        remat="full",
        block_q=512,
        block_kv=512,
    )


def test_a_tied_table_off_the_lanes_holds_its_fp32_copy_all_step_and_its_moments_at_the_update():
    b = estimate(_plan()).hbm_bytes
    assert b["relaid_table"] == PADDED_SLICE * 4  # the fp32 table, 1024.2 MiB as the compile holds it
    assert b["relaid_update"] == PADDED_SLICE * (4 + 4)  # mu and nu in fp32


def test_an_untied_table_is_copied_at_the_update_alone_with_its_moments():
    b = estimate(_plan(tie_embeddings=False)).hbm_bytes
    assert b["relaid_table"] == 0
    assert b["relaid_update"] == PADDED_SLICE * (4 + 4 + 4)
    # a first moment in bf16 is copied in bf16
    bf16_mu = estimate(dataclasses.replace(_plan(tie_embeddings=False), mu_dtype="bfloat16")).hbm_bytes
    assert bf16_mu["relaid_update"] == PADDED_SLICE * (4 + 2 + 4)


@pytest.mark.parametrize(
    "plan",
    [
        _plan(fsdp=2, data=2),  # 1920 columns: 15 × 128
        _plan("llama3.1-8b"),  # 1024 columns
        _plan("llama3.1-8b", topology="v6e:4x8", fsdp=32, data=1, hidden=6144),  # 192 columns padded by a third
        _plan(topology="cpu:4"),  # a host lays arrays out otherwise
    ],
    ids=["gemma3 over 2", "llama over 4", "192 columns", "cpu"],
)
def test_a_slice_on_the_lanes_padded_by_a_third_or_off_a_tpu_is_not_copied(plan):
    b = estimate(plan).hbm_bytes
    assert b["relaid_table"] == b["relaid_update"] == 0


def test_a_slice_narrower_than_the_lanes_is_copied_where_little_padded():
    # 120 columns (3840 over 32 devices), padded to 128 by 6.7%, as Llama's block at hidden 960 over 8 compiled
    b = estimate(_plan(topology="v6e:4x8", fsdp=32)).hbm_bytes
    assert b["relaid_table"] == 262208 * 128 * 4


def test_maxtext_lays_its_table_out_otherwise():
    b = estimate(_plan(), target="maxtext").hbm_bytes
    assert b["relaid_table"] == b["relaid_update"] == 0
