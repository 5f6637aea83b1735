"""A plain (non-gated) MLP, `ModelSpec.mlp_activations`: counted from one place by parameters,
FLOPs, weight arrays, the remat table, memory and elementwise work; read and written as MaxText's
`mlp_activations`; and the synthetic MaxText models of the public corpus built with it."""

import dataclasses
import json
from pathlib import Path

import pytest

from cost_models.errors import CpplanError
from cost_models.flops import layer_forward_flops
from cost_models.models import MODELS, SWIGLU, ModelSpec
from cost_models.remat import remat_code, remat_table
from cost_models.units import GiB
from cost_models.vocabulary import DTYPE_BYTES, RematPolicy
from cost_models.work_layout import weight_arrays_per_layer
from planner import Plan, make_mesh
from planner.estimate import estimate
from planner.maxtext import export_maxtext, format_flags, read_maxtext
from validation.corpus import read_corpus, synthetic_shape

pytestmark = pytest.mark.pure
ROOT = Path(__file__).resolve().parents[2]
GATED = MODELS["llama3.1-8b"]
PLAIN = dataclasses.replace(GATED, name="plain-8b", mlp_activations=("relu",))
# a gated twin of PLAIN: the same parameters and matmul FLOPs with an MLP 2/3 as wide
TWIN = dataclasses.replace(GATED, name="twin-8b", intermediate=PLAIN.intermediate * 2 // 3)


def test_the_default_is_gated_and_a_plain_mlp_has_two_matrices():
    assert GATED.mlp_activations == SWIGLU == ("silu", "linear") and GATED.gated and GATED.mlp_matrices == 3
    assert not PLAIN.gated and PLAIN.mlp_inputs == 1 and PLAIN.mlp_matrices == 2
    assert GATED.params_per_layer - PLAIN.params_per_layer == 4096 * 14336  # one matrix fewer
    assert PLAIN.num_params == 32 * (218_112_000 - 4096 * 14336) + 2 * 128256 * 4096 + 4096
    assert weight_arrays_per_layer(GATED) == 9 and weight_arrays_per_layer(PLAIN) == 8
    gated, plain = layer_forward_flops(GATED, 8192, 8192), layer_forward_flops(PLAIN, 8192, 8192)
    assert plain.mlp == 2 * 8192 * 2 * 4096 * 14336 and gated.mlp == plain.mlp * 3 / 2
    assert plain.attention == gated.attention and plain.qkv == gated.qkv


def test_activations_are_checked_and_travel_through_json():
    assert ModelSpec.from_dict(json.loads(json.dumps(PLAIN.to_dict()))) == PLAIN
    assert dataclasses.replace(GATED, mlp_activations=["gelu", "linear"]).mlp_activations == ("gelu", "linear")
    for bad, match in (
        ("relu", "must be a list of activation names"),
        (["tanh"], "'tanh' is not an activation"),
        ([], "has 0 activations"),
        (["silu", "linear", "relu"], "has 3 activations"),
        ([1], "must be a list"),
    ):
        with pytest.raises(CpplanError, match=match):
            dataclasses.replace(GATED, mlp_activations=bad)


def test_hugging_face_hidden_act_sets_the_gated_activation(tmp_path):
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 256,
    }
    path = tmp_path / "config.json"
    for act, want in ((None, SWIGLU), ("relu", ("relu", "linear")), ("gelu_pytorch_tanh", ("gelu", "linear"))):
        path.write_text(json.dumps({**cfg, **({"hidden_act": act} if act else {})}))
        assert ModelSpec.from_hf_config(path).mlp_activations == want
    path.write_text(json.dumps({**cfg, "hidden_act": "gelu"}))  # the exact erf form: not flax's gelu
    with pytest.raises(CpplanError, match="hidden_act='gelu' is not an activation cpplan runs"):
        ModelSpec.from_hf_config(path)


def test_remat_table_has_one_mlp_input_for_a_plain_mlp():
    gated, plain = remat_table(GATED), remat_table(PLAIN)
    full, minimal = remat_code(RematPolicy.FULL), remat_code(RematPolicy.MINIMAL)
    # full remat recomputes the MLP's inputs, not its output (nothing reads it): 2 of 3 matrices, 1 of 2
    assert gated.recompute_mlp[full] == pytest.approx(2 / 3) and plain.recompute_mlp[full] == pytest.approx(1 / 2)
    # minimal keeps each input projection's output: one of width intermediate, not two
    assert gated.saved_on_device[minimal] - plain.saved_on_device[minimal] == 14336
    assert plain.kept_mlp_side[minimal] == 14336


def plan(model, **fields):
    return Plan(
        model=model, topology="v5p-16", seq_len=8192, global_batch=8, mesh=make_mesh(fsdp=4, tensor=2), **fields
    )


