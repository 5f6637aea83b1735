"""cpu_mesh tier, with the hf-test extra (torch, transformers): tiny random llama, mistral, qwen2 and gemma3_text
models made by transformers on the CPU (2 layers, hidden 64, 4 heads over 2 KV heads; weights drawn at unit scale
so that every layer and RoPE move the logits), saved with `save_pretrained` and read by `runtime.hf_checkpoint` onto
an 8-device mesh (fsdp × tensor × a ring of context) in fp32: the runtime's logits equal transformers' (eager
attention, fp32) under each RoPE scaling the families take; RoPE's frequencies equal transformers' own; the
export loads in transformers as the same model; the families the runtime cannot run are refused by name.
"""

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
REASON = "the hf-test extra (torch, transformers) is not installed: pip install -e '.[hf-test]'"
torch = pytest.importorskip("torch", reason=REASON)
transformers = pytest.importorskip("transformers", reason=REASON)
import jax.numpy as jnp  # noqa: E402
from runtime_steps import float32_plan  # noqa: E402

from cost_models.errors import CpplanError  # noqa: E402
from cost_models.vocabulary import LoadBalance  # noqa: E402
from runtime.hf_checkpoint import HFCheckpoint, export  # noqa: E402
from runtime.layout import token_order  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from runtime.rope import Rope  # noqa: E402
from runtime.train import Trainer  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

SEQ, BATCH = 256, 4
# the pre-training context of the scaled configs: a quarter of the sequence, so every scaling changes angles
ORIGINAL = 64
SCALINGS = {
    "none": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": ORIGINAL,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
}
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    # every layer sees a window of 64 tokens of the 256
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": 64}),
    # biases on q, k and v
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    # a local layer (a window of 64, its own RoPE base) then a global one; q scaled to 24, not head_dim 16
    "gemma3": (
        transformers.Gemma3TextConfig,
        transformers.Gemma3ForCausalLM,
        {
            "sliding_window": 64,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_local_base_freq": 1000.0,
            "query_pre_attn_scalar": 24,
        },
    ),
}
# fp32 on both sides: what remains is summation order and RoPE's angles (fp32 frequencies both sides)
LOGIT_ATOL = 1e-4


def tiny_config(family: str, scaling: str, **changes):
    config_class, _, extra = FAMILIES[family]
    fields = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
        max_position_embeddings=SEQ,
        rms_norm_eps=1e-6,  # not the runtime's default 1e-5: the config's is used
        rope_theta=10000.0,
        rope_scaling=SCALINGS[scaling],
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    return config_class(**{**fields, **extra, **changes})


def random_model(family: str, config, seed: int = 0):
    """The family's model with weights at unit scale (transformers' 0.02 leaves the logits near zero): each
    matrix N(0, 1/fan_in), the embedding N(0, 9/hidden), each norm scale 1 + N(0, 0.01) (Gemma's weight w of
    its 1 + w scale N(0, 0.01)), each bias N(0, 1)."""
    torch.manual_seed(seed)
    model = FAMILIES[family][1](config).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith(".bias"):
                weight.copy_(torch.randn_like(weight))
            elif weight.ndim == 1:
                weight.copy_((family != "gemma3") + 0.1 * torch.randn_like(weight))
            else:
                scale = 3.0 if "embed" in name else 1.0
                weight.copy_(torch.randn_like(weight) * scale / math.sqrt(weight.shape[-1]))
    return model


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.numpy()


def runtime_logits(checkpoint: HFCheckpoint, plan, tokens: np.ndarray) -> np.ndarray:
    """The runtime's logits `[batch, seq, vocab]` (natural token order) of the checkpoint on `plan`'s mesh."""
    checkpoint.check(plan.model, plan.seq_len)
    trainer = Trainer(
        plan, build_mesh(plan, jax.devices()[: math.prod(plan.mesh_sizes)]), constants=checkpoint.constants()
    )
    rows = np.concatenate([tokens, tokens[:, :1]], axis=1)  # a target column, unused
    inputs, _, positions, _ = trainer.prepare_batch(rows)
    hidden, head = jax.jit(trainer.model.apply)(checkpoint.load(trainer), inputs, positions)
    logits = np.asarray(jnp.einsum("bsd,dv->bsv", hidden, head))
    order = token_order(plan.seq_len, plan.axis_size("context"), plan.load_balance is LoadBalance.ZIGZAG)
    return logits[:, np.argsort(order)]


def plan_of(checkpoint: HFCheckpoint, *, mesh, strategy):
    return float32_plan(checkpoint.spec(), mesh, seq_len=SEQ, batch=BATCH, strategy=strategy)


# (family, scaling, mesh, strategy, tied): every family under every scaling, over strategies and meshes
CASES = [
    ("llama", "none", dict(fsdp=2, tensor=2, context=2), "ring", False),
    ("llama", "linear", dict(fsdp=2, tensor=2, context=2), "all_gather", True),
    ("llama", "llama3", dict(data=2, tensor=2, context=2), "ring", False),
    ("llama", "yarn", dict(fsdp=4, context_ulysses=2), "ulysses", False),
    ("mistral", "none", dict(fsdp=2, tensor=2, context=2), "ring", False),
    ("mistral", "linear", dict(fsdp=4, context=2), "all_gather", False),
    ("mistral", "llama3", dict(fsdp=2, tensor=2, context=2), "ring", True),
    ("mistral", "yarn", dict(fsdp=2, tensor=2, context=2), "ring", False),
    ("qwen2", "none", dict(fsdp=2, tensor=2, context=2), "ring", False),
    ("qwen2", "linear", dict(fsdp=4, context_ulysses=2), "ulysses", True),
    ("qwen2", "llama3", dict(data=2, tensor=2, context=2), "ring", False),
    ("qwen2", "yarn", dict(fsdp=4, context=2), "all_gather", False),
    ("gemma3", "none", dict(fsdp=2, tensor=2, context=2), "ring", True),
    ("gemma3", "linear", dict(fsdp=4, context=2), "all_gather", False),
    ("gemma3", "llama3", dict(data=2, tensor=2, context=2), "ring", True),
    ("gemma3", "yarn", dict(fsdp=2, tensor=2, context=2), "ring", True),
]


