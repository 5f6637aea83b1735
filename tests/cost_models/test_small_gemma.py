"""Gemma 4 E2B and E4B: per-layer input embeddings, layers that reuse earlier layers' keys and values and
E2B's wide MLP on them, counted by hand (weights, FLOPs) and against MaxText 0.2.5's FLOP count; their
published config.json read as the models cpplan knows by MaxText's names; the shapes that break a rule
refused by it; MaxText's rules for their block; cpplan's runtime refusing them by name; and the recipe rows'
remat as the MaxText that measured them ran it (docs/provenance/moe_models.md#gemma-4-e2b-and-e4b)."""

import dataclasses
import json
from pathlib import Path

import pytest

from cost_models.errors import CpplanError
from cost_models.experts import Experts
from cost_models.flops import (
    head_forward_flops,
    layer_forward_flops,
    model_flops_per_step,
    per_layer_input_projection_flops,
)
from cost_models.global_attention import GlobalAttention
from cost_models.models import MODELS, ModelSpec
from cost_models.per_layer_inputs import PerLayerInputs
from cost_models.targets import Target, get_target, model_refusal
from cost_models.vocabulary import RematPolicy
from planner.maxtext import export_maxtext, read_maxtext
from validation.corpus import SMALL_GEMMA_REMAT_SINCE, read_corpus

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "testdata" / "hf_configs"
E2B, E4B = MODELS["gemma4-e2b"], MODELS["gemma4-e4b"]
# the TPU7x recipe's command (AI-Hypercomputer/tpu-recipes training/ironwood/gemma4-2b/8k-bf16-tpu7x-4x4x4),
# its pricing flags
RECIPE = (
    "model_name=gemma4-e2b scan_layers=False dtype=bfloat16 per_device_batch_size=2 max_target_length=8192 "
    "num_vocab_tiling=8 remat_policy=full ici_data_parallelism=4 ici_fsdp_parallelism=-1 attention=flash "
    "use_tokamax_splash=True sa_block_q=1024 sa_block_kv=1024 compile_topology=tpu7x-128 "
    "compile_topology_num_slices=1 weight_dtype=float32"
)

# E2B (MaxText configs/models/gemma4-e2b.yml): 35 layers of width 1536, 8 query heads, 1 K/V head; local layers
# heads of 256, global ones (every fifth) of 512; MLP 6144, twice that on the last 20 layers (15-34), which
# reuse keys and values; per-layer inputs of 256 from a 262144-row table; tied vocabulary of 262144.
# Layers 0-14: 12 local, 3 global; layers 15-34: 16 local, 4 global.
LOCAL_ATTENTION = 1536 * 8 * 256 + 2 * 1536 * 1 * 256 + 8 * 256 * 1536 + 2 * 256  # q, k, v, out, q/k norms
GLOBAL_ATTENTION = 1536 * 8 * 512 + 2 * 1536 * 1 * 512 + 8 * 512 * 1536 + 2 * 512
LOCAL_KV, GLOBAL_KV = 2 * 1536 * 256 + 256, 2 * 1536 * 512 + 512  # what a shared layer lacks: k, v, k norm
MLP = 3 * 1536 * 6144  # gate, up, down
PER_LAYER = 2 * 1536 * 256 + 1536  # the per-layer input's gate, projection and norm
NORMS = 2 * 1536  # cpplan's sequential block's two (Gemma's norms after attention and MLP are not counted)


def test_e2b_weights_counted_by_hand():
    assert (LOCAL_ATTENTION, GLOBAL_ATTENTION) == (7_078_400, 14_156_800)
    attention = (
        12 * LOCAL_ATTENTION
        + 3 * GLOBAL_ATTENTION
        + 16 * (LOCAL_ATTENTION - LOCAL_KV)
        + 4 * (GLOBAL_ATTENTION - GLOBAL_KV)
    )
    layers = attention + 15 * MLP + 20 * 2 * MLP + 35 * (PER_LAYER + NORMS)
    assert E2B.layer_params == layers == 1_863_234_048
    table = 262144 * 35 * 256  # every layer's 256 values for each token
    projection = 1536 * 35 * 256 + 256  # the input embedding's projection to them, and its norm
    embedding = 262144 * 1536 + 1536  # tied: input and output share it; the final norm
    assert E2B.num_params == layers + table + projection + embedding == 4_628_461_824
    # the model card's "2.3B effective" is all but the per-layer table
    assert E2B.num_params - table == 2_279_651_584
    # the peak layer: a global layer's attention with the wide MLP; the kept values' MLP width, averaged
    assert E2B.largest_layer_params == GLOBAL_ATTENTION + NORMS + PER_LAYER + 2 * MLP
    assert (E2B.mlp_width, E2B.mean_mlp_width) == (2 * 6144, pytest.approx(6144 * 55 / 35))


