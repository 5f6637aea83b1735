"""Where tokamax's splash prunes tiles by segment ids (0.0.17 on MaxText's stack), the tiles priced for a
packed layout are the ones its own refined schedule keeps (`_refine_mask_info_with_segments`, vmapped
over a device's rows as MaxText calls it), on the causal natural-order layouts of test_document_tiles,
with a dense and a compacted grid."""

import numpy as np
import pytest

pytest.importorskip("jax")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

splash = pytest.importorskip("tokamax._src.ops.experimental.tpu.splash_attention.splash_attention_kernel")
if not hasattr(splash, "_refine_mask_info_with_segments"):
    pytest.skip("this tokamax's splash does not prune by segment ids (0.0.17 does)", allow_module_level=True)
from packed_layouts import packed_ids  # noqa: E402
from test_document_tiles import SHAPES, static_tiles  # noqa: E402
from tokamax._src.ops.experimental.tpu.splash_attention import base  # noqa: E402
from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_mask as mask_lib  # noqa: E402
from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_mask_info as mask_info  # noqa: E402

from cost_models.document_tiles import computed_tiles  # noqa: E402
from cost_models.masks import CAUSAL  # noqa: E402

pytestmark = [pytest.mark.pure, pytest.mark.runtime_extra]

CAUSAL_ROWS = [s for s in SHAPES if s[0] == CAUSAL and s[4] is None]


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("shape", CAUSAL_ROWS, ids=lambda s: f"{s[1]}-{s[2]}x{s[3]}-rows{s[5]}-seed{s[7]}")
def test_priced_tiles_are_tokamaxs_refined_schedule(shape, dynamic):
    _, length, bq, bkv, _, rows, documents, seed = shape
    ids = packed_ids(documents, rows=rows, length=length, seed=seed).astype(np.int32)
    info, _ = mask_info.process_mask(
        mask_lib.CausalMask(shape=(length, length)), (bq, bkv), return_dynamic_grid=dynamic
    )
    info = jax.tree_util.tree_map(jnp.asarray, info)

    def refine(row):
        segments = base.SegmentIds(row, row)
        kw = dict(q_blocks=length // bq, kv_blocks=length // bkv, bq=bq, bkv=bkv, is_dkv=False)
        return splash._refine_mask_info_with_segments(info, segments, **kw)[0]

    refined = jax.vmap(refine)(jnp.asarray(ids))  # the batch shares one schedule: take row 0's copy
    active = int(np.asarray(refined.num_active_blocks)[0, 0])
    q, kv, block_mask = (
        np.asarray(a)[0, :active] for a in (refined.active_rows, refined.active_cols, refined.block_mask)
    )
    theirs = np.zeros((length // bq, length // bkv), dtype=bool)
    theirs[q[block_mask > 0], kv[block_mask > 0]] = True
    positions = np.arange(length)
    assert np.array_equal(
        computed_tiles(static_tiles(CAUSAL, positions, positions, bq, bkv), ids, ids, bq, bkv), theirs
    )
