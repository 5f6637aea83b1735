"""The remat vocabulary: MaxText's policies by name, custom placements per checkpoint, the Plan
fields and options that carry them, and what the table says each keeps and recomputes."""

import dataclasses

import pytest

from cost_models.errors import CpplanError
from cost_models.models import MODELS
from cost_models.remat import (
    CHECKPOINT_NAMES,
    POLICIES,
    SEARCHED_CUSTOM,
    SEARCHED_POLICIES,
    custom_placements,
    kept_names,
    offloaded_names,
    recomputed,
    remat_code,
    remat_label,
    remat_table,
)
from cost_models.vocabulary import Placement, RematPolicy
from planner import Plan, make_mesh
from planner.estimate import estimate
from planner.options import SearchOptions

pytestmark = pytest.mark.pure
MODEL = MODELS["llama3.1-8b"]
MATMULS = ("query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")


def test_every_maxtext_policy_parses_by_its_name():
    for name in (
        "full",
        "minimal",
        "minimal_with_context",
        "save_dot_except_mlp",
        "save_dot_except_mlpwi",
        "save_qkv_proj",
        "save_out_proj",
        "qkv_proj_offloaded",
        "minimal_offloaded",
        "custom",
        "save_dot_with_context_except_mlp",
    ):
        assert RematPolicy.parse(name).value == name
    assert RematPolicy.parse("minimal_flash") is RematPolicy.MINIMAL_WITH_CONTEXT  # MaxText's old name


def test_policies_place_what_maxtext_saves_and_offloads():
    assert kept_names(RematPolicy.MINIMAL) == MATMULS
    assert kept_names(RematPolicy.MINIMAL_WITH_CONTEXT) == MATMULS[:3] + ("context",) + MATMULS[3:]
    assert kept_names(RematPolicy.SAVE_DOT_EXCEPT_MLPWI) == (
        "query_proj",
        "key_proj",
        "value_proj",
        "out_proj",
        "mlpwo",
    )
    assert kept_names(RematPolicy.SAVE_OUT_PROJ) == ("out_proj",)
    assert offloaded_names(RematPolicy.QKV_PROJ_OFFLOADED) == ("query_proj", "key_proj", "value_proj")
    assert offloaded_names(RematPolicy.MINIMAL_OFFLOADED) == MATMULS and not kept_names(RematPolicy.MINIMAL_OFFLOADED)
    assert kept_names(RematPolicy.FULL) == () == offloaded_names(RematPolicy.FULL)
    # nothing reads the MLP's output in the backward: never recomputed, whatever the policy
    assert "mlpwo" not in recomputed(RematPolicy.FULL)
    assert set(SEARCHED_POLICIES) < set(POLICIES) and RematPolicy.CUSTOM in SEARCHED_POLICIES


def test_custom_placements_read_maxtext_names_and_refuse_bad_ones():
    placed = custom_placements(
        {
            "qkv_proj": "offload",
            "mlpwi": "device",
            "out_proj": "remat",
            "decoder_layer_input": "device",
            "moe_mlpwo": "device",
        },
        maxtext_names=True,
    )
    assert placed == (
        ("query_proj", Placement.OFFLOAD),
        ("key_proj", Placement.OFFLOAD),
        ("value_proj", Placement.OFFLOAD),
        ("mlpwi_0", Placement.DEVICE),
        ("mlpwi_1", Placement.DEVICE),
    )
    # the layer input is recorded only when offloaded: remat keeps it on device, as jax does
    assert custom_placements({"decoder_layer_input": "offload", "context": "device"}) == (
        ("decoder_layer_input", Placement.OFFLOAD),
        ("context", Placement.DEVICE),
    )
    assert (
        custom_placements({"decoder_layer_input": "remat"})
        == ()
        == custom_placements({"decoder_layer_input": "device"})
    )
    with pytest.raises(CpplanError, match="two placements"):
        custom_placements({"qkv_proj": "offload", "query_proj": "device"}, maxtext_names=True)
    with pytest.raises(CpplanError, match="unknown checkpoint name 'qkv_proj'"):
        custom_placements({"qkv_proj": "device"})  # ours only, unless asked to read MaxText's
    with pytest.raises(CpplanError, match="unknown checkpoint placement 'host'"):
        custom_placements({"context": "host"})


def plan(**fields):
    return Plan(model=MODEL, topology="v5p-16", seq_len=8192, global_batch=8, mesh=make_mesh(fsdp=8), **fields)


