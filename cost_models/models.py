"""Model shapes: Llama-style decoders by name, or read from a Hugging Face `config.json`.

The MLP is MaxText's `MlpBlock` (gated with two activations, plain with one); the decoder block is
MaxText's `llama2` (sequential, two norms) or `default` (parallel, one norm); the attention mask is causal
or full (`causal=False`; `is_causal: false` in a config), and local layers may see only a sliding window
or a chunk of it (`window`, `layer_pattern`). Sources: docs/provenance/cost_models.md#models.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from cost_models.documents import DocumentLengths
from cost_models.errors import CpplanError, from_fields, unknown_name
from cost_models.experts import Experts
from cost_models.global_attention import GlobalAttention
from cost_models.latent_attention import LatentAttention
from cost_models.masks import CAUSAL, FULL, AttentionMask, MaskKind
from cost_models.per_layer_inputs import PerLayerInputs
from cost_models.vocabulary import _Named

HF_MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen3_moe",
    "deepseek_v3",
    "gpt_oss",
    "gemma4",
    "gemma4_text",
    "gemma3_text",
)
# multimodal configs whose decoder is their `text_config`
HF_TEXT_CONFIG_TYPES = ("gemma4",)
# model types whose every layer norms its queries and keys per head, and that carry attention sinks
HF_QK_NORM_TYPES = ("qwen3", "qwen3_moe", "gemma4_text", "gemma3_text")
HF_SINK_TYPES = ("gpt_oss",)
# what a config of these model types has where it leaves the field out (Gemma3TextConfig's defaults,
# transformers 5.25 configuration_gemma3.py: five sliding-window layers to each global one, a tied head)
HF_CONFIG_DEFAULTS = {
    "gemma3_text": {"sliding_window_pattern": 6, "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh"}
}
# model types whose `sliding_window` applies only where `use_sliding_window` says so (off where unset)
HF_WINDOW_OPT_IN_TYPES = ("qwen2", "qwen3", "qwen3_moe")

# The MLP activations cpplan's runtime runs, by MaxText's names (`linears._convert_to_activation_function`:
# "linear" is the identity, any other name the flax.linen function of that name).
MLP_ACTIVATIONS = ("silu", "gelu", "relu", "sigmoid", "linear")
SWIGLU = ("silu", "linear")  # MaxText's default (base.yml) and every Llama's
MAX_MLP_INPUTS = 2  # one input projection per activation: gated (2) or plain (1)
# Hugging Face `hidden_act` → MaxText's name of the same function (flax's gelu is the tanh
# approximation, as are these two of Hugging Face's; its plain "gelu" is the exact erf form)
HF_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
    "sigmoid": "sigmoid",
    "gelu_pytorch_tanh": "gelu",
    "gelu_new": "gelu",
}


class DecoderBlock(_Named):
    """How a decoder layer joins attention and MLP (MaxText's `decoder_block`)."""

    LLAMA2 = "llama2"  # sequential: x + attn(norm(x)), then + mlp(norm(...)); two norms
    DEFAULT = "default"  # parallel: x + attn(norm(x)) + mlp(norm(x)); one norm
    # Gemma 3's sequential block: x + norm(attn(norm(x))), then + norm(mlp(norm(...))); four norms, each
    # scaling by (1 + w), q and k normed per head (the model's `qk_norm`), embeddings scaled by √hidden
    GEMMA3 = "gemma3"

    @classmethod
    def kind(cls) -> str:
        return "decoder block"

    @property
    def aliases(self):
        return {"LLAMA2": ("sequential",), "DEFAULT": ("parallel",), "GEMMA3": ()}[self.name]

    @property
    def parallel(self) -> bool:
        """Attention and MLP read the same normed input and their outputs are summed."""
        return self is DecoderBlock.DEFAULT

    @property
    def post_norms(self) -> bool:
        """Attention's and MLP's outputs are normed before the residual sum, so the backward reads them."""
        return self is DecoderBlock.GEMMA3

    @property
    def norms(self) -> int:
        """RMSNorms per layer over the residual stream's width, each with one scale of `hidden` weights."""
        return {DecoderBlock.DEFAULT: 1, DecoderBlock.LLAMA2: 2, DecoderBlock.GEMMA3: 4}[self]


# a config.json is a few KiB; and no model dimension comes near 2**31
MAX_CONFIG_BYTES = 16 << 20
MAX_CONFIG_INTEGER = 2**31


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: RMSNorm, RoPE, grouped-query attention, a gated (SwiGLU by default) or
    plain MLP (`mlp_activations`), in a sequential or parallel block (`decoder_block`), with a causal or
    full attention mask (`causal`); local layers (`layer_pattern` 'L', repeated over the layers; "" with
    a window: every layer) see only a sliding window of `window` tokens, or their `window`-token chunk.
    Gemma 4 E2B and E4B add per-layer input embeddings (`per_layer_inputs`) and last layers that reuse
    earlier layers' keys and values (`kv_shared_layers`), E2B's with an MLP twice as wide (`double_wide_mlp`)."""

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
    mlp_activations: tuple[str, ...] = SWIGLU
    decoder_block: DecoderBlock = DecoderBlock.LLAMA2
    causal: bool = True
    window: int = 0  # a local layer's window or chunk in tokens; 0: every layer attends globally
    local_kind: str = MaskKind.SLIDING.value  # or "chunked"
    layer_pattern: str = ""  # 'L' local, 'G' global, repeated over the layers
    # rows packed from documents, no query seeing another document: of this many tokens, aligned at its
    # multiples; or of varying lengths (`DocumentLengths`; marked by segment ids only); 0: unpacked rows
    documents: int | DocumentLengths = 0
    # a mixture-of-experts MLP (None: every layer's MLP is the dense one, `intermediate` wide)
    experts: Experts | None = None
    # multi-head latent attention's projections (None: grouped-query attention's q, k, v)
    latent: LatentAttention | None = None
    qk_norm: bool = False  # an RMSNorm over each head's queries and keys (Qwen3, Gemma 3 and 4)
    attention_sinks: bool = False  # a learned logit per head that every query's softmax also sees (GPT-OSS)
    shared_kv: bool = False  # keys and values are one projection (a Gemma 4 global layer's)
    # the global layers' own head shape where it differs from the local layers' (Gemma 4; None: the same)
    global_attention: GlobalAttention | None = None
    # a second token embedding gated into every layer (Gemma 4 E2B and E4B; None: none)
    per_layer_inputs: PerLayerInputs | None = None
    # the last this many layers project no keys and values: each attends over those of the last earlier layer
    # of its kind, local or global (Gemma 4 E2B and E4B's `num_kv_shared_layers`; 0: none)
    kv_shared_layers: int = 0
    double_wide_mlp: bool = False  # the KV-shared layers' MLP is twice `intermediate` wide (Gemma 4 E2B)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise CpplanError(f"model name {self.name!r} must be a non-empty string.")
        if not self.name.isprintable():
            # a name read from a file reaches terminals: control characters are shown escaped
            object.__setattr__(self, "name", self.name.encode("unicode_escape").decode("ascii"))
        for f in ("num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "intermediate", "vocab"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CpplanError(f"model {self.name!r}: {f}={value!r} must be a positive integer.")
        if self.num_heads % self.num_kv_heads:
            raise CpplanError(
                f"model {self.name!r}: num_heads={self.num_heads} must be a multiple of "
                f"num_kv_heads={self.num_kv_heads} (grouped-query attention)."
            )
        for f in ("tie_embeddings", "qkv_bias", "causal", "qk_norm", "attention_sinks", "shared_kv", "double_wide_mlp"):
            if not isinstance(getattr(self, f), bool):
                raise CpplanError(f"model {self.name!r}: {f}={getattr(self, f)!r} must be true or false.")
        object.__setattr__(self, "mlp_activations", _activations(self.name, self.mlp_activations))
        self._check_local_layers()
        if self.experts is not None:
            object.__setattr__(self, "experts", Experts.from_dict(self.experts))
            self.experts.check(self.name, self.num_layers)
        if self.global_attention is not None:
            object.__setattr__(self, "global_attention", GlobalAttention.from_dict(self.global_attention))
            self.global_attention.check(self.name, self.num_heads)
        if self.latent is not None:
            object.__setattr__(self, "latent", LatentAttention.from_dict(self.latent))
            self.latent.check(self.name, self.head_dim, self.num_heads, self.num_kv_heads)
        if self.per_layer_inputs is not None:
            object.__setattr__(self, "per_layer_inputs", PerLayerInputs.from_dict(self.per_layer_inputs))
            self.per_layer_inputs.check(self.name)
        self._check_kv_shared_layers()
        if not isinstance(self.decoder_block, str):
            raise CpplanError(
                f"model {self.name!r}: decoder_block={self.decoder_block!r} must be a name: "
                f"{', '.join(b.value for b in DecoderBlock)}."
            )
        try:
            object.__setattr__(self, "decoder_block", DecoderBlock.parse(self.decoder_block))
        except CpplanError as err:
            raise CpplanError(
                f"model {self.name!r}: {err} ({DecoderBlock.LLAMA2.value}: the sequential Llama "
                f"block; {DecoderBlock.DEFAULT.value}: MaxText's parallel block; {DecoderBlock.GEMMA3.value}: "
                f"Gemma 3's)"
            ) from None
        if self.decoder_block is DecoderBlock.GEMMA3 and not self.qk_norm:
            raise CpplanError(
                f"model {self.name!r}: decoder_block={DecoderBlock.GEMMA3.value} norms q and k per head: give "
                f"qk_norm=true, or the {DecoderBlock.LLAMA2.value} block."
            )

    def _check_local_layers(self) -> None:
        name, window, pattern = self.name, self.window, self.layer_pattern
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise CpplanError(
                f"model {name!r}: window={window!r} must be an integer of 0 or more: a local layer's tokens "
                f"(0: no local layers)."
            )
        if not isinstance(pattern, str) or set(pattern) - {"L", "G"}:
            raise CpplanError(
                f"model {name!r}: layer_pattern={pattern!r} must be a string of 'L' (local) and 'G' (global), "
                f"repeated over the layers, e.g. 'LLLLLG' for five local layers to each global one."
            )
        if self.local_kind not in (MaskKind.SLIDING, MaskKind.CHUNKED):
            raise CpplanError(
                f"model {name!r}: local_kind={self.local_kind!r} must be {MaskKind.SLIDING.value!r} or "
                f"{MaskKind.CHUNKED.value!r}."
            )
        if window and pattern and "L" not in pattern:
            raise CpplanError(f"model {name!r}: window={window} but layer_pattern={pattern!r} has no local layer.")
        if not window and "L" in pattern:
            raise CpplanError(f"model {name!r}: layer_pattern={pattern!r} has local layers: give their window.")
        if isinstance(self.documents, dict):  # the JSON form of varying lengths
            object.__setattr__(self, "documents", DocumentLengths.from_dict(self.documents))
        fixed = isinstance(self.documents, int) and not isinstance(self.documents, bool) and self.documents >= 0
        if not fixed and not isinstance(self.documents, DocumentLengths):
            raise CpplanError(
                f"model {name!r}: documents={self.documents!r} must be an integer of 0 or more: a document's tokens "
                f"(0: unpacked rows) "
                f"or document lengths (cost_models.documents: lognormal, histogram)."
            )
        if self.documents and not self.causal:
            raise CpplanError(
                f"model {name!r}: packed documents are priced as causal attention within each document; a full "
                f"(non-causal) mask with documents is not a mask cpplan prices or runs."
            )
        if window and not self.causal:
            raise CpplanError(
                f"model {name!r}: a local window looks back from each query, so it needs a causal mask; "
                f"a full (non-causal) mask with a window is not a mask cpplan prices or runs."
            )

    def _check_kv_shared_layers(self) -> None:
        name, shared = self.name, self.kv_shared_layers
        if isinstance(shared, bool) or not isinstance(shared, int) or not 0 <= shared < self.num_layers:
            raise CpplanError(
                f"model {name!r}: kv_shared_layers={shared!r} must be an integer from 0 to num_layers - 1 = "
                f"{self.num_layers - 1}: the last layers that reuse an earlier layer's keys and values."
            )
        if self.double_wide_mlp and not shared:
            raise CpplanError(
                f"model {name!r}: double_wide_mlp widens the MLP of the KV-shared layers, and kv_shared_layers=0; "
                f"give the shared layers' count, or double_wide_mlp=false."
            )
        mechanisms = [f for f in ("kv_shared_layers", "double_wide_mlp", "per_layer_inputs") if getattr(self, f)]
        others = [f for f in ("experts", "latent") if getattr(self, f) is not None]
        if mechanisms and others:
            raise CpplanError(
                f"model {name!r}: {', '.join(mechanisms)} with {', '.join(others)}: cpplan prices KV-shared layers, "
                f"their wide MLP and per-layer inputs in dense grouped-query models (Gemma 4 E2B and E4B) only."
            )
        first = self.first_kv_shared_layer
        for kind in ("L", "G"):
            if self._layers_of_kind(kind, first, self.num_layers) and not self._layers_of_kind(kind, 0, first):
                what = "local" if kind == "L" else "global"
                raise CpplanError(
                    f"model {name!r}: kv_shared_layers={shared} shares a {what} layer's keys and values, but no "
                    f"layer before layer {first} is {what}: a shared layer reuses the last earlier one of its kind."
                )

    def _layers_of_kind(self, kind: str, start: int, stop: int) -> int:
        """How many of layers `start` to `stop` - 1 are of `kind` ('L' local, 'G' global), counted from the
        repeating pattern (the layer count may be large)."""
        pattern = self.layer_pattern or ("L" if self.window else "G")

        def before(n: int) -> int:
            return n // len(pattern) * pattern.count(kind) + pattern[: n % len(pattern)].count(kind)

        return before(stop) - before(start)

    @property
    def first_kv_shared_layer(self) -> int:
        """The first layer (from 0) that reuses an earlier layer's keys and values; `num_layers` where none does."""
        return self.num_layers - self.kv_shared_layers

    def kv_shared_count(self, mask: AttentionMask) -> int:
        """The KV-shared layers whose mask is `mask`."""
        if not self.kv_shared_layers:
            return 0
        masks = {"L": self.local_mask, "G": self.global_mask}
        return sum(
            self._layers_of_kind(kind, self.first_kv_shared_layer, self.num_layers)
            for kind, kind_mask in masks.items()
            if kind_mask == mask
        )

    def kv_projecting_share(self, mask: AttentionMask) -> float:
        """Of the layers whose mask is `mask`, the share that project their own keys and values (1.0 for a
        model with no KV-shared layers)."""
        if not self.kv_shared_layers:
            return 1.0
        count = dict(self.layer_masks).get(mask, 0)
        return 1.0 - self.kv_shared_count(mask) / count if count else 1.0

    @property
    def fixed_documents(self) -> int:
        """The length of packed documents of one length, aligned at its multiples (0: none, or varying)."""
        return self.documents if isinstance(self.documents, int) else 0

    @property
    def varying_documents(self) -> DocumentLengths | None:
        """The lengths of packed documents that vary, marked by segment ids only (None: none, or fixed)."""
        return self.documents if isinstance(self.documents, DocumentLengths) else None

    def describe_documents(self) -> str:
        """The packed documents, as a phrase ("" for unpacked rows)."""
        if self.varying_documents:
            return self.varying_documents.describe()
        return f"documents of {self.documents} tokens" if self.documents else ""

    @property
    def global_mask(self) -> AttentionMask:
        """The mask of a global layer: causal, full for an encoder, causal within each packed document of
        a fixed length (documents of varying length leave the static mask causal)."""
        if self.fixed_documents:
            return AttentionMask(MaskKind.CHUNKED, self.fixed_documents)
        return CAUSAL if self.causal else FULL

    @property
    def local_mask(self) -> AttentionMask | None:
        """The mask of a local layer, or None where the model has none. Within packed documents a window
        longer than a document is the document; a shorter one is priced whole (an upper bound: it is cut at
        each document's start)."""
        if not self.window:
            return None
        if self.fixed_documents and self.window >= self.fixed_documents:
            return AttentionMask(MaskKind.CHUNKED, self.fixed_documents)
        return AttentionMask(self.local_kind, self.window)

    @property
    def first_local_mask(self) -> AttentionMask | None:
        """The first layer mask whose queries see a bounded stretch of keys (a window, a chunk, a
        document), or None where every layer attends over the whole context."""
        return next((mask for mask, _ in self.layer_masks if mask.local), None)

    @property
    def has_local_layers(self) -> bool:
        return self.first_local_mask is not None

    def within(self, seq_len: int) -> "tuple[ModelSpec, str | None]":
        """This model over sequences of `seq_len` tokens, and what that changed (None: nothing): a window or
        chunk of the whole sequence or more bounds nothing, so its layers attend globally; documents of
        one length that long are the whole row, so it is not packed."""
        changes, dropped = {}, []
        if self.window and self.window >= seq_len:
            changes.update(window=0, layer_pattern="")
            kind = "window" if self.local_kind == MaskKind.SLIDING.value else "chunks"
            dropped.append(f"the local layers' {kind} of {self.window} tokens")
        if self.fixed_documents and self.fixed_documents >= seq_len:
            changes.update(documents=0)
            dropped.append(f"documents of {self.fixed_documents} tokens")
        if not changes:
            return self, None
        return dataclasses.replace(self, **changes), (
            f"as long as the whole {seq_len}-token sequence or longer: {' and '.join(dropped)}; every layer is "
            "priced and run as attending over all of it"
        )

    def all_global(self) -> "ModelSpec":
        """This model with every layer attending over the whole (causal or full) context, unpacked."""
        return dataclasses.replace(self, window=0, layer_pattern="", documents=0)

    def layer_type(self, layer: int) -> str:
        """`L` where decoder layer `layer` (from 0) is a local one (a window or chunks), else `G`."""
        pattern = self.layer_pattern or ("L" if self.window else "G")
        return pattern[layer % len(pattern)]

    def layer_mask(self, layer: int) -> AttentionMask:
        """The mask of decoder layer `layer` (from 0)."""
        return self.local_mask if self.layer_type(layer) == "L" else self.global_mask

    @cached_property  # read for every candidate's verdict; the fields it reads never change
    def layer_masks(self) -> tuple[tuple[AttentionMask, int], ...]:
        """Each distinct mask of the layers with how many layers have it, global first."""
        # counted from the repeating pattern, not layer by layer: the work is the pattern's length
        # whatever the layer count (a config may give 2**31 layers, and every candidate asks)
        pattern = self.layer_pattern or ("L" if self.window else "G")
        repeats, rest = divmod(self.num_layers, len(pattern))
        counts = {}
        for kind in dict.fromkeys(pattern):  # in the order the pattern first has them, as the layers run
            layers = repeats * pattern.count(kind) + pattern[:rest].count(kind)
            if layers:
                mask = self.local_mask if kind == "L" else self.global_mask
                counts[mask] = counts.get(mask, 0) + layers
        return tuple(sorted(counts.items(), key=lambda item: item[0].local))

    @property
    def mlp_inputs(self) -> int:
        """The MLP's input projections: one per activation (2 gated, 1 plain)."""
        return len(self.mlp_activations)

    @property
    def gated(self) -> bool:
        """Whether the MLP multiplies two activated input projections (SwiGLU and the like)."""
        return self.mlp_inputs == 2

    @property
    def mlp_matrices(self) -> int:
        """The MLP's weight matrices, each `hidden × intermediate`: its inputs and the output."""
        return self.mlp_inputs + 1

    @property
    def attention_params(self) -> int:
        """Weights of one layer's attention: its projections, biases, q/k norm scales and sinks."""
        if self.latent:
            projections, out = self.latent.projection_params(self.hidden, self.num_heads, self.head_dim)
            return projections + out + self.attention_sinks * self.num_heads
        q = self.hidden * self.num_heads * self.head_dim
        kv = (1 if self.shared_kv else 2) * self.hidden * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden
        bias = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.qkv_bias else 0
        return q + kv + o + bias + 2 * self.qk_norm * self.head_dim + self.attention_sinks * self.num_heads

    @property
    def kv_projection_params(self) -> int:
        """Of `attention_params`, what a KV-shared layer lacks: the key and value projections, their biases
        and the key norm's scale."""
        kv = (1 if self.shared_kv else 2) * self.hidden * self.num_kv_heads * self.head_dim
        bias = 2 * self.num_kv_heads * self.head_dim if self.qkv_bias else 0
        return kv + bias + self.qk_norm * self.head_dim

    @property
    def dense_mlp_params(self) -> int:
        """Weights of a dense layer's MLP (one `intermediate` wide)."""
        return self.mlp_matrices * self.hidden * self.intermediate

    @property
    def wide_mlp_layers(self) -> int:
        """The layers whose MLP is twice `intermediate` wide (Gemma 4 E2B's KV-shared layers)."""
        return self.kv_shared_layers if self.double_wide_mlp else 0

    @property
    def mean_dense_mlp_params(self) -> float:
        """`dense_mlp_params` averaged over the dense layers, the wide ones twice (`wide_mlp_layers`; experts
        and wide layers are never in one model)."""
        return self.dense_mlp_params * (1 + self.wide_mlp_layers / self.num_layers)

    @property
    def per_layer_input_params(self) -> int:
        """Weights a decoder layer's per-layer input adds (gate, projection, norm; 0 without)."""
        return self.per_layer_inputs.layer_params(self.hidden) if self.per_layer_inputs else 0

    @property
    def expert_mlp_params(self) -> int:
        """Weights of a mixture-of-experts layer's MLP: every routed and shared expert, the router (0 for a
        dense model)."""
        e = self.experts
        if not e:
            return 0
        biases = e.bias * (self.mlp_inputs * e.total_width + (e.count + e.shared) * self.hidden + e.count)
        return self.mlp_matrices * self.hidden * e.total_width + self.hidden * e.count + biases

    @property
    def moe_layers(self) -> int:
        """Decoder layers whose MLP is a mixture of experts (0 for a dense model)."""
        return self.experts.layers(self.num_layers) if self.experts else 0

    @property
    def params_per_layer(self) -> int:
        """Weights of a decoder layer, averaged over the layers (dense and mixture-of-experts ones): its
        attention, its MLP, its norms' scales."""
        return self.layer_params // self.num_layers

    @property
    def layer_params(self) -> int:
        """Weights of all decoder layers."""
        dense_layers = self.num_layers - self.moe_layers + self.wide_mlp_layers  # a wide MLP counts twice
        mlp = dense_layers * self.dense_mlp_params + self.moe_layers * self.expert_mlp_params
        attention = sum(
            count * self.layer_model(mask).attention_params
            - self.kv_shared_count(mask) * self.layer_model(mask).kv_projection_params
            for mask, count in self.layer_masks
        )
        per_layer = self.decoder_block.norms * self.hidden + self.per_layer_input_params
        return attention + self.num_layers * per_layer + mlp

    @property
    def largest_layer_params(self) -> int:
        """Weights of the largest decoder layer (the one whose gathered weights a device holds at its peak):
        the largest attention with the widest MLP."""
        dense = self.dense_mlp_params * (2 if self.wide_mlp_layers else 1)
        mlp = max(self.expert_mlp_params, dense if self.moe_layers < self.num_layers else 0)
        attention = max(self.layer_model(mask).attention_params for mask, _ in self.layer_masks)
        return attention + self.decoder_block.norms * self.hidden + self.per_layer_input_params + mlp

    def layer_model(self, mask: AttentionMask) -> "ModelSpec":
        """This model as its layers of `mask` see it: with the global layers' own head shape where it has one
        (`global_attention`), else itself."""
        g = self.global_attention
        if g is None or mask != self.global_mask:
            return self
        return dataclasses.replace(
            self, num_kv_heads=g.num_kv_heads, head_dim=g.head_dim, shared_kv=g.shared_kv, global_attention=None
        )

    @property
    def mlp_width(self) -> int:
        """Values per token of each MLP input projection's output in the widest layer: a dense MLP's
        `intermediate` (twice that in a wide one, `wide_mlp_layers`); a mixture of experts' active experts'
        widths together (its routed copies of each token run through `per_token` experts, and the shared ones)."""
        moe = self.experts.active_width if self.experts else 0
        dense = self.intermediate * (2 if self.wide_mlp_layers else 1)
        return max(moe, dense if self.moe_layers < self.num_layers else 0)

    @property
    def mean_mlp_width(self) -> float:
        """`mlp_width` averaged over the layers where some are wider than the rest (`wide_mlp_layers`): the
        values a layer's MLP forms per token on average, as its time and its kept values add up."""
        if not self.wide_mlp_layers:
            return self.mlp_width
        return self.intermediate * (1 + self.wide_mlp_layers / self.num_layers)

    @property
    def mlp_matrix_params(self) -> int:
        """Weights of one MLP matrix of the widest layer as a device gathers it: a dense layer's `hidden ×
        intermediate`; a mixture of experts' one matrix of every expert."""
        e = self.experts
        moe = self.hidden * e.total_width if e else 0
        dense = self.hidden * self.intermediate * (2 if self.wide_mlp_layers else 1)
        return max(moe, dense if self.moe_layers < self.num_layers else 0)

    @property
    def mlp_flops_per_token(self) -> float:
        """Forward FLOPs of the MLP per token, averaged over the layers: the active experts' matmuls and the
        router in a mixture-of-experts layer, the dense MLP's elsewhere (a wide one's twice)."""
        dense = 2.0 * self.mean_dense_mlp_params
        if not self.experts:
            return dense
        e = self.experts
        moe = 2.0 * (self.mlp_matrices * self.hidden * e.active_width + self.hidden * e.count)
        return ((self.num_layers - self.moe_layers) * dense + self.moe_layers * moe) / self.num_layers

    @property
    def active_params(self) -> int:
        """Weights a token's forward pass multiplies by: all but the experts it is not routed to."""
        if not self.experts:
            return self.num_params
        e = self.experts
        idle = self.moe_layers * (e.count - e.per_token) * self.mlp_matrices * self.hidden * e.intermediate
        return self.num_params - idle

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the output head (once if tied) plus the final norm; the per-layer inputs'
        table and projection where the model has them."""
        heads = 1 if self.tie_embeddings else 2
        p = self.per_layer_inputs
        per_layer = p.table_params(self.num_layers) + p.projection_params(self.hidden, self.num_layers) if p else 0
        return heads * self.vocab * self.hidden + self.hidden + per_layer

    @property
    def num_params(self) -> int:
        return self.layer_params + self.embedding_params

    def to_dict(self) -> dict:
        row = {**dataclasses.asdict(self), "decoder_block": self.decoder_block.value}
        if not self.window:  # a model of global layers only reads as it always has
            for key in ("window", "local_kind", "layer_pattern"):
                row.pop(key)
        if not self.documents:
            row.pop("documents")
        elif self.varying_documents:
            row["documents"] = self.varying_documents.to_dict()
        for key in (
            "experts",
            "latent",
            "qk_norm",
            "attention_sinks",
            "shared_kv",
            "global_attention",
            "per_layer_inputs",
            "kv_shared_layers",
            "double_wide_mlp",
        ):
            # a dense GQA model reads as it always has
            if not row[key]:
                row.pop(key)
        return row

    @classmethod
    def from_dict(cls, row: dict) -> "ModelSpec":
        """A model from its JSON form (`to_dict`), naming missing or unknown fields.

        Raises:
            CpplanError: not an object, a missing or unknown field, or a value out of range.
        """
        return from_fields(cls, row, what="a model")

    @classmethod
    def from_hf_config(cls, path: str | os.PathLike, *, name: str | None = None) -> "ModelSpec":
        """Reads a Hugging Face `config.json` of a model type in `HF_MODEL_TYPES`: dense (llama, mistral,
        qwen2, qwen3), mixture-of-experts (mixtral, qwen3_moe, gpt_oss), DeepSeek-V3's latent attention
        with experts (deepseek_v3), Gemma 3's text decoder (gemma3_text: its block, `DecoderBlock.GEMMA3`) and
        Gemma 4 (gemma4: its text_config, per-layer inputs and KV-shared layers included); `is_causal: false`
        makes its mask full.

        Raises:
            CpplanError: the file is unreadable, of another model type, lacks a field, or has a
                field of the wrong type.
        """
        path = Path(path)
        try:
            with open(path, "rb") as handle:  # a bounded read: the path may name a device or a pipe
                data = handle.read(MAX_CONFIG_BYTES + 1)
            if len(data) > MAX_CONFIG_BYTES:
                raise CpplanError(
                    f"model config {str(path)!r} is over {MAX_CONFIG_BYTES >> 20} MiB: not a config.json."
                )
            cfg = json.loads(data.decode("utf-8"))
        except (OSError, UnicodeDecodeError, RecursionError, ValueError) as err:
            raise CpplanError(f"cannot read model config {str(path)!r}: {err}") from None
        if not isinstance(cfg, dict):
            raise CpplanError(
                f"{str(path)!r} holds a JSON {type(cfg).__name__}; a model config.json is an object "
                f"with model_type, hidden_size, num_attention_heads and the like."
            )
        model_type = cfg.get("model_type")
        if model_type in HF_TEXT_CONFIG_TYPES:
            cfg = _text_config(path, cfg)
            model_type = cfg["model_type"]
        if model_type not in HF_MODEL_TYPES:
            raise CpplanError(
                f"{str(path)!r}: model_type={model_type!r} is not supported; "
                f"cpplan reads {', '.join(HF_MODEL_TYPES)} configs."
            )
        cfg = {**HF_CONFIG_DEFAULTS.get(model_type, {}), **cfg}
        required = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
        missing = [k for k in required if k not in cfg]
        if missing:
            raise CpplanError(
                f"{str(path)!r}: missing {', '.join(missing)}; a {model_type} config needs {', '.join(required)}."
            )
        for key in (*required, "num_key_value_heads", "head_dim", "qk_nope_head_dim"):
            value = cfg.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONFIG_INTEGER:
                raise CpplanError(
                    f"{str(path)!r}: {key}={str(value)[:40]!r} must be a positive integer of at most 2**31; "
                    f"fix the config."
                )
        for key in ("tie_word_embeddings", "attention_bias", "is_causal"):
            if not isinstance(cfg.get(key, False), bool):
                raise CpplanError(f"{str(path)!r}: {key}={cfg[key]!r} must be true or false; fix the config.")
        heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
        if "head_dim" not in cfg and hidden % heads:
            raise CpplanError(
                f"{str(path)!r}: hidden_size={hidden} is not a multiple of num_attention_heads={heads}, "
                f"so the head size is not whole; give head_dim explicitly."
            )
        local = _hf_local_layers(path, cfg)
        experts, latent = _hf_experts(path, cfg), _hf_latent(path, cfg)
        hidden_act = cfg.get("hidden_act", cfg.get("hidden_activation", "silu"))
        if not isinstance(hidden_act, str) or hidden_act not in HF_ACTIVATIONS:
            raise CpplanError(
                f"{str(path)!r}: hidden_act={hidden_act!r} is not an activation cpplan runs; it runs "
                f"{', '.join(HF_ACTIVATIONS)} (a {model_type} MLP is gated: act(x·W_gate) · x·W_up)."
            )
        named = cfg.get("_name_or_path")
        if named is not None and not isinstance(named, str):
            raise CpplanError(f"{str(path)!r}: _name_or_path={named!r} must be a string.")
        name = name or _name_from_file(path, named or _architecture(cfg) or model_type)
        try:
            return cls(
                name=name,
                num_layers=cfg["num_hidden_layers"],
                hidden=hidden,
                num_heads=heads,
                num_kv_heads=cfg.get("num_key_value_heads", heads),
                head_dim=_hf_head_dim(cfg),
                intermediate=cfg["intermediate_size"],
                vocab=cfg["vocab_size"],
                tie_embeddings=cfg.get("tie_word_embeddings", False),
                qkv_bias=cfg.get("attention_bias", model_type == "qwen2") and not latent,
                decoder_block=DecoderBlock.GEMMA3 if model_type == "gemma3_text" else DecoderBlock.LLAMA2,
                mlp_activations=(HF_ACTIVATIONS[hidden_act], "linear"),
                causal=cfg.get("is_causal", True),
                experts=experts,
                latent=latent,
                qk_norm=model_type in HF_QK_NORM_TYPES,
                attention_sinks=model_type in HF_SINK_TYPES,
                global_attention=_hf_global_attention(path, cfg),
                **_hf_small_gemma(path, cfg),
                **local,
            )
        except CpplanError as err:  # a shape the model refuses: say which file holds it
            raise CpplanError(f"{str(path)!r}: {err}") from None


def _architecture(cfg: dict) -> str | None:
    """The config's first `architectures` entry (e.g. LlamaForCausalLM), or None."""
    architectures = cfg.get("architectures")
    first = architectures[0] if isinstance(architectures, list) and architectures else None
    return first if isinstance(first, str) and first else None


def _name_from_file(path: Path, what: str) -> str:
    """A config's model name: the file's (its folder for a config.json, else its stem), with what the
    config says it is (its name or path on the Hub, or its architecture) beside it, so two configs of
    one architecture read apart in every report."""
    where = path.resolve().parent.name if path.name == "config.json" else path.stem
    return f"{where} ({what})" if where and where != what else what


HF_LAYER_TYPES = {"full_attention": "G", "sliding_attention": "L", "chunked_attention": "L"}


def _hf_local_layers(path: Path, cfg: dict) -> dict:
    """The `window`, `local_kind` and `layer_pattern` of a config's local layers: `layer_types`, else
    `sliding_window` (unless `use_sliding_window` is false, as a Qwen2 config has it where unset) on every
    layer, on every `sliding_window_pattern`-th but the last, or (Qwen2) on the layers from
    `max_window_layers` on; none without them.

    Raises:
        CpplanError: a layer type cpplan does not run, or a window that is not a positive integer.
    """
    types = cfg.get("layer_types")
    chunked = "chunked_attention" in (types or ())
    key = "attention_chunk_size" if chunked else "sliding_window"
    window = cfg.get(key)
    if types is not None and not isinstance(types, list):
        raise CpplanError(
            f"{str(path)!r}: layer_types={types!r:.60} must be a list of one type per layer, e.g. "
            f"['sliding_attention', 'full_attention', ...]; fix the config."
        )
    if types is not None:
        unknown = [t for t in types if t not in HF_LAYER_TYPES]
        if unknown or (chunked and "sliding_attention" in types):
            raise CpplanError(
                f"{str(path)!r}: layer_types holds {(unknown or ['sliding and chunked layers'])[0]!r}; cpplan runs "
                f"full_attention layers with sliding_attention or chunked_attention ones (not both)."
            )
        if len(types) != cfg["num_hidden_layers"]:
            raise CpplanError(
                f"{str(path)!r}: layer_types names {len(types)} layers but num_hidden_layers is "
                f"{cfg['num_hidden_layers']}; give one type per layer."
            )
        pattern = "".join(HF_LAYER_TYPES[t] for t in types)
    elif window is None or cfg.get("use_sliding_window", cfg["model_type"] not in HF_WINDOW_OPT_IN_TYPES) is False:
        return {}
    elif cfg.get("sliding_window_pattern") is not None:
        every = _config_count(
            path,
            cfg,
            "sliding_window_pattern",
            1,
            "a positive integer (every that many layers one attends globally, the rest in the window)",
        )
        pattern = "L" * (every - 1) + "G"
    elif cfg.get("max_window_layers") is not None:
        first = _config_count(
            path,
            cfg,
            "max_window_layers",
            0,
            "an integer of 0 or more: the layers before it attend globally, the rest in the window",
        )
        layers = cfg["num_hidden_layers"]
        pattern = "G" * min(first, layers) + "L" * max(layers - first, 0)
    else:
        pattern = "L"
    if "L" not in pattern:
        return {}
    window = _config_count(path, cfg, key, 1, "a positive integer of at most 2**31 for its local layers")
    kind = MaskKind.CHUNKED if chunked else MaskKind.SLIDING
    return {"window": window, "local_kind": kind.value, "layer_pattern": pattern}


def _text_config(path: Path, cfg: dict) -> dict:
    """A multimodal config's decoder (`text_config`), named as the whole config is.

    Raises:
        CpplanError: no text_config object.
    """
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise CpplanError(
            f"{str(path)!r}: model_type={cfg.get('model_type')!r} keeps its decoder in text_config, which is "
            f"{type(text).__name__}; give the whole config.json."
        )
    return {**text, **{k: cfg[k] for k in ("architectures", "_name_or_path") if k in cfg}}


def _hf_global_attention(path: Path, cfg: dict) -> GlobalAttention | None:
    """The global layers' own head shape (Gemma 4's `global_head_dim`, `num_global_key_value_heads`,
    `attention_k_eq_v`), or None where the config gives none.

    Raises:
        CpplanError: a malformed head count or width.
    """
    if cfg.get("global_head_dim") is None:
        return None
    # Gemma4TextConfig gives the global layers num_global_key_value_heads only with attention_k_eq_v (and
    # where it is set); otherwise they keep num_key_value_heads (E2B, E4B)
    k_eq_v = cfg.get("attention_k_eq_v", False) is True
    own_heads = k_eq_v and cfg.get("num_global_key_value_heads") is not None
    return GlobalAttention(
        num_kv_heads=(
            _config_count(path, cfg, "num_global_key_value_heads", 1, "a positive integer")
            if own_heads
            else cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        ),
        head_dim=_config_count(path, cfg, "global_head_dim", 1, "a positive integer"),
        shared_kv=k_eq_v,
    )


# Gemma4TextConfig's defaults for its small models' fields (transformers configuration_gemma4.py): a config
# that leaves one out has it
HF_GEMMA4_SMALL_DEFAULTS = {
    "hidden_size_per_layer_input": 256,
    "vocab_size_per_layer_input": 262_144,
    "num_kv_shared_layers": 0,
    "use_double_wide_mlp": False,
}


def _hf_small_gemma(path: Path, cfg: dict) -> dict:
    """A Gemma 4 text config's per-layer inputs (`hidden_size_per_layer_input` values per token and layer
    from a table of `vocab_size_per_layer_input` rows; none where either is 0 or null), KV-shared layers
    (`num_kv_shared_layers`) and their wide MLP (`use_double_wide_mlp`), as ModelSpec fields; none for any
    other model type.

    Raises:
        CpplanError: a field of the wrong type.
    """
    if cfg["model_type"] != "gemma4_text":
        return {}
    values = {key: cfg.get(key, default) for key, default in HF_GEMMA4_SMALL_DEFAULTS.items()}
    for key in ("hidden_size_per_layer_input", "vocab_size_per_layer_input", "num_kv_shared_layers"):
        value = values[key]
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CONFIG_INTEGER
        ):
            raise CpplanError(f"{str(path)!r}: {key}={value!r:.40} must be an integer from 0 to 2**31; fix the config.")
    if not isinstance(values["use_double_wide_mlp"], bool):
        raise CpplanError(
            f"{str(path)!r}: use_double_wide_mlp={values['use_double_wide_mlp']!r:.40} must be true or false."
        )
    width, vocab = values["hidden_size_per_layer_input"], values["vocab_size_per_layer_input"]
    shared = values["num_kv_shared_layers"] or 0
    return {
        "per_layer_inputs": PerLayerInputs(width, vocab) if width and vocab else None,
        "kv_shared_layers": shared,
        # the flag widens the shared layers' MLP only (transformers and MaxText alike): none, nothing widened
        "double_wide_mlp": values["use_double_wide_mlp"] and shared > 0,
    }


