"""The splash attention kernel (jax's Pallas TPU kernel) behind one small interface.

Causal or full block metadata is built arithmetically (O(blocks), never O(S²)) and checked against
the chip's SMEM; a local mask's (sliding window, chunks) comes from `cost_models.masks`, its tables
shrunk to the blocks it visits as splash's `process_mask` shrinks them. `attend` is differentiable;
`attend_with_lse` and `attend_bwd` serve blocks merged by log-sum-exp. Splash does not scale logits:
callers scale q. Arrays are `[heads, seq, head_dim]`, the heads a multiple of the kv heads.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_mask_info import MaskInfo

from cost_models import masks
from cost_models.compute import fused_backward_key_chunks, splash_row_groups, splash_smem_bytes
from cost_models.document_tiles import computed_tiles
from cost_models.errors import CpplanError
from cost_models.remat import ATTENTION_OUTPUT
from cost_models.strategies.base import splash_blocks

# the kernel's saved output and log-sum-exp go by the attention output's checkpoint name, so a
# policy that keeps "context" does not run the forward kernel again in the backward
RESIDUALS_NAME = ATTENTION_OUTPUT
SegmentIds = sk.SegmentIds


def causal_mask_function(q_ids, kv_ids):
    """The causal rule evaluated inside the kernel on partial blocks: a query sees keys at or before it."""
    return q_ids >= kv_ids


@dataclass(frozen=True)
class KernelConfig:
    """Static settings shared by every kernel call of a step."""

    block_q: int  # upper bound: a shorter call uses its own length
    block_kv: int  # likewise
    interpret: bool  # Pallas interpret mode (CPU) instead of Mosaic (TPU)
    smem_bytes: int = 0  # the chip's scalar memory; 0 skips the check (CPU)
    # the backward as one kernel forming dq (as per-key-block partials, summed after), dk and dv, rather
    # than a dq kernel and a dK/dV kernel; it walks whole (unshrunk) dK/dV tables
    fused_backward: bool = False
    # the device's TensorCores: an unpacked call's rows are vmapped over this many groups where they split
    # evenly, the one grid dimension the compiler spreads a backward over (`cost_models.compute`)
    cores: int = 1
    # the device's HBM, which bounds a fused backward's dq partials (`compute.fused_backward_key_chunks`);
    # 0: unbounded
    hbm_bytes: int = 0

    def kernel(self, fwd, dq, dkv, mask_function, q_len: int, kv_len: int, **fields) -> "Kernel":
        """A `Kernel` of these settings for a `q_len` × `kv_len` call with the given mask tables."""
        blocks = self.block_sizes(q_len, kv_len)
        return Kernel(
            fwd, dq, dkv, mask_function, blocks, self.interpret, cores=self.cores, hbm_bytes=self.hbm_bytes, **fields
        )

    def blocks(self, q_len: int, kv_len: int, q_run: float = float("inf")) -> tuple[int, int]:
        """Block sizes for a `q_len` × `kv_len` call whose query positions run consecutively `q_run` tokens at
        a time (`splash_blocks`' rule).

        Raises:
            CpplanError: a length is not a multiple of its block, a key block is not a multiple of 128, or a
                query block straddles two runs.
        """
        blocks, problem = splash_blocks(q_len, kv_len, self.block_q, self.block_kv, q_run)
        if problem:
            raise CpplanError(f"{problem}.")
        return blocks

    def block_sizes(self, q_len: int, kv_len: int) -> sk.BlockSizes:
        """Splash `BlockSizes` for a call, the same blocks for the forward, dq and dkv kernels (the fused
        backward has no dq kernel, and splash refuses dq blocks with it)."""
        bq, bkv = self.blocks(q_len, kv_len)
        dq = {} if self.fused_backward else dict(block_q_dq=bq, block_kv_dq=bkv)
        return sk.BlockSizes(
            block_q=bq,
            block_kv=bkv,
            block_kv_compute=bkv,
            block_q_dkv=bq,
            block_kv_dkv=bkv,
            block_kv_dkv_compute=bkv,
            use_fused_bwd_kernel=self.fused_backward,
            **dq,
        )


def _downcast(array: np.ndarray) -> np.ndarray:
    """The smallest integer type that holds the table, as splash stores scalar-memory tables."""
    top = int(array.max()) if array.size else 0
    for dtype in (np.int8, np.int16):
        if top <= np.iinfo(dtype).max:
            return array.astype(dtype)
    return array.astype(np.int32)


def _next_data(any_blocks: np.ndarray, *, is_dkv: bool) -> np.ndarray:
    """Splash's `data_next`: per grid step, the index (kv for forward and dq, q for dkv) of the first
    non-empty block at or after it in the kernel's iteration order, wrapping round."""
    nq, nk = any_blocks.shape
    flat = (any_blocks.T if is_dkv else any_blocks).ravel()
    positions = np.where(flat, np.arange(flat.size), flat.size)
    following = np.minimum.accumulate(positions[::-1])[::-1]
    if flat.any():
        following = np.where(following == flat.size, positions.min(), following)
    else:
        following = np.zeros_like(following)
    index = following % (nq if is_dkv else nk)
    index = index.reshape((nk, nq) if is_dkv else (nq, nk))
    return (index.T if is_dkv else index).astype(np.int32)


def causal_blocks(
    q_block_starts: np.ndarray, kv_len: int, bq: int, bkv: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Causal metadata `(block_mask, data_next_fwd, data_next_dkv)`, each `[..., nq, nk]` int32, from each
    query block's first position `[..., nq]` (keys are 0..kv_len-1); block_mask is splash's 0 (empty),
    1 (partial) or 2 (full)."""
    starts = np.asarray(q_block_starts, dtype=np.int64)[..., None]
    kv_first = np.arange(kv_len // bkv, dtype=np.int64) * bkv
    any_ = starts + bq - 1 >= kv_first
    all_ = starts >= kv_first + bkv - 1
    block_mask = np.where(all_, 2, np.where(any_, 1, 0)).astype(np.int32)
    flat_any = any_.reshape(-1, *any_.shape[-2:])
    fwd = np.stack([_next_data(a, is_dkv=False) for a in flat_any]).reshape(block_mask.shape)
    dkv = np.stack([_next_data(a, is_dkv=True) for a in flat_any]).reshape(block_mask.shape)
    return block_mask, fwd, dkv


@dataclass(frozen=True)
class Kernel:
    """A splash kernel for one local mask: its MaskInfos (arrays may be traced) and static settings."""

    fwd: MaskInfo
    dq: MaskInfo
    dkv: MaskInfo
    mask_function: object  # None for a full mask
    block_sizes: sk.BlockSizes
    interpret: bool
    segments: SegmentIds | None = None  # packed documents' ids, batched (or one row for every sequence)
    chunks: "ChunkIds | None" = None  # a chunked mask's chunk of each query and key, masked as segments
    smem_bytes: int = 0  # a full kernel's: the chip's scalar memory, for the tables segment ids give it
    cores: int = 1  # KernelConfig.cores
    hbm_bytes: int = 0  # KernelConfig.hbm_bytes

    def with_segments(self, q_ids: jax.Array | None, kv_ids: jax.Array | None) -> "Kernel":
        """This kernel also masked by document (`[batch, q_len]`, `[batch, kv_len]` ids; None: unpacked),
        its tables pruned to the tiles whose ids may meet in some row (`_pruned`). Splash's dK/dV kernel
        reads query ids across lanes, so query blocks must be multiples of 128, which every strategy's
        calls already are."""
        if self.chunks is not None:
            q_ids, kv_ids = self.chunks.combined(q_ids, kv_ids)
        if q_ids is None:
            return self
        segments = SegmentIds(q_ids, kv_ids)
        kernel = self if self.fwd.block_mask is not None else self._with_full_tables(q_ids.shape[-1], kv_ids.shape[-1])
        meet = _meeting_tiles(segments, self.block_sizes)
        return dataclasses.replace(
            kernel,
            fwd=_pruned(kernel.fwd, meet, is_dkv=False),
            dq=_pruned(kernel.dq, meet, is_dkv=False),
            dkv=_pruned(kernel.dkv, meet, is_dkv=True),
            segments=segments,
        )

    def _with_full_tables(self, q_len: int, kv_len: int) -> "Kernel":
        """A full kernel with the tables of every tile, for segment ids to prune.

        Raises:
            CpplanError: the tables overflow the chip's SMEM.
        """
        bq, bkv = self.block_sizes.block_q, self.block_sizes.block_kv
        check_smem(q_len, kv_len, KernelConfig(bq, bkv, self.interpret, self.smem_bytes))
        block_mask, fwd, dkv = (jnp.asarray(t) for t in _static_full(q_len // bq, kv_len // bkv))
        fwd_info = MaskInfo(fwd, None, block_mask, None, None)
        return dataclasses.replace(self, fwd=fwd_info, dq=fwd_info, dkv=MaskInfo(dkv, None, block_mask, None, None))

    def key_chunks(self, q: jax.Array, k: jax.Array) -> int:
        """The chunks of its keys this kernel's backward runs over for folded `q` and `k`: more than one only
        for a fused backward whose dq partials would pass their share of the HBM (`fused_backward_key_chunks`,
        which the price reads too)."""
        if not self.block_sizes.use_fused_bwd_kernel:
            return 1
        return int(
            fused_backward_key_chunks(
                q.shape[0],
                q.shape[1],
                k.shape[1],
                head_dim=q.shape[2],
                block_kv=self.block_sizes.block_kv_dkv,
                act_bytes=q.dtype.itemsize,
                hbm_bytes=self.hbm_bytes,
            )
        )

    def key_chunk(self, index: int, chunks: int, kv_len: int) -> "Kernel":
        """This kernel's fused backward over the `index`-th of `chunks` equal runs of its `kv_len` keys: the
        dK/dV tables' columns of those keys (their entries name query blocks, all of which the chunk's call
        keeps), the queries' positions counted from the chunk's first key, as the mask rule compares them
        with a key's index in the call, and the keys' segment ids."""
        if self.chunks is not None:
            raise CpplanError("a chunked mask's kernel runs no fused backward, so its keys are never chunked.")
        width = kv_len // chunks
        blocks = width // self.block_sizes.block_kv_dkv
        columns = slice(index * blocks, (index + 1) * blocks)
        info = self.dkv
        dkv = info._replace(
            data_next=None if info.data_next is None else info.data_next[..., columns],
            block_mask=None if info.block_mask is None else info.block_mask[..., columns],
            q_sequence=None if info.q_sequence is None else info.q_sequence - index * width,
        )
        segments = self.segments
        if segments is not None:
            segments = SegmentIds(segments.q, segments.kv[..., index * width : (index + 1) * width])
        return dataclasses.replace(self, fwd=dkv, dq=dkv, dkv=dkv, segments=segments)

    def splash(self, *, save_residuals: bool) -> sk.SplashAttentionKernel:
        """jax's kernel object for this mask."""
        return sk.SplashAttentionKernel(
            self.fwd,
            self.dq,
            self.dkv,
            block_sizes=self.block_sizes,
            is_mqa=False,
            save_residuals=save_residuals,
            mask_value=sk.DEFAULT_MASK_VALUE,
            attn_logits_soft_cap=None,
            residual_checkpoint_name=RESIDUALS_NAME,
            mask_function=self.mask_function,
            interpret=self.interpret,
        )


# a kernel's tables and ids are data, its settings static: `attend`'s custom VJP carries it as a residual
jax.tree_util.register_dataclass(
    Kernel,
    data_fields=["fwd", "dq", "dkv", "segments", "chunks"],
    meta_fields=["mask_function", "block_sizes", "interpret", "smem_bytes", "cores", "hbm_bytes"],
)


def full_kernel(q_len: int, kv_len: int, config: KernelConfig) -> Kernel:
    """A kernel where every query sees every key (no metadata: splash visits every block; packed rows
    give it tables to prune, `Kernel.with_segments`)."""
    empty = MaskInfo(None, None, None, None, None)
    return config.kernel(empty, empty, empty, None, q_len, kv_len, smem_bytes=config.smem_bytes)


def check_smem(q_len: int, kv_len: int, config: KernelConfig, need: int | None = None) -> None:
    """Raises CpplanError when a kernel's metadata would not fit the chip's scalar memory: a causal
    kernel's whole tables, or `need` bytes (a local mask's shrunk tables)."""
    bq, bkv = config.blocks(q_len, kv_len)
    if need is None:
        need = int(splash_smem_bytes(q_len, kv_len, block_q=bq, block_kv=bkv))
    if config.smem_bytes and need > config.smem_bytes:
        raise CpplanError(
            f"splash mask metadata for a {q_len}x{kv_len} attention with blocks {bq}x{bkv} needs {need} bytes "
            f"of scalar memory, more than the chip's {config.smem_bytes}; use larger block_q/block_kv or a "
            f"strategy with shorter local attention (ring/USP)."
        )


@lru_cache(maxsize=64)
def _static_causal(q_len: int, kv_len: int, bq: int, bkv: int):
    block_mask, fwd, dkv = causal_blocks(np.arange(q_len // bq) * bq, kv_len, bq, bkv)
    return _downcast(block_mask[None]), _downcast(fwd[None]), _downcast(dkv[None])


@lru_cache(maxsize=64)
def _static_full(nq: int, nk: int):
    every = np.ones((nq, nk), dtype=bool)
    tables = (np.full((nq, nk), 2), _next_data(every, is_dkv=False), _next_data(every, is_dkv=True))
    return tuple(_downcast(t[None]) for t in tables)


def _meeting_tiles(segments: SegmentIds, block_sizes: sk.BlockSizes) -> jax.Array:
    """`[q blocks, key blocks]`: the tiles whose segment ids may meet in some row of the call, by the
    rule the price counts (`cost_models.document_tiles.computed_tiles`), in the graph."""
    rows = lambda ids: ids.reshape(-1, ids.shape[-1])  # one row of (chunk) ids serves every sequence
    return computed_tiles(True, rows(segments.q), rows(segments.kv), block_sizes.block_q, block_sizes.block_kv)


def _pruned(info: MaskInfo, meet: jax.Array, *, is_dkv: bool) -> MaskInfo:
    """`info` with the entries of tiles outside `meet` zeroed. An entry's tile is its query row and its
    data_next's key block (forward, dq), or data_next's query block and its key column (dK/dV), shrunk
    or not. data_next stays: splash still fetches the skipped tile's block but computes nothing."""
    mask, following = info.block_mask, info.data_next.astype(jnp.int32)
    slots = jnp.arange(mask.shape[-1 if is_dkv else -2])
    q, kv = (following, slots[None, None, :]) if is_dkv else (slots[None, :, None], following)
    return info._replace(block_mask=jnp.where(meet[q, kv], mask, 0).astype(mask.dtype))


def causal_kernel(q_len: int, kv_len: int, config: KernelConfig) -> Kernel:
    """A causal kernel over local indices: query i sees keys 0..i.

    Raises:
        CpplanError: bad block sizes, or metadata that overflows SMEM.
    """
    check_smem(q_len, kv_len, config)
    bq, bkv = config.blocks(q_len, kv_len)
    block_mask, fwd, dkv = (jnp.asarray(a) for a in _static_causal(q_len, kv_len, bq, bkv))
    q_sequence = jnp.arange(q_len, dtype=jnp.int32)
    fwd_info = MaskInfo(fwd, None, block_mask, None, q_sequence)
    dkv_info = MaskInfo(dkv, None, block_mask, None, q_sequence)
    return config.kernel(fwd_info, fwd_info, dkv_info, causal_mask_function, q_len, kv_len)


def block_kernel(q_len: int, kv_len: int, config: KernelConfig, *, mask: masks.AttentionMask) -> Kernel:
    """A kernel of queries and keys both at positions 0.. under a layer's mask: `causal_kernel`,
    `full_kernel`, or `mask_kernel` for a sliding window or chunks.

    Raises:
        CpplanError: bad block sizes, or metadata that overflows SMEM.
    """
    if mask.local:
        return mask_kernel(mask, np.arange(q_len)[None], np.zeros(1, dtype=np.int64), kv_len, None, config)
    return (causal_kernel if mask.causal else full_kernel)(q_len, kv_len, config)


@dataclass(frozen=True)
class MaskFunction:
    """A layer's mask evaluated inside the kernel on partial blocks. Splash hands it the queries'
    `q_sequence` (position − the call's first key position) and the keys' index in the call: a window
    and causality depend only on that difference; a chunk boundary does too when keys start at a
    multiple of the chunk (else the kernel masks chunks by segment ids, `ChunkIds`)."""

    mask: masks.AttentionMask

    def __call__(self, q_ids, kv_ids):
        return self.mask.allows(q_ids, kv_ids)


@dataclass(frozen=True)
class ChunkIds:
    """The chunk of each query `[q_len]` and key `[kv_len]` of a call whose keys start off a chunk
    boundary, and the chunks in the sequence (`count`): the kernel masks causally and by these as segment
    ids, combined with documents' ids as `document · count + chunk`, equal exactly when both are."""

    q: jax.Array
    kv: jax.Array
    count: int

    def combined(self, q_ids, kv_ids):
        """Segment ids masking by chunk and, where rows are packed (`[batch, len]` ids), by document."""
        if q_ids is None:
            return self.q, self.kv
        # documents are numbered from 1 in each row, so at most one per token: ids stay under (len+1)·count
        if (q_ids.shape[1] + kv_ids.shape[1] + 1) * self.count >= np.iinfo(np.int32).max:
            raise CpplanError(
                f"packed rows with a chunked mask whose chunks straddle the ring's blocks combine document and "
                f"chunk ids as document·{self.count} + chunk, which overflows int32 at this length; use a chunk "
                f"that divides the ring block, or fewer, longer chunks."
            )
        return q_ids * self.count + self.q, kv_ids * self.count + self.kv


jax.tree_util.register_dataclass(ChunkIds, data_fields=["q", "kv"], meta_fields=["count"])


def shrunk_tables(block_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Splash's shrunk grid of `[ranks, nq, nk]` block-mask entries: forward/dq `(block_mask, data_next)`
    `[ranks, nq, width]` listing each query row's non-empty key blocks (width: the most in any row,
    padded with 0s after), and dK/dV's `[ranks, height, nk]` listing each key column's non-empty query
    blocks (padded with 0s before), as `splash_attention_mask_info.process_mask` shrinks them."""
    nonzero = block_mask != 0
    counts = nonzero.sum(-1)
    width = max(int(counts.max()), 1)
    cols = np.argsort(~nonzero, axis=-1, kind="stable")[..., :width]
    valid = np.arange(width) < counts[..., None]
    fwd_mask = np.where(valid, np.take_along_axis(block_mask, cols, -1), 0)
    fwd_next = np.where(valid, cols, 0)
    counts = nonzero.sum(-2)
    height = max(int(counts.max()), 1)
    rows = np.argsort(~nonzero, axis=-2, kind="stable")
    index = np.arange(height)[:, None] - (height - counts[..., None, :])  # front padding
    rows = np.take_along_axis(rows, np.maximum(index, 0), -2)
    dkv_mask = np.where(index >= 0, np.take_along_axis(block_mask, rows, -2), 0)
    dkv_next = np.where(index >= 0, rows, 0)
    return fwd_mask, fwd_next, dkv_mask, dkv_next


def _rank_row(table: np.ndarray, rank, *, keep_dim: bool):
    """The row of a per-rank table for `rank` (traced inside `shard_map`), static where every rank's is the same."""
    if rank is None or (table == table[:1]).all():
        return jnp.asarray(table[:1] if keep_dim else table[0])
    return jax.lax.dynamic_index_in_dim(jnp.asarray(table), rank, axis=0, keepdims=keep_dim)


def mask_kernel(
    mask: masks.AttentionMask,
    q_positions: np.ndarray,
    kv_first: np.ndarray,
    kv_len: int,
    rank,
    config: KernelConfig,
    *,
    seq_len: int = 0,
) -> Kernel:
    """A kernel of a local `mask` for queries at `q_positions` `[ranks, q_len]` (consecutive within a
    query block) and `kv_len` keys from position `kv_first` `[ranks]`; the row for `rank` (traced, or
    None for one row). `seq_len` (the sequence's length) numbers chunks where keys start off a chunk boundary.

    Raises:
        CpplanError: bad block sizes, a query block straddling two runs of positions, or SMEM overflow.
    """
    if config.fused_backward:  # its dq partials are indexed by grid position, which a shrunk grid reorders
        raise CpplanError(
            "splash's fused backward walks whole dK/dV tables; a local mask's are shrunk: run dq and dK/dV."
        )
    q_len = q_positions.shape[1]
    starts, bq, bkv = _query_block_starts(q_positions, kv_len, config)
    kv_blocks = kv_first[:, None] + np.arange(kv_len // bkv) * bkv
    table = mask.block_mask(starts[..., None], kv_blocks[:, None, :], bq, bkv)
    tables = [_downcast(t) for t in shrunk_tables(table)]
    # one rank's tables in scalar memory: the forward's (or dq's) pair, then dK/dV's
    check_smem(
        q_len, kv_len, config, max(tables[0][0].nbytes + tables[1][0].nbytes, tables[2][0].nbytes + tables[3][0].nbytes)
    )
    fwd_mask, fwd_next, dkv_mask, dkv_next = (_rank_row(t, rank, keep_dim=True) for t in tables)
    q_sequence = _rank_row((q_positions - kv_first[:, None]).astype(np.int32), rank, keep_dim=False)
    fwd = MaskInfo(fwd_next, None, fwd_mask, None, q_sequence)
    dkv = MaskInfo(dkv_next, None, dkv_mask, None, q_sequence)
    exact = mask.kind is not masks.MaskKind.CHUNKED or not (kv_first % mask.size).any()
    chunks = None
    if not exact:
        if not seq_len:
            raise CpplanError("a chunked mask whose keys start off a chunk boundary needs the sequence's length.")
        keys = kv_first[:, None] + np.arange(kv_len)
        count = -(-seq_len // mask.size)
        chunks = ChunkIds(
            *(_rank_row((x // mask.size).astype(np.int32), rank, keep_dim=False) for x in (q_positions, keys)), count
        )
    function = MaskFunction(mask if exact else masks.CAUSAL)
    return config.kernel(fwd, fwd, dkv, function, q_len, kv_len, chunks=chunks)


def _query_block_starts(q_positions: np.ndarray, kv_len: int, config: KernelConfig):
    """`(first position of each query block [ranks, nq], block_q, block_kv)` of a call whose queries sit at
    `q_positions` `[ranks, q_len]`.

    Raises:
        CpplanError: a query block straddles two runs of positions, or bad blocks.
    """
    q_len = q_positions.shape[1]
    # a block lies within one run where it divides every offset at which a run begins
    _, breaks = np.nonzero(np.diff(q_positions, axis=-1) != 1)
    q_run = math.gcd(q_len, *(int(b) + 1 for b in breaks))
    bq, bkv = config.blocks(q_len, kv_len, q_run)
    return q_positions[:, ::bq], bq, bkv


def causal_kernel_per_rank(q_positions: np.ndarray, kv_len: int, rank, config: KernelConfig) -> Kernel:
    """A causal kernel whose queries sit at different positions on each rank: `q_positions` `[ranks,
    q_len]` (consecutive within a query block), keys 0..kv_len-1; the tables' row is picked by `rank`
    (traced inside `shard_map`).

    Raises:
        CpplanError: a query block straddles two runs of positions, or the metadata overflows SMEM.
    """
    q_len = q_positions.shape[1]
    check_smem(q_len, kv_len, config)
    starts, bq, bkv = _query_block_starts(q_positions, kv_len, config)
    tables = causal_blocks(starts, kv_len, bq, bkv)
    block_mask, fwd, dkv = (
        jax.lax.dynamic_index_in_dim(jnp.asarray(_downcast(t)), rank, axis=0, keepdims=True) for t in tables
    )
    q_sequence = jnp.asarray(q_positions, dtype=jnp.int32)[rank]
    fwd_info = MaskInfo(fwd, None, block_mask, None, q_sequence)
    dkv_info = MaskInfo(dkv, None, block_mask, None, q_sequence)
    return config.kernel(fwd_info, fwd_info, dkv_info, causal_mask_function, q_len, kv_len)


def _per_row(call, kernel: Kernel, *arrays):
    """`call(*arrays, segment_ids)` with folded `[batch·heads, …]` arrays (the second, k, holds the KV
    rows), mapped over `splash_row_groups` of the rows, and first over the batch where the kernel has
    segment ids (one row of ids per kernel call): the backward's kernels split only vmapped dimensions
    over a device's cores (docs/measurements.md, "Which TensorCores splash's backward runs on")."""
    segments = kernel.segments
    merge = lambda x: x.reshape(-1, *x.shape[2:])
    if segments is None or segments.q.ndim == 1:  # unpacked, or one row of (chunk) ids for every sequence
        groups = int(splash_row_groups(arrays[1].shape[0], kernel.cores))
        if groups == 1:
            return call(*arrays, segments)
        split = lambda x: x.reshape(groups, x.shape[0] // groups, *x.shape[1:])
        out = jax.vmap(lambda *xs: call(*xs, segments))(*(split(x) for x in arrays))
        return jax.tree.map(merge, out)
    # packed rows: each row's own ids, and within a row the same groups of its heads
    batch = segments.q.shape[0]
    groups = int(splash_row_groups(arrays[1].shape[0] // batch, kernel.cores))
    split = lambda x: x.reshape(batch, groups, x.shape[0] // (batch * groups), *x.shape[1:])

    def row(ids_q, ids_kv, *xs):
        return jax.vmap(lambda *ys: call(*ys, SegmentIds(ids_q, ids_kv)))(*xs)

    out = jax.vmap(row)(segments.q, segments.kv, *(split(x) for x in arrays))
    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[3:]), out)


def attend(kernel: Kernel, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Attention output `[heads, q_len, d]`, differentiable: splash's own backward kernels, or where they run
    over chunks of the keys (`Kernel.key_chunks`), `attend_bwd`'s."""
    if kernel.key_chunks(q, k) > 1:
        return _attend_in_key_chunks(kernel, q, k, v)
    return _per_row(lambda q, k, v, ids: kernel.splash(save_residuals=False)(q, k, v, segment_ids=ids), kernel, q, k, v)


@jax.custom_vjp
def _attend_in_key_chunks(kernel: Kernel, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    return _forward_with_lse(kernel, q, k, v)[0]


def _attend_in_key_chunks_fwd(kernel, q, k, v):
    out, lse = _forward_with_lse(kernel, q, k, v)
    # named here, where a remat policy sees them: splash names its own inside the call it makes, which is
    # opaque from this rule, and a policy keeping "context" would run the forward kernel again
    out, lse = (checkpoint_name(x, RESIDUALS_NAME) for x in (out, lse))
    return out, (kernel, q, k, v, out, lse)


def _attend_in_key_chunks_bwd(residuals, d_out):
    kernel, q, k, v, out, lse = residuals
    return (None, *attend_bwd(kernel, q, k, v, out, lse, d_out))


_attend_in_key_chunks.defvjp(_attend_in_key_chunks_fwd, _attend_in_key_chunks_bwd)


def attend_with_lse(kernel: Kernel, q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Output `[heads, q_len, d]` and natural-log log-sum-exp `[heads, q_len]` (fp32); forward only.
    Packed rows: a query that sees no key in the tiles computed gets a log-sum-exp near splash's mask
    value, and one whose every tile is pruned a log-sum-exp of −inf and a NaN output (0/0); a merge must
    give both no weight."""
    return _forward_with_lse(kernel, q, k, v)


def _forward_with_lse(kernel: Kernel, q, k, v):
    """`attend_with_lse`'s splash call, which `attend` over key chunks makes too."""

    def call(q, k, v, ids):
        out, (lse,) = kernel.splash(save_residuals=True)(q, k, v, segment_ids=ids)
        return out, lse

    return _per_row(call, kernel, q, k, v)


def attend_bwd(kernel: Kernel, q, k, v, out, lse, d_out) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`(dq, dk, dv)` of one block given the merged `out` and `lse` of all blocks: splash's backward
    then computes P = exp(s − lse), dS = P ⊙ (dP − rowsum(out ⊙ d_out)), the block's exact share of
    the merged gradient. Calls the private entry of splash's custom VJP (jax has no public one). A fused
    backward whose dq partials would pass their share of the HBM runs chunk by chunk of the keys
    (`Kernel.key_chunks`), each chunk's dq added into an fp32 sum before the next chunk runs."""
    chunks = kernel.key_chunks(q, k)
    if chunks == 1:
        return _attend_bwd_call(kernel, q, k, v, out, lse, d_out)
    kv_len, width = k.shape[1], k.shape[1] // chunks
    dq, dk, dv = jnp.zeros(q.shape, jnp.float32), [], []
    for index in range(chunks):
        if index:  # the next chunk's partials only once this one's are summed: one chunk's are held at a time
            q, out, lse, d_out, dq = jax.lax.optimization_barrier((q, out, lse, d_out, dq))
        keys = slice(index * width, (index + 1) * width)
        chunk = kernel.key_chunk(index, chunks, kv_len)
        dq_chunk, dk_chunk, dv_chunk = _attend_bwd_call(chunk, q, k[:, keys], v[:, keys], out, lse, d_out)
        dq = dq + dq_chunk.astype(jnp.float32)
        dk.append(dk_chunk)
        dv.append(dv_chunk)
    return dq.astype(q.dtype), jnp.concatenate(dk, axis=1), jnp.concatenate(dv, axis=1)


def _attend_bwd_call(kernel: Kernel, q, k, v, out, lse, d_out) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`attend_bwd`'s one splash backward call."""

    def call(q, k, v, out, lse, d_out, ids):
        residuals = (q, k, v, ids, None, out, lse, kernel.dq, kernel.dkv)
        _, _, _, dq, dk, dv, _, _ = sk._splash_attention_bwd(
            False,
            sk.DEFAULT_MASK_VALUE,
            False,
            kernel.block_sizes,
            None,
            kernel.mask_function,
            None,
            kernel.interpret,
            residuals,
            d_out,
        )
        return dq, dk, dv

    return _per_row(call, kernel, q, k, v, out, lse, d_out)
