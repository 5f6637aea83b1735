"""A local mask's splash tables (sliding window, chunks) equal splash's own: the block mask from
`cost_models.masks` shrunk to the blocks each query row (forward, dQ) and key column (dK/dV) visits,
against `process_mask`/`process_mask_dkv` evaluating the mask element by element."""

import numpy as np
import pytest

pytest.importorskip("jax")
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib  # noqa: E402
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mask_info  # noqa: E402

from cost_models import masks  # noqa: E402
from cost_models.errors import CpplanError  # noqa: E402
from runtime import splash  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

# mask, q_len, kv_len, block_q, block_kv, query offset (first query position − first key position)
SHAPES = [
    (masks.sliding_window(128), 1024, 1024, 128, 128, 0),
    (masks.sliding_window(100), 1024, 1024, 128, 128, 0),
    (masks.sliding_window(300), 2048, 2048, 256, 128, 0),
    (masks.sliding_window(300), 1024, 1024, 128, 256, 0),
    (masks.sliding_window(64), 512, 512, 64, 128, 0),
    (masks.sliding_window(200), 512, 512, 128, 128, 256),  # a ring hop one block back
    (masks.sliding_window(700), 512, 512, 128, 128, 512),
    (masks.sliding_window(200), 512, 512, 128, 128, 1024),  # beyond the window: every block empty
    (masks.chunked(256), 1024, 1024, 128, 128, 0),
    (masks.chunked(192), 1024, 1024, 128, 128, 0),
    (masks.chunked(300), 2048, 2048, 256, 256, 0),
    (masks.chunked(192), 512, 512, 128, 128, 384),  # keys start off a chunk boundary
    (masks.chunked(1000), 512, 256, 128, 128, 640),
]


def splash_own(mask, q_len, kv_len, offset):
    """Splash's lazy mask for the same pairs: its LocalMask/ChunkedCausalMask where one says it, else dense."""
    if mask.kind is masks.MaskKind.SLIDING:
        return mask_lib.LocalMask((q_len, kv_len), (mask.size - 1, 0), offset)
    if offset == 0:
        return mask_lib.ChunkedCausalMask((q_len, kv_len), mask.size)
    q = np.arange(q_len)[:, None] + 10_000 * mask.size  # any key start on a chunk grid of the same phase
    k0 = q[0, 0] - offset
    return mask_lib.NumpyMask(np.asarray(mask.allows(q, k0 + np.arange(kv_len)[None])))


@pytest.mark.parametrize("mask,q_len,kv_len,bq,bkv,offset", SHAPES, ids=[f"{s[0].describe()}-{s[1:]}" for s in SHAPES])
def test_shrunk_tables_equal_splash_process_mask(mask, q_len, kv_len, bq, bkv, offset):
    multi = mask_lib.MultiHeadMask([splash_own(mask, q_len, kv_len, offset)])
    kv_first = 5 * mask.size * 64 if mask.kind is masks.MaskKind.CHUNKED else 0
    q_first = kv_first + offset
    if mask.kind is masks.MaskKind.CHUNKED and offset:  # the phase splash_own used
        kv_first = 10_000 * mask.size - offset
        q_first = 10_000 * mask.size
    table = mask.block_mask(
        (q_first + np.arange(q_len // bq) * bq)[:, None], (kv_first + np.arange(kv_len // bkv) * bkv)[None], bq, bkv
    )
    fwd_mask, fwd_next, dkv_mask, dkv_next = splash.shrunk_tables(table[None])
    if not table.any():  # splash refuses a mask with nothing visible; the tables are one empty step wide
        assert fwd_mask.shape == (1, q_len // bq, 1) and not fwd_mask.any() and not dkv_mask.any()
        return
    fwd, _ = mask_info.process_mask(multi, (bq, bkv))
    dkv, _ = mask_info.process_mask_dkv(multi, (bq, bkv))
    np.testing.assert_array_equal(fwd_mask, fwd.block_mask)
    np.testing.assert_array_equal(fwd_next, fwd.data_next)
    np.testing.assert_array_equal(dkv_mask, dkv.block_mask)
    np.testing.assert_array_equal(dkv_next, dkv.data_next)
    assert fwd_mask.shape[-1] < kv_len // bkv or mask.size >= kv_len  # a small window shrinks the grid


def test_scalar_memory_is_checked_on_the_shrunk_tables():
    """A small window over a long sequence fits the SMEM its whole tables would overflow; a window as
    long as the sequence does not."""
    config = splash.KernelConfig(128, 128, interpret=True, smem_bytes=100_000)
    positions, start = np.arange(1 << 16)[None], np.zeros(1, dtype=np.int64)
    with pytest.raises(CpplanError, match="scalar memory"):
        splash.causal_kernel(1 << 16, 1 << 16, config)
    kernel = splash.mask_kernel(masks.sliding_window(256), positions, start, 1 << 16, None, config)
    assert kernel.fwd.block_mask.shape == (1, 512, 3)  # three key blocks per query row
    with pytest.raises(CpplanError, match=r"needs \d+ bytes of scalar memory.*larger block_q/block_kv"):
        splash.mask_kernel(masks.sliding_window(1 << 16), positions, start, 1 << 16, None, config)