@pytest.mark.parametrize("family,scaling,mesh,strategy,tied", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_the_runtimes_logits_are_transformers(tmp_path, family, scaling, mesh, strategy, tied):
    config = tiny_config(family, scaling, tie_word_embeddings=tied)
    model = random_model(family, config)
    model.save_pretrained(tmp_path / "hf", max_shard_size="40KB")  # sharded, with its index
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    checkpoint = HFCheckpoint(tmp_path / "hf")
    assert checkpoint.constants().rope.scaling == (scaling if scaling != "none" else "default")
    tokens = np.random.default_rng(1).integers(0, 256, (BATCH, SEQ))
    theirs = hf_logits(model, tokens)
    ours = runtime_logits(checkpoint, plan_of(checkpoint, mesh=mesh, strategy=strategy), tokens)
    difference = float(np.abs(ours - theirs).max())
    print(f"{family} {scaling}: max |logit| {np.abs(theirs).max():.2f}, max difference {difference:.2e}")
    assert difference < LOGIT_ATOL
    # the scaling matters here: without it the logits are off by far more than the tolerance
    if scaling != "none":
        plain = hf_logits(random_model(family, tiny_config(family, "none", tie_word_embeddings=tied)), tokens)
        assert np.abs(plain - theirs).max() > 100 * LOGIT_ATOL


@pytest.mark.parametrize("scaling", ["linear", "llama3", "yarn"])
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_rope_frequencies_are_transformers(scaling, head_dim):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = tiny_config("llama", scaling, head_dim=head_dim, rope_theta=500000.0, max_position_embeddings=4096)
    inverse, attention_factor = ROPE_INIT_FUNCTIONS[scaling](config, "cpu")
    rope = Rope.from_hf_config(config.to_dict(), where="config")
    np.testing.assert_allclose(rope.frequencies(head_dim), inverse.numpy(), rtol=1e-6)
    assert rope.attention_factor == pytest.approx(attention_factor, rel=1e-12)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "gemma3"])
def test_an_export_loads_in_transformers_as_the_same_model(tmp_path, family):
    """Read in and written out with the source's config, then with a config built from the model alone:
    transformers loads both as the same weights, which give the same logits."""
    model = random_model(family, tiny_config(family, "yarn" if family == "llama" else "none"))
    model.save_pretrained(tmp_path / "hf")
    checkpoint = HFCheckpoint(tmp_path / "hf")
    plan = plan_of(checkpoint, mesh=dict(fsdp=2, tensor=2, context=2), strategy="ring")
    trainer = Trainer(plan, build_mesh(plan), constants=checkpoint.constants())
    params = checkpoint.load(trainer)
    export(params, trainer, tmp_path / "out", source=checkpoint.config)
    source = FAMILIES[family][1].from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    exported = FAMILIES[family][1].from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    for name, weight in source.state_dict().items():
        assert torch.equal(weight, exported.state_dict()[name]), name
    tokens = np.random.default_rng(2).integers(0, 256, (1, SEQ))
    np.testing.assert_array_equal(hf_logits(exported, tokens), hf_logits(source, tokens))
    if family != "llama":  # no scaling: the config can be built from the model and the run's constants
        export(params, trainer, tmp_path / "built")
        built = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "built", attn_implementation="eager")
        assert type(built) is FAMILIES[family][1]
        assert built.config.sliding_window == (None if family == "qwen2" else 64)
        np.testing.assert_array_equal(hf_logits(built.eval(), tokens), hf_logits(source, tokens))


def test_families_the_runtime_cannot_run_are_refused_by_name(tmp_path):
    """Qwen3's q/k norms (outside Gemma 3's block) and Gemma 3's logit soft-capping have no place in the
    runtime: their checkpoints are refused with the reason, not loaded in part."""
    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256)
    qwen3 = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(num_key_value_heads=2, head_dim=16, **small))
    qwen3.save_pretrained(tmp_path / "qwen3")
    with pytest.raises(CpplanError, match="model_type 'qwen3': .* has q/k norms, which cpplan's runtime"):
        HFCheckpoint(tmp_path / "qwen3")
    capped = transformers.Gemma3TextConfig(num_key_value_heads=2, head_dim=16, final_logit_softcapping=30.0, **small)
    transformers.Gemma3ForCausalLM(capped).save_pretrained(tmp_path / "gemma3")
    with pytest.raises(CpplanError, match="'gemma3_text' with final_logit_softcapping=30.0: cpplan's runtime runs"):
        HFCheckpoint(tmp_path / "gemma3")


def test_a_checkpoint_of_another_size_names_the_tensor(tmp_path):
    random_model("llama", tiny_config("llama", "none")).save_pretrained(tmp_path / "small")
    wider = tiny_config("llama", "none", num_key_value_heads=4)
    random_model("llama", wider).save_pretrained(tmp_path / "wide")
    plan = plan_of(HFCheckpoint(tmp_path / "small"), mesh=dict(fsdp=8), strategy="none")
    with pytest.raises(CpplanError) as refused:
        HFCheckpoint(tmp_path / "wide").check(plan.model, plan.seq_len)
    assert "tensor 'model.layers.0.self_attn.k_proj.weight'" in str(refused.value)
    assert "is [64, 64]; the plan's model 'small (LlamaForCausalLM)' expects [32, 64]" in str(refused.value)
