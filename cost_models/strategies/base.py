"""The strategy spec base class, the shapes it is given, and the rules strategies share.

A spec is the one jax-free statement of a strategy (axes, rules, splash calls, own traffic, MaxText
name) that search, price, export and runtime all consult. Layouts and kernel calls take a scalar
`Shape` or numpy-column `Candidates` alike, so one formula serves both.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from cost_models.chips import ChipKind
from cost_models.masks import AttentionMask, MaskKind
from cost_models.models import ModelSpec
from cost_models.vocabulary import CPStrategy

# splash blocks are lane-width multiples on the chip (interpret mode is laxer); plans keep the rule everywhere
SPLASH_LANES = ChipKind.TPU.lanes


@dataclass(frozen=True)
class Shape:
    """One candidate: what decides whether a strategy runs it and how its kernels lie. `ring`,
    `ulysses`, `tensor` are axis sizes; `shared_cores`: devices share a host's cores, so a step costs
    the average device's work, not the busiest one's."""

    model: ModelSpec
    seq_len: int
    ring: int
    ulysses: int
    tensor: int
    zigzag: bool
    shared_cores: bool = False
    mask: AttentionMask | None = None  # the layers it stands for: those with this mask (None: the global ones)
    fused_attention_backward: bool = False  # splash's backward as its one fused kernel (`Plan`'s field)

    @property
    def attention_mask(self) -> AttentionMask:
        return self.mask or self.model.global_mask

    @classmethod
    def on_mesh(
        cls,
        model: ModelSpec,
        seq_len: int,
        mesh: dict[str, int],
        zigzag: bool,
        shared_cores: bool,
        fused_attention_backward: bool = False,
    ) -> Shape:
        """The shape of a plan on `mesh` (axis sizes by name, every axis present)."""
        return cls(
            model,
            seq_len,
            mesh["context"],
            mesh["context_ulysses"],
            mesh["tensor"],
            zigzag,
            shared_cores,
            fused_attention_backward=fused_attention_backward,
        )


def layer_shapes(shape: Shape) -> list[Shape]:
    """`shape` as each head shape of its model's layers sees it: itself, and where the model's global layers
    have their own (`ModelSpec.global_attention`), the global layers' shape too."""
    model = shape.model
    if model.global_attention is None:
        return [shape]
    return [shape, replace(shape, model=model.layer_model(model.global_mask), mask=None)]


@dataclass(frozen=True)
class Violation:
    """A rule a candidate breaks: a short category for grouping, and the sentence with numbers."""

    category: str
    reason: str


@dataclass(frozen=True)
class Layout:
    """How the attention kernel lies on one device, per sequence (scalars or numpy columns)."""

    q_heads: Any  # query heads per device inside the kernel
    kv_heads: Any  # key/value heads per device inside the kernel (after any replication)
    ring: Any  # ways the sequence is split for attention (1 = the kernel sees the whole sequence)
    q_len: Any  # query tokens the device attends
    kv_len: Any  # key tokens the device attends them to


def query_values(x, layout: Layout):
    """Values of q per device in the kernel's layout, the attention output's as many."""
    return x.sequences_per_device * layout.q_len * layout.q_heads * x.model.head_dim


def key_values(x, layout: Layout):
    """Values of K per device in the kernel's layout, V's as many."""
    return x.sequences_per_device * layout.kv_len * layout.kv_heads * x.model.head_dim


def laid_out_values(x, layout: Layout):
    """(q's, K's) values per device as splash's layout holds them in HBM, the head in whole lanes
    (`lane_ratio`); the attention output's as many as q's, V's as K's."""
    ratio = lane_ratio(x)
    return ratio * query_values(x, layout), ratio * key_values(x, layout)