# each model type's names for its experts' fields: (routed experts, experts per token, shared experts)
HF_EXPERT_KEYS = {
    "mixtral": ("num_local_experts", "num_experts_per_tok", None),
    "qwen3_moe": ("num_experts", "num_experts_per_tok", None),
    "deepseek_v3": ("n_routed_experts", "num_experts_per_tok", "n_shared_experts"),
    "gpt_oss": ("num_local_experts", "num_experts_per_tok", None),
    "gemma4_text": ("num_experts", "top_k_experts", None),
}


def _hf_experts(path: Path, cfg: dict) -> Experts | None:
    """The experts of a mixture-of-experts config (None for a dense model type). An expert is
    `moe_intermediate_size` wide where the config has one (its dense layers `intermediate_size`), else
    `intermediate_size`; DeepSeek-V3's leading dense layers are `first_k_dense_replace`.

    Raises:
        CpplanError: a missing or malformed count, or layers that interleave dense and expert MLPs in a
            way other than a dense lead (Qwen3-MoE's `decoder_sparse_step` > 1, `mlp_only_layers`).
    """
    keys = HF_EXPERT_KEYS.get(cfg["model_type"])
    if keys is None or (cfg["model_type"] == "gemma4_text" and not cfg.get("enable_moe_block")):
        return None
    routed, per_token, shared = keys
    if cfg["model_type"] == "gpt_oss" and per_token not in cfg:
        per_token = "experts_per_token"
    count = _config_count(path, cfg, routed, 2, "a number of routed experts of at least 2")
    top_k = _config_count(path, cfg, per_token, 1, "the experts each token is routed to, at least 1")
    width_key = "moe_intermediate_size" if "moe_intermediate_size" in cfg else "intermediate_size"
    width = _config_count(path, cfg, width_key, 1, "one expert's MLP width, a positive integer")
    shared_count = _config_count(path, cfg, shared, 0, "an integer of 0 or more") if shared and shared in cfg else 0
    shared_width = 0
    if cfg["model_type"] == "gemma4_text":  # its dense MLP beside the experts, which MaxText runs as a shared expert
        shared_count, shared_width = 1, cfg["intermediate_size"]
    dense = 0
    if "first_k_dense_replace" in cfg:
        dense = _config_count(
            path, cfg, "first_k_dense_replace", 0, "an integer of 0 or more: the leading dense layers"
        )
    if cfg.get("decoder_sparse_step", 1) != 1 or cfg.get("mlp_only_layers") or cfg.get("moe_layer_freq", 1) != 1:
        raise CpplanError(
            f"{str(path)!r}: decoder_sparse_step={cfg.get('decoder_sparse_step', 1)!r}, mlp_only_layers="
            f"{cfg.get('mlp_only_layers')!r:.40}, moe_layer_freq={cfg.get('moe_layer_freq', 1)!r}: cpplan prices "
            f"experts in every layer after a dense lead (first_k_dense_replace), not dense layers between them."
        )
    return Experts(
        count=count,
        per_token=top_k,
        intermediate=width,
        shared=shared_count,
        dense_layers=dense,
        bias=cfg["model_type"] == "gpt_oss",
        shared_intermediate=shared_width,
    )


