"""Hugging Face checkpoints in and out of cpplan's runtime. `cpplan run --init-from DIR` reads a llama,
mistral, qwen2 or gemma3_text checkpoint (config.json and its safetensors, one file or sharded under an
index) with the safetensors library's numpy API, checks every tensor against the plan's model, and lays
each one straight onto the plan's mesh: every device reads only its own shard
(`jax.make_array_from_callback`), so no device ever holds a whole replicated copy. `--export-hf DIR`
writes the trained weights back as safetensors with a config.json that transformers loads. Checking a
checkpoint reads its headers only, without jax.

Hugging Face keeps a linear layer's weight as `[out, in]`; the runtime keeps `[in, out]`, with the heads
split out and each layer's weights stacked on a leading layer axis (`nn.scan`):

| Hugging Face tensor (layer i)                  | runtime parameter        | layout                          |
|------------------------------------------------|--------------------------|---------------------------------|
| model.embed_tokens.weight `[vocab, hidden]`    | embed                    | as is                           |
| lm_head.weight `[vocab, hidden]`               | head `[hidden, vocab]`   | transposed; absent when tied    |
| model.norm.weight                              | final_norm               | as is                           |
| model.layers.i.input_layernorm.weight          | layers/attn_norm[i]      | as is                           |
| model.layers.i.post_attention_layernorm.weight | layers/mlp_norm[i]       | as is (gemma3: post_attn_norm)  |
| model.layers.i.pre_feedforward_layernorm.weight (gemma3) | layers/mlp_norm[i] | as is                   |
| model.layers.i.post_feedforward_layernorm.weight (gemma3) | layers/post_mlp_norm[i] | as is              |
| …self_attn.{q,k}_norm.weight `[hd]` (gemma3)   | layers/{q,k}_norm[i]     | as is                           |
| …self_attn.{q,k,v}_proj.weight `[heads·hd, hidden]` | layers/w{q,k,v}[i] `[hidden, heads, hd]` | split, transposed |
| …self_attn.{q,k,v}_proj.bias `[heads·hd]` (qwen2) | layers/b{q,k,v}[i] `[heads, hd]` | split          |
| …self_attn.o_proj.weight `[hidden, heads·hd]`  | layers/wo[i] `[heads, hd, hidden]` | split, transposed     |
| …mlp.gate_proj / up_proj.weight `[inter, hidden]` | layers/w_gate, w_up[i] `[hidden, inter]` | transposed   |
| …mlp.down_proj.weight `[hidden, inter]`        | layers/w_down[i] `[inter, hidden]` | transposed            |

q and k need no permutation: these checkpoints are laid out for rotate-half RoPE, the runtime's
(`runtime.rope`). The config's `rope_theta` and `rope_scaling` and its `rms_norm_eps` become the run's
`runtime.model.ModelConstants`; a Gemma 3 config's also its local layers' RoPE and its query scale.
Gemma 3's norm weights are stored as the runtime holds them: w of the (1 + w) scale.
"""

from __future__ import annotations

import json
import math
import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cost_models.errors import CpplanError
from cost_models.models import HF_ACTIVATIONS, DecoderBlock, ModelSpec
from cost_models.targets import Target, model_refusal

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
# the model types whose tensors are mapped, and the transformers class each loads as
FAMILIES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
# the families whose `attention_bias` also puts a bias on the out projection, which the runtime has not
HF_OUT_BIAS_TYPES = ("llama",)
GEMMA3 = "gemma3_text"
# Gemma 3's multimodal checkpoints, whose decoder's tensors are named under the language model's
GEMMA3_MULTIMODAL = "gemma3"
# Gemma3TextConfig's query scale where a config names none (transformers configuration_gemma3.py)
GEMMA3_QUERY_PRE_ATTN_SCALAR = 256
# fields of a Gemma 3 config that change the model's arithmetic in ways the runtime does not run, when set
GEMMA3_UNRUN = ("final_logit_softcapping", "attn_logit_softcapping", "use_bidirectional_attention", "attention_bias")
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
# tensors a checkpoint may carry that hold no weight (older llama exports keep RoPE's frequencies)
NOT_WEIGHTS = ".rotary_emb.inv_freq"
HF_DEFAULT_NORM_EPS = 1e-6  # transformers' LlamaConfig and MistralConfig, where a config names none
MAX_SHARD_BYTES = 4 << 30  # an exported file holds at most this much (a tensor larger than it, alone)
MAX_JSON_BYTES = 64 << 20