def test_a_plain_mlp_prices_its_own_activations_and_recomputation():
    a = DTYPE_BYTES["bfloat16"]
    tokens = 8192 * 8 / 4  # per device before the tensor split
    twin, plain = estimate(plan(TWIN, remat="minimal")), estimate(plan(PLAIN, remat="minimal"))
    assert plain.model_flops == pytest.approx(twin.model_flops, rel=1e-4)  # same parameters and FLOPs
    # the twin keeps two outputs of width 2f/3 per layer, the plain MLP one of width f
    kept = (2 * TWIN.intermediate - PLAIN.intermediate) * tokens / 2 * a * 32
    assert twin.hbm_bytes["activations"] - plain.hbm_bytes["activations"] == pytest.approx(kept)
    assert twin.hbm_bytes["activations"] - plain.hbm_bytes["activations"] > 2 * GiB
    # full remat recomputes a third of the plain MLP's forward less than the twin's: 2/3 against 1/2
    twin, plain = estimate(plan(TWIN, remat="full")), estimate(plan(PLAIN, remat="full"))
    mlp_forward = 2 * tokens * 2 * 4096 * PLAIN.intermediate / 2 * 32  # per device (tensor 2), all layers
    saved = mlp_forward * (2 / 3 - 1 / 2)
    assert twin.executed_flops_per_device - plain.executed_flops_per_device == pytest.approx(saved, rel=2e-3)
    assert plain.step_time_s < twin.step_time_s


FLAGS = "compile_topology=v5p-16 ici_fsdp_parallelism=8 per_device_batch_size=1 max_target_length=8192"


def test_maxtext_reads_and_writes_mlp_activations():
    assert read_maxtext(f"model_name=llama3.1-8b {FLAGS}").plan.model.mlp_activations == SWIGLU
    for text in ("[relu]", '["relu"]', "relu"):  # MaxText's list, as a YAML list, and 2023's bare name
        read = read_maxtext(f"model_name=llama3.1-8b mlp_activations={text} {FLAGS}")
        assert read.plan.model.mlp_activations == ("relu",) and "mlp_activations" not in read.unread
    assert read.plan.model.num_params == PLAIN.num_params
    assert read_maxtext(
        {"base_emb_dim": 1024, "mlp_activations": ["gelu", "linear"], "compile_topology": "v5p-16"}
    ).plan.model.mlp_activations == ("gelu", "linear")
    exported = export_maxtext(read.plan)
    assert exported.flags["mlp_activations"] == "[relu]"
    again = read_maxtext(format_flags({**exported.flags, **exported.compile_flags})).plan.model
    assert dataclasses.replace(again, name=PLAIN.name) == PLAIN
    # a gated model MaxText ships travels by name; its activations are MaxText's default
    assert "mlp_activations" not in export_maxtext(read_maxtext(f"model_name=llama3.1-8b {FLAGS}").plan).flags
    for bad, match in (
        ("[tanh]", "'tanh' is not among the activations cpplan runs"),
        ("[silu,linear,relu]", "1 \\(plain\\) or 2 \\(gated\\) input projections"),
    ):
        with pytest.raises(CpplanError, match=f"mlp_activations='\\{bad[0]}.*{match}"):
            read_maxtext(f"model_name=llama3.1-8b mlp_activations={bad} {FLAGS}")


def test_custom_remat_exports_a_plain_mlps_input_by_maxtexts_name():
    custom = {"mlpwi_0": "offload", "mlpwi_1": "device", "query_proj": "device"}
    plain = export_maxtext(plan(PLAIN, remat="custom", remat_custom=custom)).flags
    assert plain["mlpwi"] == "offload" and "mlpwi_0" not in plain and "mlpwi_1" not in plain
    assert plain["query_proj"] == "device"
    gated = export_maxtext(plan(GATED, remat="custom", remat_custom=custom)).flags
    assert (gated["mlpwi_0"], gated["mlpwi_1"]) == ("offload", "device") and "mlpwi" not in gated


def test_corpus_synthetic_models_have_maxtexts_plain_mlp():
    shape = synthetic_shape(
        {
            "global_parameter_scale": "32",
            "base_emb_dim": "2560",
            "base_num_heads": "8",
            "base_mlp_dim": "8192",
            "base_num_decoder_layers": "16",
            "head_dim": "256",
            "vocab_size": "32768",
            "mlp_activations": "relu",
            "logits_via_embedding": "true",
        }
    )
    model = shape.model_spec("synthetic-32x")
    assert (model.intermediate, model.mlp_activations, shape.mlp_matrices) == (32768, ("relu",), 2)
    # MaxText's count leaves out the norm scales: two per layer and the final one
    assert model.num_params == shape.params + (2 * shape.layers + 1) * shape.emb


def test_maxtexts_v5p_table_fits_with_its_plain_mlp():
    """MaxText's v5p table ran 32B and 64B at fsdp 16 × tensor 4 and 256B at fsdp 64 × tensor 8
    under minimal remat; priced as a gated MLP they needed 99-105 GiB."""
    runs = {r.run_id: r for r in read_corpus(ROOT / "benchmarks" / "public_runs.csv")}
    for run_id in (
        "v5p-32b-1x128",
        "v5p-32b-2x128",
        "v5p-64b-1x128",
        "v5p-64b-2x128",
        "v5p-256b-1x1024",
        "v5p-256b-2x1024",
    ):
        run = runs[run_id]
        assert run.plan.remat is RematPolicy.MINIMAL and run.plan.model.mlp_activations == ("relu",)
        assert estimate(run.plan).fits, run_id
        assert not any("non-gated" in note for note in run.notes)