def _hf_latent(path: Path, cfg: dict) -> LatentAttention | None:
    """A DeepSeek config's latent attention (`kv_lora_rank` and the rest), or None where it has none.

    Raises:
        CpplanError: a missing or malformed rank or head width.
    """
    if cfg.get("kv_lora_rank") is None:
        return None
    rule = "a positive integer"
    return LatentAttention(
        kv_rank=_config_count(path, cfg, "kv_lora_rank", 1, rule),
        rope_dims=_config_count(path, cfg, "qk_rope_head_dim", 0, "an integer of 0 or more"),
        v_head_dim=_config_count(path, cfg, "v_head_dim", 1, rule),
        q_rank=_config_count(path, cfg, "q_lora_rank", 1, rule) if cfg.get("q_lora_rank") is not None else 0,
    )


def _hf_head_dim(cfg: dict) -> int:
    """Each head's query/key width: `head_dim`; a latent attention's `qk_nope_head_dim + qk_rope_head_dim`;
    else the hidden size over the heads."""
    if cfg.get("kv_lora_rank") is not None and "qk_nope_head_dim" in cfg:
        return cfg["qk_nope_head_dim"] + cfg.get("qk_rope_head_dim", 0)
    return cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])


def _config_count(path: Path, cfg: dict, key: str, low: int, rule: str) -> int:
    """The config's `key`, an integer from `low` to `MAX_CONFIG_INTEGER`.

    Raises:
        CpplanError: anything else, saying what it must be (`rule`).
    """
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_CONFIG_INTEGER:
        raise CpplanError(f"{str(path)!r}: {key}={value!r:.40} must be {rule}; fix the config.")
    return value


