"""cpu_mesh tier: Hugging Face checkpoints in and out of the runtime without torch (runtime.hf_checkpoint,
runtime.rope). Checkpoints are written here with safetensors' numpy API under Hugging Face's names (spelt
out below, not taken from the code under test). RoPE's scalings against hand-computed frequencies; the
config forms of transformers 4 and 5; a checkpoint read onto a mesh shard by shard and written back bit
for bit; every refusal naming its tensor or field; `cpplan run --init-from --export-hf` end to end.
(tests/runtime/test_hf_logits.py compares the logits with transformers' where torch is installed.)
"""

import json
import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("safetensors", reason="safetensors (the runtime extra) is not installed")
from runtime_steps import float32_plan  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from cli import main  # noqa: E402
from cost_models.errors import CpplanError  # noqa: E402
from planner.plan import Plan  # noqa: E402
from runtime.data import open_dataset  # noqa: E402
from runtime.hf_checkpoint import HFCheckpoint, export  # noqa: E402
from runtime.loop import train  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.rope import Rope  # noqa: E402
from runtime.train import Trainer  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 2, 64, 4, 2, 16, 96, 256
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": LAYERS,
    "hidden_size": HIDDEN,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "intermediate_size": INTER,
    "vocab_size": VOCAB,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


def hf_tensors(rng, dtype=np.float32, *, biases: bool = False, gemma3: bool = False) -> dict[str, np.ndarray]:
    """A llama checkpoint's tensors by Hugging Face's names and `[out, in]` layout, random; with `biases`, a
    qwen2 checkpoint's (q, k and v's biases too); with `gemma3`, a gemma3_text checkpoint's (four norms a
    layer, q and k norms, a tied head)."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    shapes = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (VOCAB, HIDDEN),
    }
    for i in range(LAYERS):
        layer = f"model.layers.{i}."
        shapes |= {
            layer + "input_layernorm.weight": (HIDDEN,),
            layer + "post_attention_layernorm.weight": (HIDDEN,),
            layer + "self_attn.q_proj.weight": (q, HIDDEN),
            layer + "self_attn.k_proj.weight": (kv, HIDDEN),
            layer + "self_attn.v_proj.weight": (kv, HIDDEN),
            layer + "self_attn.o_proj.weight": (HIDDEN, q),
            layer + "mlp.gate_proj.weight": (INTER, HIDDEN),
            layer + "mlp.up_proj.weight": (INTER, HIDDEN),
            layer + "mlp.down_proj.weight": (HIDDEN, INTER),
        }
        if biases:
            shapes |= {layer + f"self_attn.{n}_proj.bias": (size,) for n, size in (("q", q), ("k", kv), ("v", kv))}
        if gemma3:
            norms = ("pre_feedforward_layernorm", "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm")
            shapes |= {f"{layer}{n}.weight": (HEAD_DIM if "self_attn" in n else HIDDEN,) for n in norms}
    if gemma3:
        del shapes["lm_head.weight"]
    return {name: rng.standard_normal(shape).astype(dtype) for name, shape in shapes.items()}


def write_checkpoint(directory, tensors, config=CONFIG, *, files: int = 1):
    """`tensors` as safetensors in `files` files (with an index when more than one) beside `config`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    names = sorted(tensors)
    if files == 1:
        save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
        return directory
    weight_map = {}
    for k in range(files):
        part = f"model-{k + 1:05d}-of-{files:05d}.safetensors"
        chunk = names[k::files]
        save_file({n: tensors[n] for n in chunk}, directory / part, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(chunk, part)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return directory


def checkpoint_plan(directory, mesh=None, strategy="ring") -> Plan:
    """An fp32 plan of the checkpoint's model over 256 tokens on as many host devices as `mesh` has
    (default: fsdp 2 × tensor 2 × a ring of 2)."""
    mesh = mesh or dict(fsdp=2, tensor=2, context=2)
    strategy = strategy if mesh.get("context", 1) > 1 else "none"
    topology = f"cpu:{math.prod(mesh.values())}"
    spec = HFCheckpoint(directory).spec()
    return float32_plan(spec, mesh, seq_len=256, batch=2, topology=topology, strategy=strategy)


def trainer_of(plan: Plan, checkpoint: HFCheckpoint) -> Trainer:
    """The plan's trainer on the first of the host's devices, with the checkpoint's RoPE and norms."""
    mesh = build_mesh(plan, jax.devices()[: math.prod(plan.mesh_sizes)])
    return Trainer(plan, mesh, constants=checkpoint.constants())


# -- RoPE ------------------------------------------------------------------------------------------


def test_each_scaling_turns_at_its_hand_computed_frequencies():
    """head_dim 4, theta 10000: the pairs turn at 1 and 0.01 radians per position (wavelengths 2π and 200π)."""
    np.testing.assert_allclose(Rope(theta=1e4).frequencies(4), [1.0, 0.01], rtol=1e-15)
    np.testing.assert_allclose(Rope(theta=1e4, scaling="linear", factor=2).frequencies(4), [0.5, 0.005], rtol=1e-15)
    # llama3, pre-training context 1000, factors 1 and 4: wavelengths under 250 kept, over 1000 divided by 8,
    # between blended by s = (1000 / 200π - 1) / 3 = 0.19718
    llama3 = Rope(theta=1e4, scaling="llama3", factor=8, original_context=1000, low_freq_factor=1, high_freq_factor=4)
    s = (1000 / (200 * math.pi) - 1) / 3
    np.testing.assert_allclose(llama3.frequencies(4), [1.0, (1 - s) * 0.01 / 8 + s * 0.01], rtol=1e-12)
    np.testing.assert_allclose(llama3.frequencies(4)[1], 0.0029754, rtol=1e-4)
    # pre-training context 64: the 200π wavelength is over 64, so divided; 2π is under 16, kept
    short = Rope(theta=1e4, scaling="llama3", factor=8, original_context=64)
    np.testing.assert_allclose(short.frequencies(4), [1.0, 0.01 / 8], rtol=1e-15)
    # yarn, factor 4 over 64 positions: the pair turning 32 times sits at 4·ln(64/64π)/(2·ln 1e4) = -0.249,
    # floored to 0; the one turning once at 4·ln(64/2π)/(2·ln 1e4) = 0.504, ceiled to 1: pair 0 keeps its
    # frequency, pair 1 is divided by 4; cos and sin grow by 0.1·ln 4 + 1
    yarn = Rope.from_hf_config(
        {"rope_theta": 1e4, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
        where="config.json",
    )
    np.testing.assert_allclose(yarn.frequencies(4), [1.0, 0.0025], rtol=1e-15)
    assert yarn.attention_factor == pytest.approx(1.1386294361)


def test_the_config_forms_of_transformers_4_and_5_read_alike():
    llama3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    four = {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **llama3}}
    older = {"rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **llama3}}
    five = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **llama3}}
    ropes = {Rope.from_hf_config(cfg, where="c") for cfg in (four, older, five)}
    assert ropes == {Rope(theta=5e5, scaling="llama3", factor=8, original_context=8192)}
    assert Rope.from_hf_config({}, where="c") == Rope(theta=10000.0)  # transformers' default base
    assert Rope.from_hf_config(five, where="c", theta=1e6).theta == 1e6  # --rope-theta
    # YaRN without a factor: max_position_embeddings over the pre-training context, as transformers infers it
    inferred = {
        "max_position_embeddings": 4096,
        "rope_scaling": {"type": "yarn", "original_max_position_embeddings": 1024},
    }
    assert Rope.from_hf_config(inferred, where="c").factor == 4.0


