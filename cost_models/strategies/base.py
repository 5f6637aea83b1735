"""The protocol every context-parallel strategy implements, and the shapes it is given."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from cost_models.models import ModelSpec
from cost_models.vocabulary import CPStrategy


SPLASH_LANES = 128  # splash's key blocks must be multiples of the TPU lane width, in interpret mode too


@dataclass(frozen=True)
class Shape:
    """What decides whether a strategy can run a case: one candidate, scalars only."""

    model: ModelSpec
    seq_len: int
    ring: int  # size of the `context` axis
    ulysses: int  # size of the `context_ulysses` axis
    tensor: int
    zigzag: bool


@dataclass(frozen=True)
class Violation:
    """A rule a candidate breaks: a short category for grouping, and the sentence with numbers."""

    category: str
    reason: str


@dataclass(frozen=True)
class Layout:
    """How the attention kernel lies on one device (numpy arrays over candidates)."""

    q_heads: Any  # query heads per device inside the kernel
    kv_heads: Any  # key/value heads per device inside the kernel (after any replication)
    ring: Any  # ways the sequence is split for attention (1 = the kernel sees the whole sequence)
    q_len: Any  # query tokens of one kernel call
    kv_len: Any  # key tokens of one kernel call


@dataclass(frozen=True)
class KernelCall:
    """`count` splash calls a device makes per layer forward, of `q_len` × `kv_len` tokens
    (arrays over candidates); the backward runs its dq and dk/dv kernels over each. Query
    blocks are at most `q_block_cap` tokens (a block must not straddle two zigzag chunks);
    `causal` calls evaluate the mask rule on the blocks the diagonal cuts through."""

    count: Any
    q_len: Any
    kv_len: Any
    causal: bool = True
    q_block_cap: Any = float("inf")


@dataclass(frozen=True)
class CPCost:
    """A strategy's own traffic for one layer, forward and backward (arrays over candidates)."""

    forward_s: Any
    backward_s: Any
    exposed_forward_s: Any
    exposed_backward_s: Any
    buffer_bytes: Any  # attention buffers held at the peak of one layer
    # backward traffic a recomputed forward pass makes unnecessary (it re-creates what the
    # backward would fetch again, e.g. the gathered K/V); never hidden traffic
    recompute_reuses_s: Any = 0.0


class Strategy(Protocol):
    strategy: CPStrategy
    collective: str  # what its traffic is called in a breakdown

    def check(self, shape: Shape) -> "Violation | None":
        """None when the strategy runs this case, else the failed rule with its numbers."""

    def layout(self, x) -> Layout:
        """Kernel layout for the candidates in `x` (an `estimate.Candidates`)."""

    def kernel_calls(self, x, layout: Layout) -> tuple[KernelCall, ...]:
        """The splash calls one device makes per layer forward, as the runtime makes them."""

    def cost(self, x, layout: Layout, attention_fwd_s) -> CPCost:
        """Per-layer traffic; `attention_fwd_s` is the forward kernel time per layer."""


def one_call(x, layout: Layout) -> tuple[KernelCall, ...]:
    """The kernel calls of a strategy whose device attends its whole layout in one call."""
    return (KernelCall(1.0, layout.q_len, layout.kv_len),)


def kv_heads_per_tensor_shard(model: ModelSpec, tensor):
    """KV heads on one tensor shard: K/t (`heads_check` requires t to divide K)."""
    import numpy as np

    return model.num_kv_heads / np.asarray(tensor, dtype=float)


def sequence_check(shape: Shape, splits: int, what: str) -> Violation | None:
    """The sequence must split evenly (twice as finely under zigzag) into tile-aligned blocks."""
    pieces = splits * (2 if shape.zigzag else 1)
    if shape.seq_len % pieces:
        zig = " (2 × ring degree chunks for zigzag)" if shape.zigzag else ""
        return Violation("sequence split", f"seq_len={shape.seq_len} not divisible by {pieces} {what}{zig}")
    if (shape.seq_len // pieces) % SPLASH_LANES:
        return Violation("sequence split", f"local block of {shape.seq_len // pieces} tokens is not a multiple of "
                                           f"{SPLASH_LANES} (splash's key blocks are multiples of the lane width)")
    return None


def heads_check(shape: Shape) -> Violation | None:
    """Tensor parallelism splits query heads and KV heads (the runtime shards both over 'tensor')."""
    m, t = shape.model, shape.tensor
    if m.num_heads % t:
        return Violation("heads", f"num_heads={m.num_heads} not divisible by tensor={t}")
    if m.num_kv_heads % t:
        return Violation("heads", f"num_kv_heads={m.num_kv_heads} not divisible by tensor={t}")
    return None


def degree_check(shape: Shape, name: str, ring_ok, ulysses_ok, rule: str) -> Violation | None:
    """The strategy's own mesh rule (which context axes must be > 1)."""
    if ring_ok(shape.ring) and ulysses_ok(shape.ulysses):
        return None
    return Violation("mesh", f"{name} needs {rule} (got context={shape.ring}, context_ulysses={shape.ulysses})")


def context_axis_check(shape: Shape, name: str) -> Violation | None:
    """The rules of a strategy that splits the sequence over `context` alone (all-gather, ring)."""
    return (degree_check(shape, name, lambda r: r > 1, lambda u: u == 1, "context > 1 and context_ulysses = 1")
            or heads_check(shape) or sequence_check(shape, shape.ring, "context ranks"))