def _activations(model: str, value) -> tuple[str, ...]:
    """`value` as the tuple of MLP activation names a `ModelSpec` holds.

    Raises:
        CpplanError: not a list of names, no name or too many, or a name cpplan does not run.
    """
    if isinstance(value, str) or not isinstance(value, (tuple, list)) or not all(isinstance(a, str) for a in value):
        raise CpplanError(
            f"model {model!r}: mlp_activations={value!r} must be a list of activation names, one per "
            f"MLP input projection, e.g. {list(SWIGLU)} (gated) or ['relu'] (plain)."
        )
    if not 1 <= len(value) <= MAX_MLP_INPUTS:
        raise CpplanError(
            f"model {model!r}: mlp_activations={list(value)} has {len(value)} activations; cpplan runs "
            f"an MLP with 1 (plain) or 2 (gated) input projections, one per activation."
        )
    unknown = [a for a in value if a not in MLP_ACTIVATIONS]
    if unknown:
        raise CpplanError(
            f"model {model!r}: mlp_activations={list(value)}: {', '.join(map(repr, unknown))} is not "
            f"an activation cpplan runs; use {', '.join(MLP_ACTIVATIONS)} (MaxText's names)."
        )
    return tuple(value)


# Shapes from the models' published config.json files (meta-llama on Hugging Face).
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256),
        ModelSpec("llama3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256),
        ModelSpec("llama3.1-405b", 126, 16384, 128, 8, 128, 53248, 128256),
        ModelSpec("llama2-7b", 32, 4096, 32, 32, 128, 11008, 32000),
        ModelSpec("llama2-70b", 80, 8192, 64, 8, 128, 28672, 32000),
        # heads of 64, narrower than a TPU's 128 lanes (docs/measurements.md, "Heads narrower than a lane")
        ModelSpec("llama3.2-1b", 16, 2048, 32, 8, 64, 8192, 128256, tie_embeddings=True),
        # models with local layers, shaped as google/gemma-3-12b-pt's and mistralai/Mistral-7B-v0.1's
        # config.json; Gemma 3's in its own block (four norms a layer, q/k norms), as MaxText's gemma3 block and
        # transformers' Gemma3ForCausalLM run it (docs/provenance/cost_models.md#models)
        ModelSpec(
            "gemma3-12b",
            48,
            3840,
            16,
            8,
            256,
            15360,
            262208,
            tie_embeddings=True,
            mlp_activations=("gelu", "linear"),
            decoder_block=DecoderBlock.GEMMA3,
            window=1024,
            layer_pattern="LLLLLG",
            qk_norm=True,
        ),
        ModelSpec("mistral-7b-v0.1", 32, 4096, 32, 8, 128, 14336, 32000, window=4096),
        # mixture-of-experts and latent-attention models by MaxText's names, shaped as their published
        # config.json files (tests/testdata/hf_configs/ holds each with its source; docs/provenance/moe_models.md)
        ModelSpec(
            "deepseek3-671b",
            61,
            7168,
            128,
            128,
            192,
            18432,
            129280,
            experts=Experts(256, 8, 2048, shared=1, dense_layers=3),
            latent=LatentAttention(kv_rank=512, rope_dims=64, v_head_dim=128, q_rank=1536),
        ),
        ModelSpec("qwen3-235b-a22b", 94, 4096, 64, 4, 128, 12288, 151936, experts=Experts(128, 8, 1536), qk_norm=True),
        ModelSpec("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936, experts=Experts(128, 8, 768), qk_norm=True),
        ModelSpec("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, qk_norm=True),
        ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, experts=Experts(8, 2, 14336)),
        # shaped as MaxText 0.2.5's own configs (the maxtext wheel's configs/models/<name>.yml): Mixtral 8x22B;
        # Llama 4 Scout and Maverick, chunked attention of 8192 tokens on three layers of four (their
        # fourth, NoPE, global), one routed expert of 8192 and one shared; Maverick's every other layer dense
        ModelSpec("mixtral-8x22b", 56, 6144, 48, 8, 128, 16384, 32768, experts=Experts(8, 2, 16384)),
        *(
            ModelSpec(
                name,
                48,
                5120,
                40,
                8,
                128,
                dense_width,
                202048,
                window=8192,
                local_kind=MaskKind.CHUNKED.value,
                layer_pattern="LLLG",
                qk_norm=qk_norm,
                experts=Experts(count, 1, 8192, shared=1, every=every),
            )
            for name, dense_width, count, every, qk_norm in (
                ("llama4-17b-16e", 8192, 16, 1, True),
                ("llama4-17b-128e", 16384, 128, 2, False),
            )
        ),
        *(
            ModelSpec(
                name,
                layers,
                hidden,
                heads,
                kv_heads,
                256,
                intermediate,
                262144,
                tie_embeddings=True,
                mlp_activations=("gelu", "linear"),
                window=1024,
                layer_pattern="LLLLLG",
                qk_norm=True,
                global_attention=GlobalAttention(global_kv_heads, 512, shared_kv=True),
                experts=experts,
            )
            for name, layers, hidden, heads, kv_heads, global_kv_heads, intermediate, experts in (
                ("gemma4-26b", 30, 2816, 16, 8, 2, 2112, Experts(128, 8, 704, shared=1, shared_intermediate=2112)),
                ("gemma4-31b", 60, 5376, 32, 16, 4, 21504, None),
            )
        ),
        # Gemma 4's small models by MaxText's names, shaped as its configs/models/gemma4-e2b.yml and gemma4-e4b.yml:
        # per-layer inputs of 256 from a 262144-row table, the last 20 (18) layers reusing earlier layers' keys
        # and values, E2B's with an MLP twice as wide; global layers of heads of 512, as many K/V heads as the
        # local ones (docs/provenance/moe_models.md#gemma-4-e2b-and-e4b)
        *(
            ModelSpec(
                name,
                layers,
                hidden,
                8,
                kv_heads,
                256,
                intermediate,
                262144,
                tie_embeddings=True,
                mlp_activations=("gelu", "linear"),
                window=512,
                layer_pattern=pattern,
                qk_norm=True,
                global_attention=GlobalAttention(kv_heads, 512),
                per_layer_inputs=PerLayerInputs(256, 262144),
                kv_shared_layers=shared,
                double_wide_mlp=wide,
            )
            for name, layers, hidden, kv_heads, intermediate, pattern, shared, wide in (
                ("gemma4-e2b", 35, 1536, 1, 6144, "LLLLG", 20, True),
                ("gemma4-e4b", 42, 2560, 2, 10240, "LLLLLG", 18, False),
            )
        ),
        *(
            ModelSpec(
                name,
                layers,
                2880,
                64,
                8,
                64,
                2880,
                201088,
                qkv_bias=True,
                window=128,
                layer_pattern="LG",
                experts=Experts(experts, 4, 2880, bias=True),
                attention_sinks=True,
            )
            for name, layers, experts in (("gpt-oss-120b", 36, 128), ("gpt-oss-20b", 24, 32))
        ),
        # small configs for tests and CPU runs; byte-level vocabulary
        ModelSpec("tiny", 2, 64, 4, 2, 16, 128, 256),
        ModelSpec("tiny-mha", 2, 64, 4, 4, 16, 128, 256),
        ModelSpec("small", 4, 256, 8, 4, 32, 512, 256),
        # a mixture of experts for tests and CPU runs, shaped as DeepSeek's layer (a dense lead, shared
        # experts) at tiny scale: 3 layers, the first dense; 8 routed experts 32 wide, each token to its
        # top 2, and one shared; 8 heads so that Ulysses can take 4
        ModelSpec("tiny-moe", 3, 64, 8, 2, 16, 128, 256, experts=Experts(8, 2, 32, shared=1, dense_layers=1)),
    )
}


def get_model(model: "str | ModelSpec | os.PathLike") -> ModelSpec:
    """A model by name, a ModelSpec unchanged, or a path to a Hugging Face config.json.

    Raises:
        CpplanError: unknown name (listing the known ones and the closest) or an unreadable config.
    """
    if isinstance(model, ModelSpec):
        return model
    if not isinstance(model, (str, os.PathLike)) or not os.fspath(model):
        raise CpplanError(
            f"model={model!r}: give a model name (one of {', '.join(MODELS)}), a ModelSpec, "
            f"or the path of a config.json."
        )
    text = os.fspath(model)
    if text in MODELS:
        return MODELS[text]
    path = Path(text)
    try:
        is_dir = path.is_dir()
        is_path = path.suffix == ".json" or is_dir or path.is_file()
    except OSError as err:  # e.g. a name longer than the file system allows
        raise CpplanError(
            f"model {text[:80]!r}: not a known model, and not a usable path ({err.strerror}); "
            f"known models: {', '.join(MODELS)}."
        ) from None
    if is_path:
        return ModelSpec.from_hf_config(path / "config.json" if is_dir else path)
    raise unknown_name("model", text, MODELS)