def test_e2b_flops_counted_by_hand_and_as_maxtext_counts_them():
    tokens = 2 * 8192  # the recipe's tokens per device: 2 sequences of 8192
    per_token = (
        28 * 2 * (2 * 1536 * 8 * 256)  # q and out of the 28 local layers
        + 7 * 2 * (2 * 1536 * 8 * 512)  # and of the 7 global ones
        + 12 * 2 * (2 * 1536 * 256)  # k and v of the 12 local layers that project their own
        + 3 * 2 * (2 * 1536 * 512)  # and of the 3 global ones
        + (15 + 2 * 20) * 2 * MLP  # the MLP, the 20 shared layers' twice as wide
        + 35 * 2 * (2 * 1536 * 256)  # each layer's per-layer gate and projection
        + 2 * 1536 * 35 * 256  # once: the input embedding's projection to every layer's inputs
        + 2 * 1536 * 262144  # the output head
    )
    assert per_token == 4_558_946_304
    layers = sum(count * layer_forward_flops(E2B, 8192, tokens, mask).matmul for mask, count in E2B.layer_masks)
    outside = head_forward_flops(E2B, tokens) + per_layer_input_projection_flops(E2B, tokens)
    assert layers + outside == pytest.approx(tokens * per_token)
    # MaxText 0.2.5's `calculate_gemma4_small_tflops_training_per_device` at the recipe's batch: its learnable
    # weights' TFLOPs per device (run on the 0.2.5 wheel), forward and backward
    assert 3 * tokens * per_token / 1e12 == pytest.approx(224.081328734208)
    attention = sum(count * layer_forward_flops(E2B, 8192, tokens, mask).attention for mask, count in E2B.layer_masks)
    assert model_flops_per_step(E2B, 8192, 2) == pytest.approx(3 * (tokens * per_token + attention))


def test_kv_shared_layers_are_counted_by_kind():
    (global_mask, global_count), (local_mask, local_count) = E2B.layer_masks
    assert (global_count, local_count) == (7, 28)
    assert (E2B.kv_shared_count(global_mask), E2B.kv_shared_count(local_mask)) == (4, 16)
    assert E2B.kv_projecting_share(local_mask) == pytest.approx(12 / 28)
    # E4B: 42 layers, every sixth global, the last 18 shared (24-41: 15 local, 3 global)
    (global_mask, _), (local_mask, _) = E4B.layer_masks
    assert (E4B.kv_shared_count(global_mask), E4B.kv_shared_count(local_mask)) == (3, 15)
    assert E4B.wide_mlp_layers == 0 and E4B.mean_mlp_width == E4B.mlp_width == 10240


@pytest.mark.parametrize("name", ["gemma4-e2b", "gemma4-e4b"])
def test_published_configs_read_as_the_named_models(name):
    read = ModelSpec.from_hf_config(CONFIGS / f"{name}.json")
    known = MODELS[name]
    assert read.layer_masks == known.layer_masks
    assert dataclasses.replace(read, name=name, layer_pattern=known.layer_pattern) == known
    # without attention_k_eq_v the global layers keep the local layers' K/V heads (num_global_key_value_heads
    # is null), with heads of global_head_dim
    assert read.global_attention == GlobalAttention(known.num_kv_heads, 512, shared_kv=False)
    assert ModelSpec.from_dict(json.loads(json.dumps(read.to_dict()))) == read


def test_the_larger_gemma4_configs_have_neither():
    for config in ("gemma4-26b-a4b", "gemma4-31b"):
        model = ModelSpec.from_hf_config(CONFIGS / f"{config}.json")
        assert model.per_layer_inputs is None and model.kv_shared_layers == 0 and not model.double_wide_mlp
        assert "per_layer_inputs" not in model.to_dict()  # a model without them reads as it always has


