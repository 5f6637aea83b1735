"""The blocks the price counts for a local call are the ones splash's own mask processing finds
(`splash_attention_mask_info.process_mask`, and `process_mask_dkv` for the dK/dV grid): computed
blocks, partly visible ones, and the widths of its shrunk grids, on 22 shapes."""

import numpy as np
import pytest

pytest.importorskip("jax")
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_masks  # noqa: E402
from jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_mask_info import (  # noqa: E402
    process_mask,
    process_mask_dkv,
)

from cost_models.masks import CallBlocks, call_blocks, chunked, sliding_window  # noqa: E402

pytestmark = [pytest.mark.pure, pytest.mark.runtime_extra]


def splash_mask(mask, q_start, q_len, kv_start, kv_len):
    """jax's mask object for the call: its local mask where it has one, else the rule as a table."""
    shape = (q_len, kv_len)
    if mask.kind == "sliding_window":
        return splash_masks.LocalMask(shape, (mask.size - 1, 0), offset=q_start - kv_start)
    if q_start == kv_start == 0:
        return splash_masks.ChunkedCausalMask(shape, mask.size)
    table = mask.allows(q_start + np.arange(q_len)[:, None], kv_start + np.arange(kv_len)[None, :])
    return splash_masks.NumpyMask(np.asarray(table))


def dense(info, rows: int, columns: int, *, transpose=False) -> np.ndarray:
    """A shrunk MaskInfo's block mask laid out per (query block, key block)."""
    table = np.zeros((columns, rows) if transpose else (rows, columns), dtype=int)
    block_mask, data_next = np.asarray(info.block_mask)[0], np.asarray(info.data_next)[0]
    for i, j in zip(*np.nonzero(block_mask)):
        if transpose:  # the dK/dV grid runs over key blocks, its shrunk axis over query blocks
            table[j, data_next[i, j]] = block_mask[i, j]
        else:
            table[i, data_next[i, j]] = block_mask[i, j]
    return table.T if transpose else table


SHAPES = [
    # mask, q_start, q_len, kv_start, kv_len, block_q, block_kv
    *[(sliding_window(w), 0, 2048, 0, 2048, b, b) for w in (1, 100, 128, 300, 1024) for b in (128, 256)],
    (sliding_window(300), 2048, 1024, 1024, 1024, 128, 128),  # a ring hop one block back
    (sliding_window(1500), 4096, 1024, 2048, 1024, 128, 256),  # two blocks back
    (sliding_window(700), 1536, 512, 0, 2048, 128, 128),  # a rank's queries against gathered keys
    (sliding_window(64), 0, 1024, 0, 1024, 256, 128),
    *[(chunked(c), 0, 2048, 0, 2048, 128, 128) for c in (128, 200, 512, 1000)],
    (chunked(512), 0, 1024, 0, 1024, 256, 128),
    (chunked(300), 1024, 512, 512, 512, 128, 128),
    (chunked(700), 1536, 512, 0, 2048, 128, 256),
    (chunked(4096), 2048, 1024, 1024, 1024, 128, 128),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0].describe()}-{'-'.join(map(str, s[1:]))}")
def test_priced_blocks_are_splash_own(shape):
    mask, q_start, q_len, kv_start, kv_len, bq, bkv = shape
    jax_mask = splash_masks.MultiHeadMask([splash_mask(mask, q_start, q_len, kv_start, kv_len)])
    fwd, _ = process_mask(jax_mask, (bq, bkv))
    dkv, _ = process_mask_dkv(jax_mask, (bq, bkv))
    rows, columns = q_len // bq, kv_len // bkv
    table = dense(fwd, rows, columns)
    assert np.array_equal(dense(dkv, rows, columns, transpose=True), table)
    computed = table > 0
    splash = CallBlocks(
        computed=int(computed.sum()),
        partial=int((table == 1).sum()),
        row_width=int(np.asarray(fwd.block_mask).shape[-1]),
        column_width=int(np.asarray(dkv.block_mask).shape[-2]),
    )
    assert call_blocks(mask, q_start, q_len, kv_start, kv_len, bq, bkv) == splash
    # splash shrinks its grid to the widest row (column) of computed blocks
    assert splash.row_width == computed.sum(1).max() and splash.column_width == computed.sum(0).max()
