"""Writes a Hugging Face checkpoint of random weights (config.json and model.safetensors, bf16) with
safetensors' numpy API, for `cpplan run --init-from` where no real checkpoint can be reached (a TPU VM
without internet): a llama model, or a qwen2 one (biases on q, k and v) or a gemma3_text one (Gemma 3's
block, five local layers of `--window` tokens to each global one). Weights are scaled by 1/sqrt(fan-in),
norms scale by one, biases are zero, so the first loss is near ln(vocab), as a trained model's start would
not be: the run shows the checkpoint loads and trains.

    python benchmarks/random_hf_checkpoint.py OUT_DIR [--family llama --hidden 1024 --layers 8 --vocab 32000 \
        --rope-scaling llama3]
"""

import argparse
import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's runtime, uninstalled

from cost_models.models import DecoderBlock, get_model  # noqa: E402
from runtime.hf_checkpoint import layout  # noqa: E402

# each family's transformers class
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
# local layers to each global one: Gemma3TextConfig's default `sliding_window_pattern` of 6 (transformers 5.25,
# models/gemma3/configuration_gemma3.py)
GEMMA3_LOCAL_LAYERS = 5


def config_of(args) -> dict:
    config = {
        "architectures": [ARCHITECTURES[args.family]],
        "model_type": args.family,
        "num_hidden_layers": args.layers,
        "hidden_size": args.hidden,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.hidden // args.heads,
        "intermediate_size": args.intermediate,
        "vocab_size": args.vocab,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
    }
    if args.rope_scaling == "llama3":  # Llama 3.1's own (its config.json)
        config["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    if args.family == "qwen2":
        config["use_sliding_window"] = False
    if args.family == "gemma3_text":
        # Gemma3TextConfig's defaults (transformers 5.25): a gelu MLP, a tied head, RoPE bases of 1e6 (global
        # layers) and 1e4 (local ones)
        del config["hidden_act"]
        config |= {
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "query_pre_attn_scalar": args.hidden // args.heads,
            "sliding_window": args.window,
            "sliding_window_pattern": GEMMA3_LOCAL_LAYERS + 1,
        }
    return config


def tensors_of(directory: Path, seed: int) -> dict[str, np.ndarray]:
    """Every tensor the config in `directory` calls for, by Hugging Face's name and stored shape (the
    runtime's own mapping, `runtime.hf_checkpoint.layout`), bf16: norms scaling by one (Gemma's weights w of
    their 1 + w scale zero), biases zero."""
    rng = np.random.default_rng(seed)
    model = get_model(directory / "config.json")
    gemma = model.decoder_block is DecoderBlock.GEMMA3
    tensors = {}
    for tensor in layout(model):
        for name in tensor.names:
            shape = tensor.stored
            one = 0.0 if gemma or name.endswith(".bias") else 1.0
            value = np.full(shape, one, np.float32) if len(shape) == 1 else rng.standard_normal(shape, np.float32)
            tensors[name] = (value * (shape[1] ** -0.5 if len(shape) > 1 else 1.0)).astype(ml_dtypes.bfloat16)
    return tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--family", choices=tuple(ARCHITECTURES), default="llama")
    parser.add_argument("--window", type=int, default=1024, help="gemma3_text: the local layers' sliding window")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rope-scaling", choices=("none", "llama3"), default="llama3")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.hidden % args.heads or args.heads % args.kv_heads:
        parser.error(f"--hidden {args.hidden} must split over --heads {args.heads}, and those over --kv-heads")
    config = config_of(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    tensors = tensors_of(args.out, args.seed)
    save_file(tensors, args.out / "model.safetensors", metadata={"format": "pt"})
    params = sum(t.size for t in tensors.values())
    print(f"wrote {args.out}: {params / 1e6:.1f}M parameters, {config['num_hidden_layers']} layers")


if __name__ == "__main__":
    main()
