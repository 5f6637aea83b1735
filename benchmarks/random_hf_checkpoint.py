"""Writes a Hugging Face Llama checkpoint of random weights (config.json and model.safetensors, bf16) with
safetensors' numpy API, for `cpplan run --init-from` where no real checkpoint can be reached (a TPU VM
without internet). Weights are scaled by 1/sqrt(fan-in), norms are ones, so the first loss is near
ln(vocab), as a trained model's start would not be: the run shows the checkpoint loads and trains.

    python benchmarks/random_hf_checkpoint.py OUT_DIR [--hidden 1024 --layers 8 --vocab 32000 --rope-scaling llama3]
"""

import argparse
import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's runtime, uninstalled

from cost_models.models import get_model  # noqa: E402
from runtime.hf_checkpoint import layout  # noqa: E402


def config_of(args) -> dict:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
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
    return config


def tensors_of(directory: Path, seed: int) -> dict[str, np.ndarray]:
    """Every tensor the config in `directory` calls for, by Hugging Face's name and stored shape (the
    runtime's own mapping, `runtime.hf_checkpoint.layout`), bf16."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for tensor in layout(get_model(directory / "config.json")):
        for name in tensor.names:
            shape = tensor.stored
            value = np.ones(shape, np.float32) if len(shape) == 1 else rng.standard_normal(shape, np.float32)
            tensors[name] = (value * (shape[1] ** -0.5 if len(shape) > 1 else 1.0)).astype(ml_dtypes.bfloat16)
    return tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
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
