"""Mixture-of-experts and latent-attention models: their weights and FLOPs checked by hand on a small
model and against the published totals of DeepSeek-V3, Mixtral and Qwen3; the published config.json files
read as the shapes cpplan knows by MaxText's names; bad shapes refused by the rule they break; and the
runtime that runs them chosen and named."""

import dataclasses
import json

import numpy as np
import pytest

from cost_models.errors import CpplanError
from cost_models.experts import Experts
from cost_models.flops import layer_forward_flops
from cost_models.latent_attention import LatentAttention
from cost_models.models import MODELS, ModelSpec
from cost_models.targets import TRAITS, Target, get_target, model_refusal
from planner import explain
from planner.plan import Plan

pytestmark = pytest.mark.pure

CONFIGS = "tests/testdata/hf_configs"

# 3 layers, the first dense: attention q 8·2·4, k and v 2·8·1·4, out 2·4·8; two norms of 8
SMALL = ModelSpec("small-moe", 3, 8, 2, 1, 4, 16, 10, experts=Experts(4, 2, 6, shared=1, dense_layers=1))


def test_a_small_mixture_of_experts_counted_by_hand():
    attention, norms = 64 + 64 + 64, 16
    dense_mlp = 3 * 8 * 16  # gate, up, down
    moe_mlp = (4 + 1) * 3 * 8 * 6 + 8 * 4  # four routed and one shared expert, and the router
    assert SMALL.expert_mlp_params == moe_mlp == 752
    layers = 3 * (attention + norms) + dense_mlp + 2 * moe_mlp
    assert SMALL.layer_params == layers == 2512
    assert SMALL.num_params == layers + 2 * 10 * 8 + 8 == 2680
    # each token leaves 2 of the 4 routed experts idle in each of the 2 expert layers
    assert SMALL.active_params == 2680 - 2 * 2 * 3 * 8 * 6 == 2104
    # per token: the dense layer's MLP, and two layers of (2 routed + 1 shared) experts and the router
    assert SMALL.mlp_flops_per_token == pytest.approx((2 * 384 + 2 * 2 * (3 * 3 * 8 * 6 + 8 * 4)) / 3)
    assert SMALL.mlp_width == max(3 * 6, 16) == 18
    assert SMALL.mlp_matrix_params == max(5 * 8 * 6, 8 * 16) == 240
    flops = layer_forward_flops(SMALL, 64, 128)
    assert flops.mlp == pytest.approx(128 * SMALL.mlp_flops_per_token)