@dataclass(frozen=True)
class Tensor:
    """One runtime parameter as a Hugging Face checkpoint stores it: the stored shape's dimensions split
    into `split` (row-major), then laid out in the runtime's order (runtime dimension i is split dimension
    `order[i]`); a stacked parameter (`layers` > 0) holds one stored tensor per layer, `name` then carrying
    `{}` for the layer index."""

    path: tuple[str, ...]  # under the parameters' "params"
    name: str
    stored: tuple[int, ...]
    split: tuple[int, ...]
    order: tuple[int, ...]
    dims: str  # what the stored dimensions are, for errors
    layers: int = 0

    @property
    def shape(self) -> tuple[int, ...]:
        """The runtime parameter's shape (the layer axis first where stacked)."""
        per_layer = tuple(self.split[o] for o in self.order)
        return (self.layers, *per_layer) if self.layers else per_layer

    @property
    def names(self) -> list[str]:
        """The stored tensors' names, a stacked parameter's in layer order."""
        return [self.name.format(i) for i in range(self.layers)] if self.layers else [self.name]

    def to_stored(self, array: np.ndarray) -> np.ndarray:
        """One layer's (or an unstacked parameter's) runtime array as Hugging Face stores it."""
        return np.ascontiguousarray(array.transpose(np.argsort(self.order)).reshape(self.stored))

    def read(self, slices: dict, index: tuple) -> np.ndarray:
        """The block `index` (slices of `shape`) of the runtime parameter, read from `slices` (name →
        safetensors slice) without reading the rest of any stored tensor."""
        if not self.layers:
            return self._read_layer(slices[self.name], index)
        layers = range(*index[0].indices(self.layers))
        return np.stack([self._read_layer(slices[self.name.format(i)], index[1:]) for i in layers])

    def _read_layer(self, stored, index: tuple) -> np.ndarray:
        """`index` of one layer's runtime array, from its stored tensor's slice `stored`: each stored
        dimension is read over the span of its outermost split dimension, then cut to the inner ones."""
        wanted = [slice(None)] * len(self.split)
        for i, o in enumerate(self.order):
            wanted[o] = index[i]
        spans, shape, inner = [], [], []
        for group in _groups(self.stored, self.split):
            start, stop, _ = wanted[group[0]].indices(self.split[group[0]])
            size = math.prod(self.split[g] for g in group[1:])
            spans.append(slice(start * size, stop * size))
            shape += [stop - start, *(self.split[g] for g in group[1:])]
            inner += [slice(None), *(wanted[g] for g in group[1:])]
        block = np.asarray(stored[tuple(spans)]).reshape(shape)[tuple(inner)]
        return block.transpose(self.order)


def _groups(stored: tuple[int, ...], split: tuple[int, ...]) -> list[list[int]]:
    """The split dimensions of each stored dimension, in order."""
    groups, at = [], 0
    for size in stored:
        group = [at]
        while math.prod(split[g] for g in group) < size:
            at += 1
            group.append(at)
        groups.append(group)
        at += 1
    return groups


