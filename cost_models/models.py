"""Model shapes: Llama-style decoders by name, or read from a Hugging Face `config.json`."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cost_models.errors import CpplanError, unknown_name

HF_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP."""

    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False
    qkv_bias: bool = False

    def __post_init__(self):
        for f in ("num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "intermediate", "vocab"):
            value = getattr(self, f)
            if not isinstance(value, int) or value < 1:
                raise CpplanError(f"model {self.name!r}: {f}={value!r} must be a positive integer.")
        if self.num_heads % self.num_kv_heads:
            raise CpplanError(f"model {self.name!r}: num_heads={self.num_heads} must be a multiple of "
                              f"num_kv_heads={self.num_kv_heads} (grouped-query attention).")

    @property
    def params_per_layer(self) -> int:
        """Weights of one decoder layer: q, k, v, o projections, the 3 SwiGLU matrices, 2 norms."""
        q = self.hidden * self.num_heads * self.head_dim
        kv = 2 * self.hidden * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        bias = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.qkv_bias else 0
        return q + kv + o + mlp + bias + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the output head (once if tied) plus the final norm."""
        heads = 1 if self.tie_embeddings else 2
        return heads * self.vocab * self.hidden + self.hidden

    @property
    def num_params(self) -> int:
        return self.num_layers * self.params_per_layer + self.embedding_params

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, row: dict) -> "ModelSpec":
        return cls(**row)

    @classmethod
    def from_hf_config(cls, path: str | os.PathLike, *, name: str | None = None) -> "ModelSpec":
        """Reads a Hugging Face `config.json` of a llama, mistral or qwen2 model.

        Raises:
            CpplanError: the file is unreadable, of another model type, or lacks a field.
        """
        path = Path(path)
        try:
            cfg = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise CpplanError(f"cannot read model config {str(path)!r}: {err}") from None
        model_type = cfg.get("model_type")
        if model_type not in HF_MODEL_TYPES:
            raise CpplanError(f"{str(path)!r}: model_type={model_type!r} is not supported; "
                              f"cpplan reads {', '.join(HF_MODEL_TYPES)} configs.")
        required = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
        missing = [k for k in required if k not in cfg]
        if missing:
            raise CpplanError(f"{str(path)!r}: missing {', '.join(missing)}; a {model_type} config needs {', '.join(required)}.")
        heads = cfg["num_attention_heads"]
        return cls(
            name=name or cfg.get("_name_or_path") or path.parent.name or model_type,
            num_layers=cfg["num_hidden_layers"],
            hidden=cfg["hidden_size"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate=cfg["intermediate_size"],
            vocab=cfg["vocab_size"],
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
        )


# Shapes from the models' published config.json files (meta-llama on Hugging Face).
MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    ModelSpec("llama3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    ModelSpec("llama3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256),
    ModelSpec("llama3.1-405b", 126, 16384, 128, 8, 128, 53248, 128256),
    ModelSpec("llama2-7b", 32, 4096, 32, 32, 128, 11008, 32000),
    ModelSpec("llama2-70b", 80, 8192, 64, 8, 128, 28672, 32000),
    # small configs for tests and CPU runs; byte-level vocabulary
    ModelSpec("tiny", 2, 64, 4, 2, 16, 128, 256),
    ModelSpec("tiny-mha", 2, 64, 4, 4, 16, 128, 256),
    ModelSpec("small", 4, 256, 8, 4, 32, 512, 256),
)}


def get_model(model: "str | ModelSpec | os.PathLike") -> ModelSpec:
    """A model by name, a ModelSpec unchanged, or a path to a Hugging Face config.json.

    Raises:
        CpplanError: unknown name (listing the known ones and the closest) or an unreadable config.
    """
    if isinstance(model, ModelSpec):
        return model
    text = os.fspath(model)
    if text in MODELS:
        return MODELS[text]
    path = Path(text)
    if path.suffix == ".json" or path.is_file() or path.is_dir():
        return ModelSpec.from_hf_config(path / "config.json" if path.is_dir() else path)
    raise unknown_name("model", text, MODELS)
