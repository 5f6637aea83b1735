"""The tiles priced for packed documents of varying length are the ones a kernel that prunes by segment
ids computes: exactly, per packed layout, against tokamax 0.0.17's rule written out here on its own
(`_segment_block_overlap`: [min, max] ids of each block meet, any over the vmapped rows) and against a
brute force over token pairs, on 24 shapes (windows, document distributions, zigzag on and off); and in
expectation over documents packed back to back, against the exact count averaged over seeded layouts."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packed_layouts import packed_ids

from cost_models.document_tiles import (
    computed_chance,
    computed_tiles,
    expected_computed_tiles,
    row_fraction_computed,
)
from cost_models.documents import histogram, lognormal
from cost_models.masks import CAUSAL, call_blocks, sliding_window

pytestmark = pytest.mark.pure

SHORT = histogram([40, 100, 300, 1000], [4, 3, 2, 1])
LONG = lognormal(600, 1.0)
SPREAD = lognormal(200, 2.0)


def kernel_order(length: int, ranks: int | None, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(query positions, key positions) of one call in the kernel's order: the whole row, or under zigzag
    with `ranks` ranks rank `rank`'s two chunks against every key in zigzag order."""
    positions = np.arange(length)
    if ranks is None:
        return positions, positions
    chunks = positions.reshape(2 * ranks, -1)
    order = np.concatenate([np.concatenate([chunks[r], chunks[2 * ranks - 1 - r]]) for r in range(ranks)])
    return np.concatenate([chunks[rank], chunks[2 * ranks - 1 - rank]]), order


def static_tiles(mask, q_pos, kv_pos, bq, bkv) -> np.ndarray:
    q_first, kv_first = q_pos[::bq], kv_pos[::bkv]
    return mask.block_visibility(q_first[:, None], kv_first[None, :], bq, bkv)[0]


def tokamax_rule(static, q_ids, kv_ids, bq, bkv) -> np.ndarray:
    """tokamax's refinement, tile by tile: kept where the static mask leaves it and, in some row, the
    query block's [min, max] ids and the key block's intersect."""
    keep = np.zeros_like(static)
    for i, j in zip(*np.nonzero(static)):
        for q, kv in zip(q_ids, kv_ids):
            qb, kb = q[i * bq : (i + 1) * bq], kv[j * bkv : (j + 1) * bkv]
            if qb.max() >= kb.min() and kb.max() >= qb.min():
                keep[i, j] = True
                break
    return keep


def brute_force(mask, q_pos, kv_pos, q_ids, kv_ids, bq, bkv) -> np.ndarray:
    """A tile is computed where some row has a (query, key) pair in it that the mask and the documents allow."""
    allowed = mask.allows(q_pos[:, None], kv_pos[None, :])
    pairs = (q_ids[:, :, None] == kv_ids[:, None, :]) & allowed
    nq, nk = len(q_pos) // bq, len(kv_pos) // bkv
    return pairs.reshape(len(pairs), nq, bq, nk, bkv).any(axis=(0, 2, 4))


SHAPES = [
    # mask, row length, bq, bkv, zigzag ranks (None: natural order), rows, documents, seed
    *[(CAUSAL, 1024, b, b, None, 1, d, s) for b in (64, 128) for d, s in ((SHORT, 1), (LONG, 2), (SPREAD, 3))],
    (CAUSAL, 1024, 128, 64, None, 1, SHORT, 4),
    (CAUSAL, 1024, 64, 256, None, 1, LONG, 5),
    *[(CAUSAL, 1024, 64, 64, None, r, SHORT, 6 + r) for r in (2, 4)],
    *[(sliding_window(w), 1024, 64, 64, None, 1, SHORT, 10 + w) for w in (1, 100, 300)],
    (sliding_window(200), 1024, 128, 64, None, 2, LONG, 20),
    *[(CAUSAL, 1024, 64, 64, 4, 1, d, 30 + i) for i, d in enumerate((SHORT, LONG, SPREAD))],
    (CAUSAL, 1024, 32, 64, 2, 1, SHORT, 40),
    (CAUSAL, 1024, 64, 64, 4, 3, LONG, 41),
    (CAUSAL, 2048, 128, 128, 8, 1, SPREAD, 42),
    (sliding_window(150), 1024, 64, 64, 4, 1, SHORT, 43),
    (CAUSAL, 512, 64, 64, None, 1, histogram([512]), 44),
]


@pytest.mark.parametrize(
    "shape", SHAPES, ids=lambda s: f"{s[0].describe()}-{s[1]}-{s[2]}x{s[3]}-zz{s[4]}-rows{s[5]}-seed{s[7]}"
)
def test_priced_tiles_are_the_kernel_rule_per_layout(shape):
    mask, length, bq, bkv, ranks, rows, documents, seed = shape
    ids = packed_ids(documents, rows=rows, length=length, seed=seed)
    for rank in range(ranks or 1):
        q_pos, kv_pos = kernel_order(length, ranks, rank)
        static = static_tiles(mask, q_pos, kv_pos, bq, bkv)
        q_ids, kv_ids = ids[:, q_pos], ids[:, kv_pos]
        priced = computed_tiles(static, q_ids, kv_ids, bq, bkv)
        assert np.array_equal(priced, tokamax_rule(static, q_ids, kv_ids, bq, bkv))
        # ids rise with position within a row, so the range test keeps no tile brute force finds empty
        # in every row (a tile of one row's pairs is computed for every row of the call)
        assert np.array_equal(priced, brute_force(mask, q_pos, kv_pos, q_ids, kv_ids, bq, bkv))
    assert len(SHAPES) >= 20