def test_plan_carries_custom_placements_and_mu_dtype_through_json():
    p = plan(remat="custom", remat_custom={"context": "device", "mlpwi_0": "offload"}, mu_dtype="bfloat16")
    assert p.offloaded == ("mlpwi_0",)
    assert Plan.from_json(p.to_json()) == p
    assert Plan.from_json(plan().to_json()) == plan()
    with pytest.raises(CpplanError, match="per-name placements need remat=custom"):
        plan(remat="full", remat_custom={"context": "device"})
    with pytest.raises(CpplanError, match="mu_dtype='float16'"):
        plan(mu_dtype="float16")


def test_custom_policy_prices_as_the_named_policy_it_spells():
    named = estimate(plan(remat="save_qkv_proj"))
    spelled = estimate(
        plan(remat="custom", remat_custom={n: "device" for n in ("query_proj", "key_proj", "value_proj")})
    )
    assert spelled.hbm_bytes == named.hbm_bytes and spelled.step_time_s == named.step_time_s


def test_bf16_moments_shrink_the_optimizer_state():
    fp32, bf16 = estimate(plan()), estimate(plan(mu_dtype="bfloat16"))
    assert bf16.hbm_bytes["optimizer"] == pytest.approx(fp32.hbm_bytes["optimizer"] * 3 / 4)  # mu 2 + nu 4 bytes
    both = estimate(plan(mu_dtype="bfloat16", param_dtype="bfloat16"))
    assert both.hbm_bytes["optimizer"] == pytest.approx(fp32.hbm_bytes["optimizer"] / 2)


def test_recompute_fractions_follow_the_table():
    table = remat_table(MODEL)
    full, qkv = remat_code(RematPolicy.FULL), remat_code(RematPolicy.SAVE_QKV_PROJ)
    assert table.recompute_qkv_out[full] == 1 and table.recompute_mlp[full] == pytest.approx(2 / 3)
    # save_qkv_proj recomputes only the out projection of its block: 4096² of 4096·(4096 + 2·1024 + 4096)
    assert table.recompute_qkv_out[qkv] == pytest.approx(4096 / (4096 + 2048 + 4096))
    offloaded = remat_code(RematPolicy.MINIMAL_OFFLOADED)
    assert table.saved_on_device[offloaded] == MODEL.hidden  # only the layer input stays on device
    assert table.saved_on_host[offloaded] == sum(
        w for w in (4096, 1024, 1024, 4096, 14336, 14336)
    )  # every matmul output the backward reads


def test_search_tries_the_named_set_and_custom_as_its_preset():
    assert SearchOptions.build().remat == frozenset(SEARCHED_POLICIES)
    assert SearchOptions.build(remat="minimal_offloaded").remat == {RematPolicy.MINIMAL_OFFLOADED}
    assert SearchOptions.build(mu_dtype="bfloat16").mu_dtype == "bfloat16"
    assert SearchOptions.build(remat=["full", "custom"]).remat == {RematPolicy.FULL, RematPolicy.CUSTOM}
    assert dataclasses.replace(plan(), remat="full").remat is RematPolicy.FULL
    assert len(CHECKPOINT_NAMES) == 8


def test_the_searched_custom_preset_has_its_own_row_after_the_named_policies():
    # the recipes' 2M/4M placement: attention output and layer input offloaded, the rest recomputed
    (preset,) = SEARCHED_CUSTOM
    assert preset == (("decoder_layer_input", Placement.OFFLOAD), ("context", Placement.OFFLOAD))
    assert remat_label(RematPolicy.CUSTOM, preset) == "custom (decoder_layer_input=offload context=offload)"
    assert remat_label(RematPolicy.FULL) == "full"
    code = remat_code(RematPolicy.CUSTOM, preset, SEARCHED_CUSTOM)
    assert code == len(POLICIES) and remat_code(RematPolicy.CUSTOM, (), SEARCHED_CUSTOM) == POLICIES.index(
        RematPolicy.CUSTOM
    )
    table = remat_table(MODEL, presets=SEARCHED_CUSTOM)
    assert table.saved_on_device[code] == 0  # nothing a layer keeps stays in HBM
    assert table.saved_on_host[code] == 4096 + 4096  # the layer input and the attention output, per token
    # no attention rerun; of the MLP's three matmuls the two inputs (its output is never read)
    assert table.recompute_attention[code] == 0 and table.recompute_mlp[code] == pytest.approx(2 / 3)
    # the same row as the plan's own `custom` placements give
    own = remat_table(MODEL, preset)
    custom = remat_code(RematPolicy.CUSTOM)
    assert all(getattr(own, f)[custom] == getattr(table, f)[code] for f in own.__dataclass_fields__)