def test_a_scaled_ropes_gradient_is_its_forwards_transpose():
    """The hand-written backward (the rotation by minus the angle, times YaRN's factor) equals autodiff of
    the forward written out."""
    import jax.numpy as jnp

    from runtime.rope import rope

    settings = Rope(theta=1e4, scaling="yarn", factor=4, original_context=64, attention_factor=1.25)
    x, grad = (jax.random.normal(k, (1, 32, 2, 16)) for k in jax.random.split(jax.random.PRNGKey(0), 2))
    positions = jnp.arange(32)[None] * 7

    def written_out(x):
        angle = positions[..., None, None] * jnp.asarray(settings.frequencies(16), jnp.float32)
        cos, sin = jnp.cos(angle) * 1.25, jnp.sin(angle) * 1.25
        x1, x2 = x[..., :8], x[..., 8:]
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    out, vjp = jax.vjp(lambda x: rope(x, positions, settings), x)
    expected_out, expected_vjp = jax.vjp(written_out, x)
    np.testing.assert_allclose(out, expected_out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(vjp(grad)[0], expected_vjp(grad)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "config,says",
    [
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "RoPE scaling 'dynamic' is not one"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "RoPE scaling 'longrope' is not one"),
        ({"rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {}}}, "each layer type"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "needs the pre-training context"),
        ({"rope_theta": "big"}, "does not read as a number"),
    ],
)
def test_a_rope_the_runtime_does_not_run_is_refused(config, says):
    with pytest.raises(CpplanError, match="^cfg.json: ") as refused:
        Rope.from_hf_config(config, where="cfg.json")
    assert says in str(refused.value)


# -- in and out ------------------------------------------------------------------------------------


@pytest.mark.parametrize("files,dtype", [(1, np.float32), (3, np.float32)])
def test_a_checkpoint_is_read_shard_by_shard_and_written_back_bit_for_bit(tmp_path, files, dtype):
    source = hf_tensors(np.random.default_rng(0), dtype)
    directory = write_checkpoint(tmp_path / "hf", source, files=files)
    checkpoint = HFCheckpoint(directory)
    plan = checkpoint_plan(directory)
    checkpoint.check(plan.model, plan.seq_len)
    trainer = trainer_of(plan, checkpoint)
    params = checkpoint.load(trainer)["params"]
    # the runtime's layout, read off by hand: wq[i, d, h, k] is q_proj[h·head_dim + k, d]; wo[i, h, k, d] is
    # o_proj[d, h·head_dim + k]; w_gate[i] is gate_proj transposed; head is lm_head transposed
    wq, wo = np.asarray(params["layers"]["wq"]), np.asarray(params["layers"]["wo"])
    assert wq[1, 5, 3, 7] == source["model.layers.1.self_attn.q_proj.weight"][3 * HEAD_DIM + 7, 5]
    assert wo[0, 2, 9, 40] == source["model.layers.0.self_attn.o_proj.weight"][40, 2 * HEAD_DIM + 9]
    np.testing.assert_array_equal(params["layers"]["w_gate"][1], source["model.layers.1.mlp.gate_proj.weight"].T)
    np.testing.assert_array_equal(params["head"], source["lm_head.weight"].T)
    np.testing.assert_array_equal(params["layers"]["attn_norm"][0], source["model.layers.0.input_layernorm.weight"])
    # each device holds its shard, no more: the layout the trainer asks for, nothing replicated beyond it
    for leaf, sharding in zip(jax.tree.leaves(params), jax.tree.leaves(trainer.param_shardings["params"])):
        assert leaf.sharding == sharding
        assert {s.data.shape for s in leaf.addressable_shards} == {sharding.shard_shape(leaf.shape)}
    # wq's hidden split over fsdp × context (the weights' ZeRO-3 axes), its heads over tensor
    assert params["layers"]["wq"].addressable_shards[0].data.shape == (LAYERS, HIDDEN // 4, HEADS // 2, HEAD_DIM)

    written = export({"params": params}, trainer, tmp_path / "out", source=checkpoint.config)
    assert {p.name for p in written} == {"model.safetensors", "config.json"}
    back = load_file(tmp_path / "out" / "model.safetensors")
    assert set(back) == set(source)
    for name, tensor in source.items():
        np.testing.assert_array_equal(back[name], tensor, err_msg=name)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config == {**CONFIG, "torch_dtype": "float32", "dtype": "float32"}
    # and the export reads in again as the same weights
    again = HFCheckpoint(tmp_path / "out")
    again.check(plan.model, plan.seq_len)
    for ours, theirs in zip(jax.tree.leaves(again.load(trainer)["params"]), jax.tree.leaves(params)):
        np.testing.assert_array_equal(ours, theirs)


QWEN2 = {**CONFIG, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False}


def test_a_qwen2_checkpoints_biases_are_read_split_by_head_and_written_back(tmp_path):
    """q, k and v's biases `[heads·head_dim]` become `[heads, head_dim]` parameters split over 'tensor' by head,
    as their weights are, and are written back bit for bit; a config built without the source is qwen2's."""
    source = hf_tensors(np.random.default_rng(5), biases=True)
    directory = write_checkpoint(tmp_path / "hf", source, QWEN2, files=2)
    checkpoint = HFCheckpoint(directory)
    plan = checkpoint_plan(directory)
    assert plan.model.qkv_bias
    checkpoint.check(plan.model, plan.seq_len)
    trainer = trainer_of(plan, checkpoint)
    params = checkpoint.load(trainer)["params"]
    bk = np.asarray(params["layers"]["bk"])
    assert bk.shape == (LAYERS, KV_HEADS, HEAD_DIM)
    assert bk[1, 1, 3] == source["model.layers.1.self_attn.k_proj.bias"][HEAD_DIM + 3]
    # the cost model counts the biases as the runtime holds them: (heads + 2 kv heads) · head_dim a layer
    assert (
        sum(leaf.size for leaf in jax.tree.leaves(params))
        == plan.model.num_params
        == sum(t.size for t in source.values())
    )
    # the heads over tensor (2), whole over the weight axes: each device holds one of 4 q heads' biases
    assert params["layers"]["bq"].addressable_shards[0].data.shape == (LAYERS, HEADS // 2, HEAD_DIM)
    export({"params": params}, trainer, tmp_path / "out", source=checkpoint.config)
    back = load_file(tmp_path / "out" / "model.safetensors")
    assert set(back) == set(source)
    for name, tensor in source.items():
        np.testing.assert_array_equal(back[name], tensor, err_msg=name)
    export({"params": params}, trainer, tmp_path / "built")
    built = json.loads((tmp_path / "built" / "config.json").read_text())
    assert built["model_type"] == "qwen2" and built["architectures"] == ["Qwen2ForCausalLM"]
    assert built["use_sliding_window"] is False and "attention_bias" not in built
    HFCheckpoint(tmp_path / "built").check(plan.model, plan.seq_len)  # the same model, biases and all
    # a llama checkpoint that lacks them is not a qwen2 one
    directory = write_checkpoint(tmp_path / "plain", hf_tensors(np.random.default_rng(5)), QWEN2)
    with pytest.raises(CpplanError, match=r"lacks 6 tensor\(s\) .* e.g. model.layers.0.self_attn.q_proj.bias"):
        HFCheckpoint(directory).check(plan.model, plan.seq_len)


GEMMA3 = {
    **{k: v for k, v in CONFIG.items() if k not in ("hidden_act", "rope_theta", "tie_word_embeddings")},
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "hidden_activation": "gelu_pytorch_tanh",
    "sliding_window": 64,
    "layer_types": ["sliding_attention", "full_attention"],
    "query_pre_attn_scalar": 24,
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
    },
}


def test_a_gemma3_checkpoint_is_read_with_its_four_norms_and_written_back(tmp_path):
    """Gemma 3's block: four norms a layer (post_attention_layernorm is the attention output's, not the MLP
    input's as in llama), q and k norms per head, a tied head; each layer type's RoPE and the query scale
    from the config; the planner's model holds what the runtime does, weight for weight."""
    source = hf_tensors(np.random.default_rng(6), gemma3=True)
    directory = write_checkpoint(tmp_path / "hf", source, GEMMA3)
    checkpoint = HFCheckpoint(directory)
    plan = checkpoint_plan(directory)
    model = plan.model
    assert model.decoder_block.value == "gemma3" and model.qk_norm and model.tie_embeddings
    assert (model.window, model.layer_pattern, model.mlp_activations) == (64, "LG", ("gelu", "linear"))
    checkpoint.check(model, plan.seq_len)
    constants = checkpoint.constants()
    # (the pre-training context read, as for any config, from max_position_embeddings; unused by these scalings)
    assert constants.rope == Rope(theta=1e5, scaling="linear", factor=2.0, original_context=256)
    assert constants.local_rope == Rope(theta=1e3, original_context=256)
    assert constants.query_pre_attn_scalar == 24.0
    assert checkpoint.constants(rope_theta=2e5).rope.theta == 2e5  # --rope-theta moves the global layers' base
    trainer = trainer_of(plan, checkpoint)
    params = checkpoint.load(trainer)["params"]
    layers = params["layers"]
    np.testing.assert_array_equal(layers["post_attn_norm"][1], source["model.layers.1.post_attention_layernorm.weight"])
    np.testing.assert_array_equal(layers["mlp_norm"][0], source["model.layers.0.pre_feedforward_layernorm.weight"])
    np.testing.assert_array_equal(layers["k_norm"][1], source["model.layers.1.self_attn.k_norm.weight"])
    assert "head" not in params
    # the cost model counts what the runtime holds: every weight, the norms' and q/k norms' scales included
    assert (
        sum(leaf.size for leaf in jax.tree.leaves(params)) == model.num_params == sum(t.size for t in source.values())
    )
    export({"params": params}, trainer, tmp_path / "out", source=checkpoint.config)
    back = load_file(tmp_path / "out" / "model.safetensors")
    assert set(back) == set(source)
    for name, tensor in source.items():
        np.testing.assert_array_equal(back[name], tensor, err_msg=name)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["rope_parameters"] == GEMMA3["rope_parameters"]
    # the transformers 4 form: rope_theta and rope_scaling for the global layers, rope_local_base_freq for the local
    older = {k: v for k, v in GEMMA3.items() if k != "rope_parameters"}
    older |= {"rope_theta": 1e5, "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_local_base_freq": 1e3}
    again = HFCheckpoint(write_checkpoint(tmp_path / "older", source, older)).constants()
    assert (again.rope, again.local_rope) == (constants.rope, constants.local_rope)
    # over a sequence no longer than the window every layer runs as a global one, at the global layers' RoPE
    with pytest.raises(CpplanError, match="over 64 tokens, no more than their window of 64, the runtime runs every"):
        checkpoint.check(model.within(64)[0], 64)


def test_bf16_weights_are_read_into_the_plans_dtype(tmp_path):
    import ml_dtypes

    source = hf_tensors(np.random.default_rng(1), ml_dtypes.bfloat16)
    directory = write_checkpoint(tmp_path / "hf", source)
    plan = checkpoint_plan(directory, mesh=dict(tensor=2))
    checkpoint = HFCheckpoint(directory)
    params = checkpoint.load(trainer_of(plan, checkpoint))["params"]
    assert params["embed"].dtype == np.float32
    np.testing.assert_array_equal(params["embed"], source["model.embed_tokens.weight"].astype(np.float32))


def test_tied_and_windowed_checkpoints_export_as_their_family(tmp_path):
    """A tied head has no lm_head; a sliding window on every layer is a mistral config; an export built
    without a source config writes the model's own fields."""
    source = hf_tensors(np.random.default_rng(2))
    source.pop("lm_head.weight")
    config = {**CONFIG, "model_type": "mistral", "architectures": ["MistralForCausalLM"], "tie_word_embeddings": True}
    directory = write_checkpoint(tmp_path / "hf", source, {**config, "sliding_window": 128})
    checkpoint = HFCheckpoint(directory)
    plan = checkpoint_plan(directory, mesh=dict(context=2))
    assert plan.model.window == 128 and plan.model.tie_embeddings
    checkpoint.check(plan.model, plan.seq_len)
    trainer = trainer_of(plan, checkpoint)
    export(checkpoint.load(trainer), trainer, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == "mistral" and written["sliding_window"] == 128
    assert written["tie_word_embeddings"] is True and written["rms_norm_eps"] == 1e-6
    assert set(load_file(tmp_path / "out" / "model.safetensors")) == set(source)


# -- refusals --------------------------------------------------------------------------------------


def edited(tensors, **changes):
    out = dict(tensors)
    for name, value in changes.items():
        name = name.replace("__", ".")
        if value is None:
            out.pop(name)
        else:
            out[name] = value
    return out


@pytest.mark.parametrize(
    "change,says",
    [
        (
            {"model__layers__1__self_attn__k_proj__weight": np.zeros((64, 64), np.float32)},
            "tensor 'model.layers.1.self_attn.k_proj.weight' (model.safetensors) is [64, 64]; the plan's model "
            "'hf (LlamaForCausalLM)' expects [32, 64] (num_kv_heads × head_dim, hidden); plan the model from the "
            "checkpoint's own config (--model ",
        ),
        ({"model__layers__0__mlp__up_proj__weight": None}, "lacks 1 tensor(s) the plan's model 'hf (LlamaF"),
        (
            {"model__layers__0__self_attn__q_proj__bias": np.zeros(64, np.float32)},
            "holds 1 tensor(s) the runtime's model has no place for, e.g. model.layers.0.self_attn.q_proj.bias",
        ),
        (
            {"model__norm__weight": np.zeros(64, np.int8)},
            "tensor 'model.norm.weight' (model.safetensors) is I8; cpplan reads floating-point weights",
        ),
    ],
)
def test_a_tensor_that_does_not_fit_the_plans_model_is_named(tmp_path, change, says):
    directory = write_checkpoint(tmp_path / "hf", edited(hf_tensors(np.random.default_rng(0)), **change))
    plan = checkpoint_plan(directory)
    with pytest.raises(CpplanError) as refused:
        HFCheckpoint(directory).check(plan.model, plan.seq_len)
    assert str(refused.value).startswith(f"--init-from {str(directory)!r}: ")
    assert says in str(refused.value)


def test_a_plan_of_another_architecture_is_refused(tmp_path):
    directory = write_checkpoint(tmp_path / "hf", hf_tensors(np.random.default_rng(0)))
    plan = checkpoint_plan(directory)
    windowed = Plan.from_dict({**plan.to_dict(), "model": {**plan.model.to_dict(), "window": 64}})
    with pytest.raises(CpplanError, match="has window=64 where its config has 0; plan the model from"):
        HFCheckpoint(directory).check(windowed.model, windowed.seq_len)
    other = Plan.from_dict({**plan.to_dict(), "model": {**plan.model.to_dict(), "num_kv_heads": 4}})
    with pytest.raises(CpplanError, match=r"k_proj.weight' \(model.safetensors\) is \[32, 64\]; .* expects \[64, 64\]"):
        HFCheckpoint(directory).check(other.model, other.seq_len)


@pytest.mark.parametrize(
    "config,says",
    [
        (
            {"model_type": "gemma3_text", "final_logit_softcapping": 30.0},
            "model_type 'gemma3_text' with final_logit_softcapping=30.0: cpplan's runtime runs Gemma 3 without logit "
            "soft-capping",
        ),
        ({"model_type": "gemma3"}, "model_type 'gemma3': a multimodal Gemma 3 checkpoint keeps its decoder under"),
        ({"model_type": "qwen3"}, "has q/k norms, which cpplan's runtime does not run"),
        (
            {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
            "model_type 'mixtral': its tensors are not mapped to the runtime's; --init-from reads llama, mistral, "
            "qwen2, gemma3_text checkpoints",
        ),
        ({"mlp_bias": True}, "mlp_bias is true: cpplan's runtime has no biases on the MLP's projections"),
        (
            {"attention_bias": True},
            "attention_bias is true: a llama checkpoint then has a bias on the attention's out projection too",
        ),
    ],
)
def test_families_the_runtime_does_not_run_are_refused_by_name(tmp_path, config, says):
    directory = write_checkpoint(tmp_path / "hf", hf_tensors(np.random.default_rng(0)), {**CONFIG, **config})
    with pytest.raises(CpplanError) as refused:
        HFCheckpoint(directory)
    assert str(refused.value).startswith(f"--init-from {str(directory)!r}: ")
    assert says in str(refused.value)


# -- a run -----------------------------------------------------------------------------------------


def test_a_run_starts_from_the_checkpoint_and_exports_what_it_trained(tmp_path):
    """The loop's first loss is the checkpoint's own loss on the first batch, and the weights handed on
    after the last step are the trained ones."""
    source = hf_tensors(np.random.default_rng(3))
    checkpoint = HFCheckpoint(write_checkpoint(tmp_path / "hf", source))
    plan = checkpoint_plan(checkpoint.directory, mesh=dict(fsdp=2, context=2))
    trainer = trainer_of(plan, checkpoint)
    dataset = open_dataset(None, seq_len=plan.seq_len, vocab=plan.model.vocab, seed=0)
    first = dataset.batch(0, global_batch=plan.global_batch, process_index=0, process_count=1)
    expected = float(jax.jit(trainer.loss)(checkpoint.load(trainer), *trainer.prepare_batch(first.tokens)))
    compiled = trainer.train_step.lower(*trainer.abstract_state()).compile()
    handed = []
    report = train(
        trainer,
        compiled,
        steps=2,
        dataset=dataset,
        initial=lambda: checkpoint.load(trainer),
        trained=lambda params: handed.append(export(params, trainer, tmp_path / "out", source=checkpoint.config)),
    )
    assert report.losses[0] == pytest.approx(expected, rel=1e-6)
    assert len(handed) == 1
    trained = load_file(tmp_path / "out" / "model.safetensors")
    assert set(trained) == set(source)
    assert not np.array_equal(
        trained["model.layers.0.self_attn.q_proj.weight"], source["model.layers.0.self_attn.q_proj.weight"]
    )


def test_cpplan_run_init_from_and_export_hf(tmp_path, capsys):
    directory = write_checkpoint(tmp_path / "hf", hf_tensors(np.random.default_rng(4)), files=2)
    out = tmp_path / "out"
    common = ["run", "--seq-len", "256", "--topology", "cpu:8", "--steps", "2", "--run-dir", str(tmp_path / "run")]
    argv = [*common, "--model", str(directory / "config.json"), "--init-from", str(directory)]
    assert main([*argv, "--export-hf", str(out), "--rope-theta", "20000", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["losses"], captured
    assert "weights from" in captured.err and "RoPE theta 20000" in captured.err
    assert "exported the weights for transformers to" in captured.err
    assert json.loads((out / "config.json").read_text())["rope_theta"] == 20000.0
    HFCheckpoint(out).check(HFCheckpoint(directory).spec(), 256)
    # refused before any compile, each in one line: a checkpoint of another model, an export into the source
    assert main([*common, "--init-from", str(directory), "--model", "tiny"]) == 2
    assert "expects" in capsys.readouterr().err
    assert main([*argv, "--export-hf", str(directory)]) == 2
    assert "is the --init-from directory" in capsys.readouterr().err