def test_range_test_keeps_a_tile_no_pair_needs_when_ids_do_not_rise():
    # ids {1, 5} against {3}: the ranges meet, no token pair shares a document (tokamax's own example)
    static = np.ones((1, 1), dtype=bool)
    q_ids, kv_ids = np.array([[1, 5]]), np.array([[3, 3]])
    assert computed_tiles(static, q_ids, kv_ids, 2, 2)[0, 0]
    assert not brute_force(CAUSAL, np.array([2, 3]), np.array([0, 1]), q_ids, kv_ids, 2, 2)[0, 0]


def test_a_hand_counted_row():
    # 8 tokens in blocks of 2; documents [0, 3), [3, 8): ids 1 1 1 2 2 2 2 2; causal leaves 10 tiles, of which
    # query block 2 (ids 2 2) and key block 0 (ids 1 1) do not meet, nor query block 3 and key block 0
    ids = np.array([[1, 1, 1, 2, 2, 2, 2, 2]])
    pos = np.arange(8)
    static = static_tiles(CAUSAL, pos, pos, 2, 2)
    assert static.sum() == 10
    kept = computed_tiles(static, ids, ids, 2, 2)
    assert kept.sum() == 8 and not kept[2, 0] and not kept[3, 0] and kept[3, 1]


def tile_gaps(q_first, kv_first, bq: int, bkv: int):
    """Positions a document start must fall in to part a query block of `bq` positions from `q_first`
    and a key block of `bkv` from `kv_first` (arrays broadcast): after the earlier block's last token up
    to the later one's first; 0 where the blocks overlap."""
    q_first, kv_first = np.asarray(q_first, dtype=np.int64), np.asarray(kv_first, dtype=np.int64)
    return np.maximum(np.maximum(q_first - (kv_first + bkv - 1), kv_first - (q_first + bq - 1)), 0)


def table_expectation(mask, length, bq, bkv, documents, rows) -> float:
    first_q, first_kv = np.arange(0, length, bq), np.arange(0, length, bkv)
    static = mask.block_visibility(first_q[:, None], first_kv[None, :], bq, bkv)[0]
    gaps = tile_gaps(first_q[:, None], first_kv[None, :], bq, bkv)
    return float((static * computed_chance(documents, gaps, rows)).sum())


@settings(max_examples=40, deadline=None)
@given(
    bq=st.sampled_from([32, 64, 96, 128]),
    bkv=st.sampled_from([32, 64, 128, 192]),
    window=st.sampled_from([0, 1, 50, 500]),
    rows=st.integers(1, 4),
    mean=st.integers(20, 2000),
    sigma=st.floats(0.2, 2.5),
)
def test_the_strided_sum_is_the_tile_by_tile_expectation(bq, bkv, window, rows, mean, sigma):
    mask, length = (sliding_window(window) if window else CAUSAL), 1152
    documents = lognormal(mean, sigma)
    fast = expected_computed_tiles(mask, 0, length, 0, length, bq, bkv, documents, rows)
    assert fast == pytest.approx(table_expectation(mask, length, bq, bkv, documents, rows), rel=1e-9, abs=1e-9)
    assert 0 < fast <= call_blocks(mask, 0, length, 0, length, bq, bkv).computed + 1e-9


@pytest.mark.parametrize("documents, rows", [(SHORT, 1), (SHORT, 3), (LONG, 2)])
def test_the_expectation_is_the_mean_count_over_packed_layouts(documents, rows):
    length, block, samples = 1024, 64, 400
    pos = np.arange(length)
    static = static_tiles(CAUSAL, pos, pos, block, block)
    counts = [
        computed_tiles(static, ids, ids, block, block).sum()
        for ids in (packed_ids(documents, rows=rows, length=length, seed=1000 + s) for s in range(samples))
    ]
    expected = expected_computed_tiles(CAUSAL, 0, length, 0, length, block, block, documents, rows)
    # the lognormal is sampled in whole tokens: a spread of a token against a mean of 600
    assert np.mean(counts) == pytest.approx(expected, abs=4 * np.std(counts) / np.sqrt(samples) + 0.01 * expected)


def test_one_document_per_row_computes_every_tile_and_short_ones_few():
    assert row_fraction_computed(CAUSAL, 4096, 128, 128, lognormal(1 << 30, 0.5), 1) == pytest.approx(1.0, abs=1e-5)
    short = row_fraction_computed(CAUSAL, 4096, 128, 128, histogram([16]), 1)
    # only the diagonal's 32 tiles and the 31 beside it can share a 16-token document, those beside it
    # unless a document starts at the query block's first token: 15 of 16 offsets
    assert short == pytest.approx((32 + 31 * 15 / 16) / (32 * 33 / 2))
    # more rows sharing one schedule keep more tiles
    docs = lognormal(512, 1.0)
    one, four = (row_fraction_computed(CAUSAL, 4096, 128, 128, docs, rows) for rows in (1, 4))
    assert one < four