def test_use_double_wide_mlp_without_shared_layers_widens_nothing(tmp_path):
    config = json.loads((CONFIGS / "gemma4-e2b.json").read_text())
    config["text_config"]["num_kv_shared_layers"] = 0
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = ModelSpec.from_hf_config(path)
    assert model.kv_shared_layers == 0 and not model.double_wide_mlp


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("num_kv_shared_layers", "20", "num_kv_shared_layers='20' must be an integer from 0 to 2**31"),
        ("hidden_size_per_layer_input", -1, "hidden_size_per_layer_input=-1 must be an integer from 0 to 2**31"),
        ("use_double_wide_mlp", 1, "use_double_wide_mlp=1 must be true or false"),
        ("num_kv_shared_layers", 35, "kv_shared_layers=35 must be an integer from 0 to num_layers - 1"),
    ],
)
def test_bad_small_gemma_fields_are_refused_naming_the_file(tmp_path, field, value, words):
    config = json.loads((CONFIGS / "gemma4-e2b.json").read_text())
    config["text_config"][field] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(CpplanError, match="config.json") as err:
        ModelSpec.from_hf_config(path)
    assert words in str(err.value)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"kv_shared_layers": 35}, "kv_shared_layers=35 must be an integer from 0 to num_layers - 1 = 34"),
        ({"kv_shared_layers": 0}, "double_wide_mlp widens the MLP of the KV-shared layers, and kv_shared_layers=0"),
        ({"per_layer_inputs": PerLayerInputs(0, 10)}, "per_layer_inputs.width=0 must be a positive integer"),
        (
            {"experts": Experts(4, 2, 64)},
            "kv_shared_layers, double_wide_mlp, per_layer_inputs with experts: cpplan prices KV-shared layers",
        ),
        # the last layer global, every earlier one local: it would have no global layer to take K/V from
        ({"layer_pattern": "L" * 34 + "G", "kv_shared_layers": 1}, "no layer before layer 34 is global"),
    ],
)
def test_shapes_that_break_a_rule_are_refused(fields, words):
    with pytest.raises(CpplanError) as err:
        dataclasses.replace(E2B, **fields)
    assert words in str(err.value)


def test_cpplans_runtime_refuses_them_by_name_and_maxtext_is_their_target():
    for model in (E2B, E4B):
        assert get_target(None, model) is Target.MAXTEXT
        refusal = model_refusal(Target.CPPLAN, model)
        assert "per-layer input embeddings and layers that reuse an earlier layer's keys and values" in refusal
        with pytest.raises(CpplanError, match="which cpplan's runtime does not run"):
            get_target("cpplan", model)
        assert model_refusal(Target.MAXTEXT, model) is None


def test_maxtext_runs_their_layers_unscanned_only():
    with pytest.raises(CpplanError, match="gemma4_small block, which refuses scanned layers.*add scan_layers=False"):
        read_maxtext(RECIPE.replace("scan_layers=False ", ""))
    plan = read_maxtext(RECIPE).plan
    assert plan.model == E2B and plan.mesh_dict["data"] == 4 and plan.mesh_dict["fsdp"] == 32
    exported = export_maxtext(plan)
    assert exported.flags["model_name"] == "gemma4-e2b" and exported.flags["scan_layers"] is False
    words = " ".join(f"{k}={v}" for k, v in {**exported.flags, **exported.compile_flags}.items())
    assert read_maxtext(words).plan == plan


def test_recipe_rows_run_without_remat_as_their_maxtext_did():
    runs = {r.run_id: r for r in read_corpus(ROOT / "benchmarks" / "public_ironwood_runs.csv", refused=[])}
    for run_id, model in (("tpu7x-128-gemma4-2b-8k-bf16", E2B), ("tpu7x-128-gemma4-4b-8k-bf16", E4B)):
        run = runs[run_id]
        assert run.row["date"] < SMALL_GEMMA_REMAT_SINCE and "remat_policy=full" in run.row["maxtext_flags"]
        assert run.plan.model == model and run.plan.remat is RematPolicy.MINIMAL_WITH_CONTEXT
        assert any("ran model" in n and "with no rematerialization" in n for n in run.notes)
    # every other row keeps its flags' policy
    others = [r for run_id, r in runs.items() if "gemma4-2b" not in run_id and "gemma4-4b" not in run_id]
    assert others and all(f"remat_policy={r.plan.remat.value}" in r.row["maxtext_flags"] for r in others)