# each layer's norms over the residual stream: the runtime's name and Hugging Face's, by block
LLAMA_NORMS = (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm"))
GEMMA3_NORMS = (
    ("attn_norm", "input_layernorm"),
    ("post_attn_norm", "post_attention_layernorm"),
    ("mlp_norm", "pre_feedforward_layernorm"),
    ("post_mlp_norm", "post_feedforward_layernorm"),
)


def layout(model: ModelSpec) -> list[Tensor]:
    """The runtime's parameters of a dense sequential `model` with a gated MLP, each as Hugging Face's
    llama, mistral, qwen2 and gemma3_text checkpoints store it (q, k, v's biases where `qkv_bias`: qwen2's;
    four norms a layer and q/k norms in Gemma 3's block)."""
    d, h, kv, hd, f, v, n = (
        model.hidden,
        model.num_heads,
        model.num_kv_heads,
        model.head_dim,
        model.intermediate,
        model.vocab,
        model.num_layers,
    )
    layer = "model.layers.{}."
    norms = GEMMA3_NORMS if model.decoder_block is DecoderBlock.GEMMA3 else LLAMA_NORMS
    tensors = [
        Tensor(("embed",), "model.embed_tokens.weight", (v, d), (v, d), (0, 1), "vocab, hidden"),
        Tensor(("final_norm",), "model.norm.weight", (d,), (d,), (0,), "hidden"),
        *(Tensor(("layers", ours), f"{layer}{theirs}.weight", (d,), (d,), (0,), "hidden", n) for ours, theirs in norms),
    ]
    if model.qk_norm:
        for name in ("q", "k"):
            stored = f"{layer}self_attn.{name}_norm.weight"
            tensors.append(Tensor(("layers", f"{name}_norm"), stored, (hd,), (hd,), (0,), "head_dim", n))
    for name, heads, what in (("q", h, "num_heads"), ("k", kv, "num_kv_heads"), ("v", kv, "num_kv_heads")):
        stored = f"{layer}self_attn.{name}_proj.weight"
        dims = f"{what} × head_dim, hidden"
        tensors.append(Tensor(("layers", f"w{name}"), stored, (heads * hd, d), (heads, hd, d), (2, 0, 1), dims, n))
        if model.qkv_bias:
            bias = f"{layer}self_attn.{name}_proj.bias"
            tensors.append(
                Tensor(("layers", f"b{name}"), bias, (heads * hd,), (heads, hd), (0, 1), f"{what} × head_dim", n)
            )
    tensors += [
        Tensor(
            ("layers", "wo"),
            layer + "self_attn.o_proj.weight",
            (d, h * hd),
            (d, h, hd),
            (1, 2, 0),
            "hidden, num_heads × head_dim",
            n,
        ),
        Tensor(("layers", "w_gate"), layer + "mlp.gate_proj.weight", (f, d), (f, d), (1, 0), "intermediate, hidden", n),
        Tensor(("layers", "w_up"), layer + "mlp.up_proj.weight", (f, d), (f, d), (1, 0), "intermediate, hidden", n),
        Tensor(("layers", "w_down"), layer + "mlp.down_proj.weight", (d, f), (d, f), (1, 0), "hidden, intermediate", n),
    ]
    if not model.tie_embeddings:
        tensors.append(Tensor(("head",), "lm_head.weight", (v, d), (v, d), (1, 0), "vocab, hidden"))
    return tensors


# the ModelSpec fields beyond the tensors' shapes that must agree for a checkpoint to run as it was trained
ARCHITECTURE_FIELDS = ("tie_embeddings", "mlp_activations", "decoder_block", "window", "local_kind", "layer_pattern")


def mapping_problem(model: ModelSpec) -> str | None:
    """Why `model`'s parameters have no Hugging Face llama, mistral, qwen2 or gemma3_text layout (None: they
    have)."""
    gemma = model.decoder_block is DecoderBlock.GEMMA3
    if model.experts is not None or model.latent is not None or model.global_attention is not None:
        return "its layers are not dense grouped-query ones (experts, latent attention or global heads)"
    if model.attention_sinks or model.shared_kv or (model.qk_norm and not gemma) or (model.qkv_bias and gemma):
        return "its attention has sinks, shared keys and values, q/k norms outside Gemma 3's block, or biases in it"
    if model.decoder_block.parallel:
        return "its layers are parallel blocks (one norm), not Llama's sequential ones"
    if not model.gated or model.mlp_activations[1] != "linear" or model.mlp_activations[0] not in HF_NAMES:
        return f"its MLP ({' · '.join(model.mlp_activations)}) is not Llama's gated act(x·W_gate) · x·W_up"
    mixed = "L" in model.layer_pattern and "G" in model.layer_pattern
    if mixed and not gemma or model.local_kind != "sliding_window":
        return (
            "its layers mix local and global attention outside Gemma 3's block, or see chunks (Mistral's are all "
            "one sliding window)"
        )
    return None


# the Hugging Face name of each MLP activation a Llama MLP can hold (the first that `HF_ACTIVATIONS` reads as it)
HF_NAMES = {ours: theirs for theirs, ours in reversed(HF_ACTIVATIONS.items())}


class HFCheckpoint:
    """A Hugging Face checkpoint directory: its config and where each tensor lies, from the headers.

    Raises:
        CpplanError: no readable config.json or safetensors, a model type whose tensors are not mapped
            (naming what the runtime lacks), or an index naming files that are not there.
    """

    def __init__(self, directory: "str | os.PathLike"):
        self.directory = Path(directory)
        self.flag = f"--init-from {str(self.directory)!r}"
        config_path = self.directory / CONFIG_FILE
        if not config_path.is_file():
            raise CpplanError(
                f"{self.flag}: no {CONFIG_FILE} there; give a Hugging Face checkpoint directory (config.json with "
                f"model.safetensors, or shards and {INDEX_FILE})."
            )
        self.config = _read_json(config_path, self.flag)
        self.config_path = config_path
        self._check_family()
        self.files = self._files()

    def _check_family(self) -> None:
        model_type = self.config.get("model_type")
        if model_type == GEMMA3_MULTIMODAL:
            raise CpplanError(
                f"{self.flag}: model_type {model_type!r}: a multimodal Gemma 3 checkpoint keeps its decoder under "
                f"the language model's names beside a vision tower; --init-from reads the text-only model "
                f"(model_type {GEMMA3!r}, Gemma3ForCausalLM: google/gemma-3-1b, or one saved from the decoder alone)."
            )
        if model_type == GEMMA3:
            unrun = [f"{key}={self.config[key]!r}" for key in GEMMA3_UNRUN if self.config.get(key)]
            if unrun:
                raise CpplanError(
                    f"{self.flag}: model_type {model_type!r} with {', '.join(unrun)}: cpplan's runtime runs Gemma 3 "
                    f"without logit soft-capping, with causal attention and without biases; plan it for MaxText "
                    f"(`--target maxtext`) and run it there."
                )
        spec = self.spec()
        refusal = model_refusal(Target.CPPLAN, spec)
        if refusal:  # qwen3's q/k norms, …
            raise CpplanError(f"{self.flag}: model_type {model_type!r}: {refusal}")
        if model_type not in FAMILIES:
            raise CpplanError(
                f"{self.flag}: model_type {model_type!r}: its tensors are not mapped to the runtime's; --init-from "
                f"reads {', '.join(FAMILIES)} checkpoints."
            )
        if self.config.get("mlp_bias"):
            raise CpplanError(
                f"{self.flag}: mlp_bias is true: cpplan's runtime has no biases on the MLP's projections."
            )
        if model_type in HF_OUT_BIAS_TYPES and self.config.get("attention_bias"):
            raise CpplanError(
                f"{self.flag}: attention_bias is true: a {model_type} checkpoint then has a bias on the attention's "
                f"out projection too, and cpplan's runtime has biases on q, k and v only (qwen2's)."
            )

    def spec(self) -> ModelSpec:
        """The model the config describes (`ModelSpec.from_hf_config`)."""
        try:
            return ModelSpec.from_hf_config(self.config_path)
        except CpplanError as err:
            raise CpplanError(f"{self.flag}: {err}") from None

    def _files(self) -> dict[str, Path]:
        """Each tensor's file: from the index where there is one, else from every safetensors file's header."""
        safe_open = _safetensors().safe_open

        index = self.directory / INDEX_FILE
        if index.is_file():
            weight_map = _read_json(index, self.flag).get("weight_map")
            if not isinstance(weight_map, dict):
                raise CpplanError(f"{self.flag}: {INDEX_FILE} has no weight_map object; re-save the checkpoint.")
            files = {name: self.directory / file for name, file in weight_map.items()}
            missing = sorted({str(p.name) for p in files.values() if not p.is_file()})
            if missing:
                raise CpplanError(
                    f"{self.flag}: {INDEX_FILE} names files that are not there: {', '.join(missing[:3])}; download "
                    f"every shard."
                )
            return files
        paths = sorted(self.directory.glob("*.safetensors"))
        if not paths:
            raise CpplanError(
                f"{self.flag}: no *.safetensors file there; cpplan reads safetensors checkpoints (convert a "
                f"pytorch_model.bin with transformers' save_pretrained(..., safe_serialization=True))."
            )
        files = {}
        for path in paths:
            with safe_open(path, framework="numpy") as handle:
                files.update(dict.fromkeys(handle.keys(), path))
        return files

    def headers(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Each tensor's `(shape, dtype)` as its file's header gives it (no data read)."""
        safe_open = _safetensors().safe_open

        found = {}
        for path in sorted(set(self.files.values())):
            with safe_open(path, framework="numpy") as handle:
                for name in handle.keys():
                    if self.files.get(name) == path:
                        stored = handle.get_slice(name)
                        found[name] = (tuple(stored.get_shape()), stored.get_dtype())
        return found

    def check(self, model: ModelSpec, seq_len: int) -> None:
        """Refuses a checkpoint that does not hold `model`'s weights (as the plan runs it over `seq_len`):
        a missing, misshapen, non-float or unplaced tensor, or an architecture that differs.

        Raises:
            CpplanError: naming the tensor (or field), what the plan's model expects, what was found, and
                the fix.
        """
        fix = f"plan the model from the checkpoint's own config (--model {self.config_path})"
        problem = mapping_problem(model)
        if problem:
            raise CpplanError(f"{self.flag}: the plan's model {model.name!r} cannot take these weights: {problem}.")
        found = self.headers()
        expected = {name: tensor for tensor in layout(model) for name in tensor.names}
        missing = [name for name in expected if name not in found]
        if missing:
            tied = " (the checkpoint ties its head to the embedding)" if missing == ["lm_head.weight"] else ""
            raise CpplanError(
                f"{self.flag}: the checkpoint lacks {len(missing)} tensor(s) the plan's model {model.name!r} "
                f"has, e.g. {', '.join(missing[:3])}{tied}; {fix}."
            )
        for name, tensor in expected.items():
            shape, dtype = found[name]
            where = f"tensor {name!r} ({self.files[name].name})"
            if shape != tensor.stored:
                raise CpplanError(
                    f"{self.flag}: {where} is {list(shape)}; the plan's model {model.name!r} expects "
                    f"{list(tensor.stored)} ({tensor.dims}); {fix}."
                )
            if dtype not in FLOAT_DTYPES:
                raise CpplanError(
                    f"{self.flag}: {where} is {dtype}; cpplan reads floating-point weights "
                    f"({', '.join(FLOAT_DTYPES)}): dequantize the checkpoint first."
                )
        ignored = ("lm_head.weight",) if model.tie_embeddings else ()  # a tied head saved anyway is the embedding
        extra = [n for n in found if n not in expected and n not in ignored and not n.endswith(NOT_WEIGHTS)]
        if extra:
            raise CpplanError(
                f"{self.flag}: the checkpoint holds {len(extra)} tensor(s) the runtime's model has no place for, "
                f"e.g. {', '.join(sorted(extra)[:3])}: cpplan's runtime has no adapters or other extra weights, "
                f"and biases on q, k and v only (qwen2's); load the plain model."
            )
        spec = self.spec()
        ours, theirs = model, spec.within(seq_len)[0]
        if spec.decoder_block is DecoderBlock.GEMMA3 and spec.window and not theirs.window:
            raise CpplanError(
                f"{self.flag}: the checkpoint's local layers turn RoPE at a base of their own, and over {seq_len} "
                f"tokens, no more than their window of {spec.window}, the runtime runs every layer as a global one; "
                f"plan a sequence longer than the window."
            )
        differ = [f for f in ARCHITECTURE_FIELDS if getattr(ours, f) != getattr(theirs, f)]
        if differ:
            said = ", ".join(f"{f}={getattr(ours, f)!r} where its config has {getattr(theirs, f)!r}" for f in differ)
            raise CpplanError(f"{self.flag}: the plan's model {model.name!r} has {said}; {fix}.")

    def rope(self, rope_theta: float | None = None):
        """The config's `runtime.rope.Rope` (a Gemma 3 config's: its global layers'), its base replaced by
        `rope_theta` where given.

        Raises:
            CpplanError: a RoPE the runtime does not run (`Rope.from_hf_config`).
        """
        return self._ropes(rope_theta)[0]

    def _ropes(self, rope_theta: float | None):
        """`(global, local)` RoPEs: a Gemma 3 config's per layer type (`Rope.per_layer_type`), else the
        config's one RoPE and None."""
        from runtime.rope import Rope

        where = str(self.config_path)
        if self.config.get("model_type") == GEMMA3:
            return Rope.per_layer_type(self.config, where=where, theta=rope_theta)
        return Rope.from_hf_config(self.config, where=where, theta=rope_theta), None

    def constants(self, rope_theta: float | None = None):
        """The run's `runtime.model.ModelConstants`: the config's RoPE (`rope`; a Gemma 3 config's local
        layers' too), RMSNorm epsilon, and a Gemma 3 config's query scale."""
        from runtime.model import ModelConstants

        eps = self.config.get("rms_norm_eps", HF_DEFAULT_NORM_EPS)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise CpplanError(f"{self.flag}: rms_norm_eps={eps!r} must be a number between 0 and 1; fix the config.")
        rope, local = self._ropes(rope_theta)
        scalar = None
        if self.config.get("model_type") == GEMMA3:
            scalar = self.config.get("query_pre_attn_scalar", GEMMA3_QUERY_PRE_ATTN_SCALAR)
            if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or not scalar > 0:
                raise CpplanError(
                    f"{self.flag}: query_pre_attn_scalar={scalar!r} must be a positive number; fix the config."
                )
            scalar = float(scalar)
        return ModelConstants(rope=rope, norm_eps=float(eps), local_rope=local, query_pre_attn_scalar=scalar)

    def load(self, trainer):
        """The checkpoint's weights as `trainer`'s parameters, each device reading only its own shard, in
        the plan's parameter dtype. Call `check` first."""
        import jax

        safe_open = _safetensors().safe_open

        tensors = {tensor.path: tensor for tensor in layout(trainer.plan.model)}
        leaves, tree = jax.tree_util.tree_flatten_with_path(trainer.abstract_params)
        with ExitStack() as files:
            handles = {
                path: files.enter_context(safe_open(path, framework="numpy")) for path in set(self.files.values())
            }
            slices = _LazySlices(self.files, handles)
            arrays = []
            for keys, leaf in leaves:
                tensor = tensors[tuple(key.key for key in keys[1:])]  # below "params"

                def shard(index, tensor=tensor, dtype=leaf.dtype):
                    return tensor.read(slices, index).astype(dtype)

                arrays.append(jax.make_array_from_callback(leaf.shape, leaf.sharding, shard))
        return jax.tree_util.tree_unflatten(tree, arrays)


class _LazySlices:
    """name → the safetensors slice of that tensor (its header only; data is read when sliced)."""

    def __init__(self, files: dict[str, Path], handles: dict):
        self.files, self.handles = files, handles

    def __getitem__(self, name: str):
        return self.handles[self.files[name]].get_slice(name)


def _safetensors():
    """The safetensors library (its numpy API imported), or a CpplanError saying how to install it."""
    try:
        import safetensors
        import safetensors.numpy  # noqa: F401  (the numpy API, as an attribute of the package)
    except ImportError as err:
        raise CpplanError(
            f"Hugging Face checkpoints need the safetensors library ({err}); install the runtime extra: "
            f"pip install -e '.[runtime]'."
        ) from None
    return safetensors


def _read_json(path: Path, flag: str) -> dict:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_JSON_BYTES + 1)
        if len(data) > MAX_JSON_BYTES:
            raise CpplanError(f"{flag}: {path.name} is over {MAX_JSON_BYTES >> 20} MiB: not a checkpoint's JSON.")
        value = json.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        if isinstance(err, CpplanError):
            raise
        raise CpplanError(f"{flag}: cannot read {path.name} ({err}).") from None
    if not isinstance(value, dict):
        raise CpplanError(f"{flag}: {path.name} holds a JSON {type(value).__name__}, not an object.")
    return value


def check_export(model: ModelSpec, directory: "str | os.PathLike", init_from: "str | os.PathLike | None") -> None:
    """Refuses, before any work, an `--export-hf` directory that cannot be written or a model that has no
    Hugging Face llama, mistral or qwen2 form.

    Raises:
        CpplanError: naming the directory or the model, and the fix.
    """
    flag = f"--export-hf {str(directory)!r}"
    problem = mapping_problem(model)
    if problem:
        raise CpplanError(f"{flag}: model {model.name!r} has no Hugging Face llama, mistral or qwen2 form: {problem}.")
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise CpplanError(f"{flag} is a file; give a directory (it is created when missing).")
    if init_from is not None and path.exists() and path.resolve() == Path(init_from).resolve():
        raise CpplanError(f"{flag} is the --init-from directory; export into another one (its files are read).")
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CpplanError(f"{flag}: {str(existing)!r} is not writable; give a directory this process can write.")


def hf_config(plan, constants, *, dtype: str, source: dict | None = None) -> dict:
    """The config.json of `plan`'s model as transformers reads it: the `source` checkpoint's config with
    the run's RoPE base and dtype; or, without one, a llama config (mistral where every layer sees a
    sliding window; qwen2 where q, k and v have biases) built from the model and `constants`."""
    m = plan.model
    if source is not None:
        config = dict(source)
        params = config.get("rope_parameters")
        if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):  # per layer type: Gemma 3's
            global_params = {**params["full_attention"], "rope_theta": constants.rope.theta}
            config["rope_parameters"] = {**params, "full_attention": global_params}
        elif isinstance(params, dict) and "rope_theta" in params:
            config["rope_parameters"] = {**params, "rope_theta": constants.rope.theta}
        else:
            config["rope_theta"] = constants.rope.theta
        config.update(torch_dtype=dtype, dtype=dtype)
        return config
    scaled = [r.scaling for r in (constants.rope, constants.local_rope) if r is not None and r.scaling != "default"]
    if scaled:
        raise CpplanError(
            f"--export-hf: RoPE {scaled[0]} scaling comes from a checkpoint's config, and this run has "
            f"none to write it from; export a run started with --init-from."
        )
    if m.decoder_block is DecoderBlock.GEMMA3:
        return _gemma3_config(plan, constants, dtype)
    family = "qwen2" if m.qkv_bias else "mistral" if m.window else "llama"
    config = {
        "architectures": [FAMILIES[family]],
        "model_type": family,
        **_shape_config(m),
        "hidden_act": HF_NAMES[m.mlp_activations[0]],
        "tie_word_embeddings": m.tie_embeddings,
        "rms_norm_eps": constants.norm_eps,
        "rope_theta": constants.rope.theta,
        "max_position_embeddings": plan.seq_len,
        "attention_bias": False,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    if family == "llama":
        config["mlp_bias"] = False
    elif family == "mistral":
        config["sliding_window"] = m.window
    else:  # qwen2's q, k and v always have biases; its window is opted into, here on every layer
        del config["attention_bias"]
        config["use_sliding_window"] = bool(m.window)
        config["sliding_window"] = m.window or None
        config["max_window_layers"] = 0
        kind = "sliding_attention" if m.window else "full_attention"
        config["layer_types"] = [kind] * m.num_layers
    return config


def _shape_config(m) -> dict:
    """The config.json fields of the model's shape, as every family writes them."""
    return {
        "num_hidden_layers": m.num_layers,
        "hidden_size": m.hidden,
        "num_attention_heads": m.num_heads,
        "num_key_value_heads": m.num_kv_heads,
        "head_dim": m.head_dim,
        "intermediate_size": m.intermediate,
        "vocab_size": m.vocab,
    }


def _gemma3_config(plan, constants, dtype: str) -> dict:
    """A gemma3_text config.json of `plan`'s model (Gemma 3's block) and the run's `constants`: its layer types
    from the model's pattern, each type's RoPE base, the query scale."""
    m = plan.model
    local = constants.local_rope or constants.rope
    scalar = constants.query_pre_attn_scalar or m.head_dim
    return {
        "architectures": [FAMILIES[GEMMA3]],
        "model_type": GEMMA3,
        **_shape_config(m),
        "hidden_activation": HF_NAMES[m.mlp_activations[0]],
        "tie_word_embeddings": m.tie_embeddings,
        "rms_norm_eps": constants.norm_eps,
        "query_pre_attn_scalar": int(scalar) if float(scalar).is_integer() else scalar,  # transformers' is an int
        "sliding_window": m.window or None,
        "layer_types": [
            "sliding_attention" if m.layer_type(i) == "L" else "full_attention" for i in range(m.num_layers)
        ],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": constants.rope.theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": local.theta},
        },
        "max_position_embeddings": plan.seq_len,
        "attention_bias": False,
        "torch_dtype": dtype,
        "dtype": dtype,
    }