def test_interleaved_expert_layers():
    maverick = Experts(128, 1, 8192, shared=1, every=2)
    assert [maverick.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert maverick.layers(48) == 24
    lead = Experts(4, 2, 6, dense_layers=3)
    assert [lead.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert lead.layers(5) == 2 == sum(lead.is_moe_layer(i) for i in range(5))


def test_latent_attention_projections_by_hand():
    latent = LatentAttention(kv_rank=4, rope_dims=2, v_head_dim=3, q_rank=5)
    projections, out = latent.projection_params(hidden=8, num_heads=2, head_dim=6)
    q = 8 * 5 + 5 + 5 * 2 * 6  # down to the query latent, its norm, up to every head
    kv = 8 * (4 + 2) + 4 + 4 * 2 * (4 + 3)  # down to the latent and RoPE keys, its norm, up to keys and values
    assert (projections, out) == (q + kv, 2 * 3 * 8)
    model = ModelSpec("mla", 1, 8, 2, 2, 6, 16, 10, latent=latent)
    flops = layer_forward_flops(model, 32, 32)
    assert flops.qkv == 2 * 32 * (q + kv)
    # causal: q·k over 6 dims and the values' 3, halved
    assert flops.attention == pytest.approx(2 * 32 * 32 * 2 * (6 + 3) / 2)


@pytest.mark.parametrize(
    "name, total, active, tolerance",
    [
        # DeepSeek-V3 technical report (arXiv:2412.19437), abstract: 671B total, 37B activated per token
        ("deepseek3-671b", 671e9, 37e9, 0.02),
        # Mixtral of Experts (arXiv:2401.04088), section 2: 47B parameters, 13B active
        ("mixtral-8x7b", 47e9, 13e9, 0.02),
        # Qwen3 technical report (arXiv:2505.09388), table 2: 235B total, 22B activated
        ("qwen3-235b-a22b", 235e9, 22e9, 0.02),
        # Mistral AI, "Cheaper, Better, Faster, Stronger" (Mixtral 8x22B, 2024-04-17): 141B, 39B active
        ("mixtral-8x22b", 141e9, 39e9, 0.02),
        # meta-llama/Llama-4-Scout-17B-16E and -Maverick-17B-128E model cards: 109B and 400B total, 17B active
        # (Scout's total counts its vision encoder, which cpplan's decoder leaves out)
        ("llama4-17b-16e", 109e9, 17e9, 0.02),
        ("llama4-17b-128e", 400e9, 17e9, 0.02),
    ],
)
def test_published_totals(name, total, active, tolerance):
    model = MODELS[name]
    assert model.num_params == pytest.approx(total, rel=tolerance)
    assert model.active_params == pytest.approx(active, rel=tolerance + 0.01)


@pytest.mark.parametrize(
    "name, config",
    [
        ("deepseek3-671b", "deepseek-v3"),
        ("qwen3-235b-a22b", "qwen3-235b-a22b"),
        ("qwen3-30b-a3b", "qwen3-30b-a3b"),
        ("qwen3-8b", "qwen3-8b"),
        ("mixtral-8x7b", "mixtral-8x7b"),
        ("gpt-oss-120b", "gpt-oss-120b"),
        ("gpt-oss-20b", "gpt-oss-20b"),
        ("gemma4-26b", "gemma4-26b-a4b"),
        ("gemma4-31b", "gemma4-31b"),
    ],
)
def test_published_configs_read_as_the_named_shapes(name, config):
    read = ModelSpec.from_hf_config(f"{CONFIGS}/{config}.json")
    known = MODELS[name]
    # a config lists every layer's type; the named model gives the repeating unit
    assert read.layer_masks == known.layer_masks
    assert dataclasses.replace(read, name=name, layer_pattern=known.layer_pattern) == known


def test_a_moe_model_round_trips_through_a_plan():
    model = MODELS["deepseek3-671b"]
    assert ModelSpec.from_dict(json.loads(json.dumps(model.to_dict()))) == model
    plan = explain(model, "4k", "tpu7x-512", global_batch=512).best
    assert Plan.from_json(plan.to_json()) == plan


def _config(tmp_path, **fields):
    base = json.loads(open(f"{CONFIGS}/qwen3-30b-a3b.json").read())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **fields}))
    return path


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"num_experts_per_tok": 200}, "exceeds experts.count=128"),
        ({"num_experts": 1}, "num_experts=1 must be a number of routed experts of at least 2"),
        ({"decoder_sparse_step": 2}, "not dense layers between them"),
        ({"mlp_only_layers": [3]}, "not dense layers between them"),
        ({"moe_intermediate_size": "768"}, "moe_intermediate_size='768' must be one expert's MLP width"),
    ],
)
def test_bad_expert_fields_are_refused_by_their_rule(tmp_path, fields, words):
    with pytest.raises(CpplanError, match="config.json") as err:
        ModelSpec.from_hf_config(_config(tmp_path, **fields))
    assert words in str(err.value)


def test_shapes_that_break_a_rule_are_refused():
    with pytest.raises(CpplanError, match="dense_layers=3 and experts.every=1 leave no mixture-of-experts layer"):
        ModelSpec("m", 3, 8, 2, 1, 4, 16, 10, experts=Experts(4, 2, 6, dense_layers=3))
    with pytest.raises(CpplanError, match="num_kv_heads=1 must equal num_heads=2"):
        ModelSpec("m", 1, 8, 2, 1, 6, 16, 10, latent=LatentAttention(4, 2, 3))
    with pytest.raises(CpplanError, match="experts fields|experts's fields: missing"):
        ModelSpec.from_dict({**MODELS["mixtral-8x7b"].to_dict(), "experts": {"count": 8}})