def lane_ratio(x) -> float:
    """Bytes a value in splash's layout takes in HBM per byte of its values: a layer's q, K, V, attention
    output, their gradients and fp32 sums hold the head minor-most, which the chip lays out in whole lanes
    (`ChipKind.lanes`: a head of 64 takes 128 on a TPU). The ring's K/V and sums in flight between
    devices and the kept stacks hold the tokens minor-most and are not padded (docs/measurements.md,
    "Heads narrower than a lane")."""
    lanes, head = x.topology.chip.kind.lanes, x.model.head_dim
    return -(-head // lanes) * lanes / head


@dataclass(frozen=True)
class KernelCall:
    """`count` splash calls per layer forward of `q_len` × `kv_len` tokens; backward by the dq and
    dk/dv kernels, or the fused one (fp32 dq partials summed after) where `fused_backward` (a bool, or one
    per candidate where the candidates hold a column of `fused_attention_backward`). Query
    blocks stay within `q_block_cap` (not straddling zigzag chunks). Under a local `mask` the call's
    queries start at position `q_start` and its keys at `kv_start`, and splash computes and visits only
    the blocks the mask leaves (`cost_models.masks.call_blocks`)."""

    count: Any
    q_len: Any
    kv_len: Any
    causal: bool = True
    q_block_cap: Any = float("inf")
    fused_backward: bool = False
    mask: AttentionMask | None = None
    q_start: Any = 0
    kv_start: Any = 0

    @property
    def local(self) -> bool:
        return self.mask is not None and self.mask.local


def fused_backward_runs(x, calls):
    """Whether splash's fused backward runs `calls`: where the plan asks for it and no call has a local
    mask (whose shrunk dK/dV tables the fused kernel cannot walk); per candidate where `x` holds a column."""
    if any(c.local for c in calls):
        return False
    fused = x.fused_attention_backward
    return fused if isinstance(fused, np.ndarray) else bool(fused)


def all_fused(calls):
    """Whether every one of a device's calls runs the fused backward (one bool, or one per candidate)."""
    return functools.reduce(operator.and_, (c.fused_backward for c in calls), True)


@dataclass(frozen=True)
class CPCost:
    """A strategy's own traffic for one layer, forward and backward (arrays over candidates)."""

    forward_s: Any
    backward_s: Any
    exposed_forward_s: Any
    exposed_backward_s: Any
    buffer_bytes: Any  # attention buffers held at the peak of one layer
    # backward traffic a recomputed forward makes unnecessary (e.g. re-gathered K/V); never hidden traffic
    recompute_reuses_s: Any = 0.0
    # the ring's K/V hops, which a target whose compiler shares them takes from a recomputed forward
    # (`TargetTraits.backward_shares_recomputed_hops`)
    recompute_shared_hops_s: Any = 0.0
    # 1.0 where the backward's kernels read the log-sum-exp their own recomputed forward wrote (splash's
    # backward of one call), 0.0 where it reads one merged over blocks (a ring's); over layer kinds, the share
    reads_own_lse: Any = 0.0
    # of `buffer_bytes`, those already held when that backward starts (none of the gradients it forms)
    buffer_bytes_before_backward: Any = 0.0
    # 1.0 where the attention's backward reads K/V from the layer's working set (its own, or laid out anew:
    # Ulysses), holding every value of the attention side and its gradient at once; 0.0 where K/V and their
    # gradients are the strategy's buffers (a ring's hops, all-gather's gathered K/V), which holds less
    # (`memory.working_set_beside_kv`)
    kv_in_working_set: Any = 1.0
    # where K/V are the buffers, bytes the backward holds beyond `memory.working_set_beside_kv` (USP's
    # zigzag hops)
    beside_kv_excess: Any = 0.0
    # of `buffer_bytes`, the kept q/K/V/output laid out anew for the kernel (an all-to-all's); a backward
    # whose K/V are the strategy's buffers holds them as its working set's own and its hops', not again
    operand_copies_bytes: Any = 0.0
    # bytes of the attention output laid out anew from the kernel's layout for the out projection's weight
    # gradient (an all-to-all's); where K/V are the buffers, a chip that moves layouts off the TensorCore
    # holds it through the backward's hops when the output is recomputed (`memory.relaid_output_held`)
    relaid_output_bytes: Any = 0.0
    # bytes of the strategy's buffers gathered for the attention's backward (all-gather's K/V), held through
    # the MLP's backward where they are gathered before it (`memory.gathered_before_mlp_backward`)
    held_through_mlp_backward: Any = 0.0


@dataclass(frozen=True)
class AxisRule:
    """Which context axes a strategy splits the sequence over: each must be > 1 when used, = 1 when not."""

    context: bool
    context_ulysses: bool

    def accepts(self, ring: int, ulysses: int) -> bool:
        return (ring > 1) == self.context and (ulysses > 1) == self.context_ulysses

    def describe(self) -> str:
        return " and ".join(
            f"{axis} {'> 1' if used else '= 1'}"
            for axis, used in (("context", self.context), ("context_ulysses", self.context_ulysses))
        )


class StrategySpec:
    """The base of every spec: the shared rules. Subclasses set `strategy`, `axes`, `collective`
    (its traffic's name in a breakdown), `balances_load` (whether zigzag does anything)."""

    strategy: CPStrategy
    axes: AxisRule
    collective: str
    balances_load: bool = True
    hides_traffic_behind_attention = False  # its transfers overlap the attention of the block in hand

    @staticmethod
    def with_backward(x, calls: tuple[KernelCall, ...]) -> tuple[KernelCall, ...]:
        """`calls` with the backward cpplan's runtime runs for them: all fused where the plan asks for the
        fused kernel (`x.fused_attention_backward`) and no call has a local (shrunk) mask, whose dK/dV tables
        the fused kernel cannot walk, else all as dq and dK/dV kernels (a device's calls run one kind)."""
        fused = fused_backward_runs(x, calls)
        return tuple(replace(c, fused_backward=fused) for c in calls)

    @property
    def name(self) -> str:
        return self.strategy.value

    def check(self, shape: Shape) -> Violation | None:
        """None when the strategy runs this case, else the first rule it breaks, with its numbers; a model whose
        global layers have a head shape of their own is judged with each (`ModelSpec.layer_model`)."""
        for layer in layer_shapes(shape):
            violation = self._check_layer(layer)
            if violation:
                return violation
        return None

    def _check_layer(self, shape: Shape) -> Violation | None:
        return (
            self.axes_check(shape)
            or full_mask_balance_check(shape)
            or self.load_balance_check(shape)
            or heads_check(shape)
            or self.heads_rule(shape)
            or self.sequence_rule(shape)
            or lane_check(self, shape)
        )

    def balances(self, model: ModelSpec) -> bool:
        """Whether zigzag changes this strategy's work for `model` (never under a full mask)."""
        return self.balances_load and model.causal and not model.has_local_layers

    def axes_check(self, shape: Shape) -> Violation | None:
        if self.axes.accepts(shape.ring, shape.ulysses):
            return None
        return Violation(
            "mesh",
            f"{self.name} needs {self.axes.describe()} (got context={shape.ring}, context_ulysses={shape.ulysses})",
        )

    def load_balance_check(self, shape: Shape) -> Violation | None:
        if shape.zigzag and not self.balances_load:
            return Violation(
                "load balance", f"zigzag does nothing for {self.name}: each device attends over the whole sequence"
            )
        return None

    def heads_rule(self, shape: Shape) -> Violation | None:
        """The strategy's own rule on heads (beyond the tensor split every strategy has)."""
        return None

    def sequence_rule(self, shape: Shape) -> Violation | None:
        """The sequence splits evenly over the context ranks (twice as finely under zigzag)."""
        pieces = shape.ring * shape.ulysses * (2 if shape.zigzag else 1)
        if shape.seq_len % pieces:
            ranks = {
                (False, False): "",
                (True, False): " context ranks",
                (False, True): " Ulysses ranks",
                (True, True): " context × context_ulysses ranks",
            }[(shape.ring > 1, shape.ulysses > 1)]
            zig = " (2 × ring degree chunks for zigzag)" if shape.zigzag else ""
            return Violation("sequence split", f"seq_len={shape.seq_len} not divisible by {pieces}{ranks}{zig}")
        return None

    def layout(self, x) -> Layout:
        """The kernel layout of a `Shape` or of every `Candidates` column."""
        raise NotImplementedError(f"{type(self).__name__} must define layout")

    def kernel_calls(self, x, layout: Layout) -> tuple[KernelCall, ...]:
        """The splash calls one device makes per layer forward, as the runtime makes them (the busiest
        device's on chips, the average one's where devices share cores)."""
        mask = x.attention_mask
        if mask.local:  # the whole sequence's queries and keys in one call
            return self.with_backward(x, (KernelCall(1.0, layout.q_len, layout.kv_len, mask=mask),))
        return self.with_backward(x, (KernelCall(1.0, layout.q_len, layout.kv_len, causal=x.model.causal),))

    def maxtext_kernel_calls(self, x, layout: Layout) -> tuple[KernelCall, ...]:
        """The splash calls MaxText makes for the same layout: cpplan's, with the fused backward under
        tokamax's splash or when asked for. Evidence: docs/provenance/strategies_and_validation.md#base"""
        calls = self.kernel_calls(x, layout)
        fused = x.fused_attention_backward | self.maxtext_tokamax_splash
        return tuple(replace(c, fused_backward=c.fused_backward | fused) for c in calls) if np.any(fused) else calls

    def merge_bytes(self, x, layout: Layout, calls: tuple[KernelCall, ...]):
        """(forward, backward) HBM bytes per layer of merging several calls' results outside the kernels."""
        return 0.0, 0.0

    def gathered_kv_bytes(self, x, layout: Layout):
        """Bytes per device of the full-length K and V the strategy gathers (none where it gathers none)."""
        return 0.0

    def cost(
        self, x, layout: Layout, attention_fwd_s, attention_bwd_s, *, gradients_all_reduced: bool = False
    ) -> CPCost:
        """Per-layer traffic of `Candidates` x; `attention_*_s` is what a ring's hops can hide behind;
        `gradients_all_reduced`: gathered tensors' gradients are all-reduced, not reduce-scattered."""
        raise NotImplementedError(f"{type(self).__name__} must define cost")

    def describe(self, ring: int, ulysses: int, zigzag: bool) -> str:
        """A short phrase for people, e.g. 'ring over context=128, zigzag'."""
        raise NotImplementedError(f"{type(self).__name__} must define describe")

    # -- MaxText ----------------------------------------------------------------------------
    maxtext_name: str | None = None  # context_parallel_strategy; None where MaxText has no such strategy
    maxtext_tokamax_splash = False  # MaxText runs it with use_tokamax_splash=True
    maxtext_refuses_load_balance = False  # MaxText refuses context_parallel_load_balance=True for it
    maxtext_ring_kernel = False  # MaxText runs it with tokamax's ring kernel over `context` (ring, USP)
    # MaxText's kernel keeps splash metadata per head (Ulysses' multi-head mask), not one shared table
    maxtext_per_head_metadata = False
    # MaxText runs only global layers under it: its attention refuses a layer of another type
    maxtext_global_layers_only = False
    # MaxText's kernel skips the key blocks of other packed documents, as the price of `documents` does
    maxtext_skips_other_documents = False

    def maxtext_degrees(self, ring: int, ulysses: int) -> tuple[int, int]:
        """(ici_context_parallelism, ici_context_usp_ulysses_parallelism) for these degrees."""
        return ring, 1

    @property
    def maxtext_takes_ulysses_degree(self) -> bool:
        """Whether MaxText reads `ici_context_usp_ulysses_parallelism` for this strategy (USP)."""
        return self.maxtext_degrees(1, 2)[1] != 1

    def from_maxtext_degrees(self, context: int, usp_ulysses: int) -> tuple[int, int]:
        """(ring, ulysses) degrees of MaxText's flags; the inverse of `maxtext_degrees`."""
        return context, 1

    def maxtext_problems(self, shape: Shape) -> list[str]:
        """MaxText's own rules for this strategy that `shape` breaks, each with the fix."""
        return []

    def maxtext_rules(self, shape: Shape) -> list[str]:
        """Every MaxText rule `shape` breaks, each with the fix: the mask's, then the strategy's own."""
        if self.maxtext_name is None:
            return [
                f"MaxText 0.2.5 has no {self.strategy.value} strategy (context_parallel_strategy); plan with "
                f"one it has, or price for cpplan's runtime"
            ]
        own = [problem for layer in layer_shapes(shape) for problem in self.maxtext_problems(layer)]
        return maxtext_mask_problems(shape.model, self) + list(dict.fromkeys(own))


def layer_strategy(model: ModelSpec, mask: AttentionMask, strategy: CPStrategy, local: CPStrategy | None) -> CPStrategy:
    """The strategy a layer of `model` with `mask` runs: `local` for the layers whose mask is not the
    global one where a plan gives one, else `strategy` (the price and the runtime both ask this)."""
    return local if local is not None and mask != model.global_mask else strategy


def local_strategy_problem(model: ModelSpec, strategy: CPStrategy, local: CPStrategy | None) -> str | None:
    """Why `local` cannot be the local layers' own strategy beside `strategy` (None: it can, or is unset)."""
    if local is None:
        return None
    if len(model.layer_masks) < 2:
        return (
            f"local_strategy={local.value}: model {model.name!r} has one kind of layer "
            f"({model.layer_masks[0][0].describe()}); set cp_strategy alone"
        )
    if local is strategy:
        return f"local_strategy={local.value} is cp_strategy already; leave local_strategy unset"
    return None


def full_mask_balance_problem(model: ModelSpec, zigzag: bool) -> str | None:
    """The problem of zigzag under a full mask (every rank does the same work) or with local layers,
    else None."""
    if zigzag and not model.causal:
        return (
            f"load_balance=zigzag: zigzag evens out causal attention's uneven work, but model {model.name!r} "
            f"attends with a full (non-causal) mask (causal=False), which gives every context rank the same work"
        )
    if zigzag and model.has_local_layers:
        return (
            f"load_balance=zigzag: model {model.name!r} has local layers ({model.first_local_mask.describe()}), whose "
            f"work is the same on every context rank; zigzag would put each window's keys on ranks a ring "
            f"reaches last, so every local layer would walk the whole ring: lay tokens out in natural order "
            f"(load_balance='none')"
        )
    return None


def full_mask_balance_check(shape: Shape) -> Violation | None:
    """`full_mask_balance_problem` of a candidate, as a rule it breaks."""
    problem = full_mask_balance_problem(shape.model, shape.zigzag)
    return Violation("load balance", problem) if problem else None


# MaxText 0.2.5's gemma3 decoder block: the one block of a dense model that gives layers a sliding window,
# fixed at five such layers to one global, cycled over the layers; it reads its query scale by model name
MAXTEXT_LOCAL_BLOCK = "gemma3"
MAXTEXT_LOCAL_PATTERN = "LLLLLG"
MAXTEXT_LOCAL_MODEL_NAME = "gemma3-12b"
# MaxText's gpt_oss block: a sliding window on every other layer, the first included (models/gpt_oss.py)
MAXTEXT_EXPERT_LOCAL_PATTERN = "LG"
# MaxText's llama4 block: chunked attention on three layers of four, the fourth global (`nope_layer_interval`)
MAXTEXT_CHUNKED_PATTERN = "LLLG"
# MaxText's gemma4_small block (Gemma 4 E2B, E4B: per-layer inputs, KV-shared layers): a sliding window on four
# layers of five for gemma4-e2b, five of six for any other name (models/gemma4_small.py `get_attention_pattern`)
MAXTEXT_SMALL_GEMMA_PATTERN = "LLLLG"


def _window(model: ModelSpec) -> AttentionMask:
    """A local layer's own mask, before any packed documents cut it."""
    return AttentionMask(model.local_kind, model.window)


def _repeats(model: ModelSpec, pattern: str) -> bool:
    """Whether `model`'s layers are local and global as `pattern`, repeated, makes them."""
    # both patterns repeat, so they agree on every layer once they agree over one period of both
    period = math.lcm(len(model.layer_pattern or "L"), len(pattern))
    layers = range(min(model.num_layers, period))
    return all(model.layer_type(i) == pattern[i % len(pattern)] for i in layers)


def maxtext_local_layers_problem(model: ModelSpec) -> str | None:
    """Why MaxText 0.2.5's gemma3 block cannot run `model`'s local layers (None when it can, or when
    the model has none). Evidence: docs/provenance/strategies_and_validation.md#base"""
    if not model.window:
        return None
    local = f"model {model.name!r} has local layers ({_window(model).describe()})"
    if model.local_kind != MaskKind.SLIDING:
        if model.experts and _repeats(model, MAXTEXT_CHUNKED_PATTERN):
            return None  # MaxText's llama4 block: chunked layers, every fourth global (NoPE), experts in each
        return (
            f"{local}, and MaxText 0.2.5 runs chunked layers only in its llama4 block, a mixture of experts "
            f"with three chunked layers to each global one ({MAXTEXT_CHUNKED_PATTERN!r}); run the plan on "
            f"cpplan's runtime"
        )
    if model.experts and _repeats(model, MAXTEXT_EXPERT_LOCAL_PATTERN):
        return None  # MaxText's gpt_oss block: sliding and global layers in turn, experts in each
    small_gemma = model.per_layer_inputs is not None or model.kv_shared_layers > 0
    if small_gemma and _repeats(model, MAXTEXT_SMALL_GEMMA_PATTERN):
        return None  # MaxText's gemma4_small block, as gemma4-e2b: four sliding layers to each global one
    if not _repeats(model, MAXTEXT_LOCAL_PATTERN):
        where = "on every layer" if "G" not in model.layer_pattern else f"in the pattern {model.layer_pattern!r}"
        return (
            f"{local} {where}, and MaxText 0.2.5 gives a dense model's layers a sliding window only in its "
            f"{MAXTEXT_LOCAL_BLOCK} block, at five layers of every six ({MAXTEXT_LOCAL_PATTERN!r}), and a "
            f"mixture of experts' only in its gpt_oss block, every other layer ({MAXTEXT_EXPERT_LOCAL_PATTERN!r}); "
            f"its llama2, mistral and default blocks attend globally whatever attention_type and "
            f"sliding_window_size say (the block's own global type wins); run the plan on cpplan's runtime (where "
            f"no row is longer than the window, the model without it has the same mask and exports)"
        )
    if model.decoder_block.parallel:
        return (
            f"{local}, and MaxText 0.2.5's {MAXTEXT_LOCAL_BLOCK} block, its one block with such layers, is "
            f"sequential, not the parallel block (decoder_block={model.decoder_block.value}) this model has; "
            f"run the plan on cpplan's runtime"
        )
    return None


def maxtext_mask_problems(model: ModelSpec, spec: "StrategySpec | None" = None) -> list[str]:
    """Why MaxText 0.2.5 cannot run `model`'s masks under `spec`'s strategy (under none: the reasons no
    strategy lifts), each with the fix. A full mask: its decoder blocks run causal whatever
    `attention_type` says. Local layers: only its gemma3 block has them (`maxtext_local_layers_problem`),
    and its ring, ulysses and usp run global layers only. Packed documents of a fixed length: only a kernel
    that skips other documents' key blocks does the work priced (varying ones are priced as whole rows
    wherever the kernel does not prune). Evidence: docs/provenance/strategies_and_validation.md#base"""
    if not model.causal:
        return [
            f"model {model.name!r} attends with a full (non-causal) mask, and MaxText 0.2.5 runs its llama2 and "
            f"default decoder blocks causal whatever attention_type says (the blocks pass their own, global, "
            f"type); run the plan on cpplan's runtime, or plan a causal model (causal=True) to export"
        ]
    problems = []
    local = maxtext_local_layers_problem(model)
    if local:
        problems.append(local)
    elif model.window and spec is not None and spec.maxtext_global_layers_only:
        problems.append(
            f"model {model.name!r} has local layers ({_window(model).describe()}), and MaxText 0.2.5's "
            f"{spec.maxtext_name} runs global layers only (its attention refuses any other layer type under "
            f"ring, ulysses and usp); plan all_gather or no context parallelism to export"
        )
    # documents of varying length are priced as whole rows wherever the kernel does not prune
    if model.fixed_documents and spec is not None and not spec.maxtext_skips_other_documents:
        more = (
            "passes K/V around the whole ring (tokamax's ring kernel), where the price stops each hop at "
            "the documents' reach"
            if spec.maxtext_ring_kernel
            else "runs jax's splash, which masks other documents' keys by segment ids inside the causal "
            "mask's blocks and skips none of them: the unpacked rows' attention work"
        )
        problems.append(
            f"model {model.name!r} packs documents of {model.documents} tokens, priced with the work across "
            f"documents skipped, and MaxText 0.2.5's {spec.maxtext_name} {more}; plan ulysses (whose tokamax "
            f"splash skips other documents' blocks), or the unpacked model (documents=0) to price what MaxText does"
        )
    return problems


def kv_heads_per_tensor_shard(model: ModelSpec, tensor):
    """KV heads on one tensor shard: K/t (`heads_check` requires t to divide K)."""
    return model.num_kv_heads / np.asarray(tensor, dtype=float)


def tensor_shard_heads(x) -> tuple:
    """(query heads, KV heads) on one tensor shard of a `Shape` or `Candidates`."""
    return x.model.num_heads / np.asarray(x.tensor, dtype=float), kv_heads_per_tensor_shard(x.model, x.tensor)


def heads_check(shape: Shape) -> Violation | None:
    """Tensor parallelism splits query heads and KV heads (the runtime shards both over 'tensor')."""
    m, t = shape.model, shape.tensor
    if m.num_heads % t:
        return Violation("heads", f"num_heads={m.num_heads} not divisible by tensor={t}")
    if m.num_kv_heads % t:
        return Violation("heads", f"num_kv_heads={m.num_kv_heads} not divisible by tensor={t}")
    return None


def splash_blocks(q_len: int, kv_len: int, block_q: int, block_kv: int, q_run: float = float("inf")):
    """The blocks splash uses in a `q_len` × `kv_len` call (each capped at its length), or the rule they
    break as a sentence: each divides its length, the key block is a multiple of `SPLASH_LANES`, and a
    query block lies within one run of consecutive query positions of `q_run` tokens (a zigzag chunk)."""
    bq, bkv = min(block_q, q_len), min(block_kv, kv_len)
    if q_len % bq or kv_len % bkv:
        return None, (
            f"splash blocks (block_q={bq}, block_kv={bkv}) must divide the local attention lengths "
            f"(q={q_len}, kv={kv_len}); choose block sizes that divide them"
        )
    if bkv % SPLASH_LANES:
        return None, (
            f"splash key block {bkv} (local kv length {kv_len}) must be a multiple of {SPLASH_LANES}; use a "
            f"longer sequence per device or block_kv a multiple of {SPLASH_LANES}"
        )
    if q_run < q_len and q_run % bq:
        return None, (
            f"query block {bq} straddles two load-balancing chunks of {int(q_run)} tokens; use block_q "
            f"dividing the chunk length {int(q_run)}"
        )
    return (bq, bkv), None


def _calls_made(spec: StrategySpec, shape: Shape):
    """`spec`'s splash calls on `shape` that it makes (a count above 0)."""
    return (c for c in spec.kernel_calls(shape, spec.layout(shape)) if np.all(np.asarray(c.count) > 0))


def block_check(spec: StrategySpec, shape: Shape, block_q: int, block_kv: int) -> str | None:
    """The first of `spec`'s splash calls on `shape` whose blocks break `splash_blocks`' rule, as its sentence."""
    for call in _calls_made(spec, shape):
        _, problem = splash_blocks(int(call.q_len), int(call.kv_len), block_q, block_kv, call.q_block_cap)
        if problem:
            return problem
    return None


def lane_check(spec: StrategySpec, shape: Shape) -> Violation | None:
    """Every splash call's shortest query run and key length must be a multiple of `SPLASH_LANES`."""
    for call in _calls_made(spec, shape):
        for what, length in (("query", min(call.q_len, call.q_block_cap)), ("key", call.kv_len)):
            if length % SPLASH_LANES:
                need = SPLASH_LANES * shape.seq_len // math.gcd(shape.seq_len, int(length) or 1)
                return Violation(
                    "sequence split",
                    f"{spec.name} gives splash calls of {int(length)} {what} tokens, "
                    f"not a multiple of {SPLASH_LANES} (the TPU lane width splash "
                    f"blocks need); use a seq_len that is a multiple of {need}",
                )
    return None