def export(params, trainer, directory: "str | os.PathLike", *, source: dict | None = None) -> list[Path]:
    """Writes `params` (`trainer`'s, on its mesh) to `directory` as Hugging Face safetensors in the plan's
    parameter dtype (files of at most `MAX_SHARD_BYTES`, with an index where several) and a config.json
    (`hf_config`). Every process takes part in gathering each tensor; process 0 alone writes.

    Returns:
        The files written (none on other processes).
    """
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    save_file = _safetensors().numpy.save_file

    def host(array) -> np.ndarray:
        return multihost_utils.process_allgather(array, tiled=True) if jax.process_count() > 1 else np.asarray(array)

    plan = trainer.plan
    tensors = layout(plan.model)
    itemsize = jnp.dtype(plan.param_dtype).itemsize
    shards, size = [[]], 0
    for tensor in tensors:  # tensors in files, in order, a file closed when the next would pass the limit
        for name in tensor.names:
            nbytes = math.prod(tensor.stored) * itemsize
            if shards[-1] and size + nbytes > MAX_SHARD_BYTES:
                shards.append([])
                size = 0
            shards[-1].append(name)
            size += nbytes
    files = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    )
    file_of = {name: files[k] for k, names in enumerate(shards) for name in names}
    leader = jax.process_index() == 0
    out = Path(directory)
    if leader:
        out.mkdir(parents=True, exist_ok=True)
    pending, written = {}, []
    by_path = {tuple(k.key for k in keys[1:]): leaf for keys, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
    for tensor in tensors:
        array = host(by_path[tensor.path])
        layers = list(array) if tensor.layers else [array]
        for name, layer in zip(tensor.names, layers):
            pending.setdefault(file_of[name], {})[name] = tensor.to_stored(layer)
        for file in [f for f in pending if all(n in pending[f] for n in shards[files.index(f)])]:
            if leader:  # a file is written as soon as it is whole, so the host holds one file's tensors at most
                save_file(pending[file], out / file, metadata={"format": "pt"})
                written.append(out / file)
            del pending[file]
    if not leader:
        return []
    if len(files) > 1:
        total = sum(math.prod(t.stored) * itemsize * max(t.layers, 1) for t in tensors)
        index = {"metadata": {"total_size": total}, "weight_map": file_of}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        written.append(out / INDEX_FILE)
    dtype = jnp.dtype(plan.param_dtype).name
    config = hf_config(plan, trainer.constants, dtype=dtype, source=source)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return [*written, out / CONFIG_FILE]


def run_constants(init_from: "str | os.PathLike | None", rope_theta: float | None):
    """A run's `runtime.model.ModelConstants`: the `init_from` checkpoint's (None: Llama 3's), its RoPE
    base replaced by `rope_theta` where given."""
    if init_from is not None:
        return HFCheckpoint(init_from).constants(rope_theta)
    from runtime.model import ModelConstants
    from runtime.rope import Rope

    return ModelConstants() if rope_theta is None else ModelConstants(rope=Rope(theta=rope_theta))


def run_hooks(trainer, *, init_from, export_hf, say):
    """`(initial, trained)` for `runtime.loop.train`: reading the weights from the `init_from` checkpoint
    and writing them to `export_hf` after the last step (each None where its directory is)."""
    initial = trained = None
    checkpoint = None if init_from is None else HFCheckpoint(init_from)
    if checkpoint is not None:

        def initial():
            say(f"weights from {checkpoint.directory} (RoPE {trainer.constants.rope.describe()})")
            return checkpoint.load(trainer)

    if export_hf is not None:

        def trained(params):
            files = export(params, trainer, export_hf, source=None if checkpoint is None else checkpoint.config)
            say(f"exported the weights for transformers to {export_hf} ({len(files)} files)")

    return initial, trained