def test_gemma4_global_layers_have_their_own_heads():
    model = MODELS["gemma4-26b"]
    global_, local = (model.layer_model(mask) for mask, _ in model.layer_masks)  # global first
    assert (local.num_kv_heads, local.head_dim, local.shared_kv) == (8, 256, False)
    assert (global_.num_kv_heads, global_.head_dim, global_.shared_kv) == (2, 512, True)
    # 25 local layers' and 5 global layers' attention: q, one K=V projection, out; plus q/k norms
    local_attention = 2816 * 16 * 256 + 2 * 2816 * 8 * 256 + 16 * 256 * 2816 + 2 * 256
    global_attention = 2816 * 16 * 512 + 2816 * 2 * 512 + 16 * 512 * 2816 + 2 * 512
    assert local.attention_params == local_attention and global_.attention_params == global_attention
    assert model.layer_params == (
        25 * local_attention + 5 * global_attention + 30 * (2 * 2816 + model.expert_mlp_params)
    )
    # 8 routed experts of 704 and the dense MLP of 2112 beside them, as MaxText's shared expert
    assert model.mlp_width == 8 * 704 + 2112


def test_a_strategy_is_judged_by_the_global_layers_heads_too():
    from cost_models.strategies.base import Shape
    from cost_models.strategies.registry import STRATEGIES
    from cost_models.vocabulary import CPStrategy

    # MaxText's Ulysses splits the K/V heads too: the global layers' 2 refuse a degree of 4 the local 8 allow
    ulysses = STRATEGIES[CPStrategy.ULYSSES]
    rule = "MaxText's Ulysses needs num_kv_heads=2 divisible by its degree 4"
    assert any(rule in p for p in ulysses.maxtext_rules(Shape(MODELS["gemma4-26b"], 8192, 1, 4, 1, False)))
    assert not any(
        "num_kv_heads" in p for p in ulysses.maxtext_rules(Shape(MODELS["gemma4-26b"], 8192, 1, 2, 1, False))
    )


def test_a_model_cpplans_runtime_does_not_run_is_priced_for_maxtext():
    moe, dense = MODELS["qwen3-30b-a3b"], MODELS["llama3.1-8b"]
    assert get_target(None, moe) is Target.MAXTEXT
    assert get_target(None, dense) is Target.CPPLAN
    # its experts run on cpplan's runtime; its q/k norms do not, and the refusal names only those
    with pytest.raises(CpplanError, match="has q/k norms, which cpplan's runtime does not run") as refused:
        get_target("cpplan", moe)
    assert "mixture-of-experts MLPs, which" not in str(refused.value)
    result = explain(moe, "8k", "tpu7x-16", global_batch=16)
    assert result.result.target is Target.MAXTEXT
    assert "priced for MaxText" in str(result)


def test_a_model_whose_only_extra_is_experts_runs_on_cpplans_runtime():
    """The rule reads the kinds the runtime runs (`TargetTraits.model_kinds`): experts alone are run,
    and a refusal names every other kind a model holds."""
    assert get_target(None, MODELS["mixtral-8x7b"]) is Target.CPPLAN
    assert model_refusal(Target.CPPLAN, MODELS["mixtral-8x7b"]) is None
    deepseek = model_refusal(Target.CPPLAN, MODELS["deepseek3-671b"])
    assert deepseek.startswith("model 'deepseek3-671b' has multi-head latent attention, which")
    gpt_oss = model_refusal(Target.CPPLAN, MODELS["gpt-oss-20b"])
    assert gpt_oss.startswith("model 'gpt-oss-20b' has attention sinks, which")
    # without the runtime's leave, experts are refused as before
    cpplan = dataclasses.replace(TRAITS[Target.CPPLAN], model_kinds=frozenset())
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(TRAITS, Target.CPPLAN, cpplan)
        assert "has mixture-of-experts MLPs, which" in model_refusal(Target.CPPLAN, MODELS["mixtral-8x7b"])
    assert model_refusal(Target.MAXTEXT, MODELS["deepseek3-671b"]) is None


def test_bigger_expert_groups_price_no_slower_per_token():
    """Per token, an MoE layer's grouped matmuls waste less of the MXU on part-filled row tiles as each
    expert's group grows (more tokens per device)."""
    from cost_models.pricing.experts import grouped_matmul_efficiency

    model = MODELS["qwen3-30b-a3b"]
    efficiencies = []
    for batch in (16, 32, 64, 128):
        plan = explain(model, "2k", "tpu7x-16", global_batch=batch, mesh={"tensor": 1, "expert": 1}).best
        from planner.estimate import candidates_of

        efficiencies.append(float(grouped_matmul_efficiency(candidates_of(plan))[0]))
    assert np.all(np.diff(efficiencies) >= 0)
    assert efficiencies[-1] > efficiencies[0]
