"""A compile's heap read value by value: its buffers, and the heap they need packed largest first."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from validation.peak_buffers import Heap

pytestmark = pytest.mark.pure


def heap_of(values: list[tuple[str, int, int, int, int]], size: int) -> Heap:
    """A heap of (value, bytes, offset, first, last) values, their live bytes counted as read_heap does."""
    length = max(v[4] for v in values) + 1
    totals = np.zeros(length)
    for offset in {v[2] for v in values}:
        held = np.zeros(length)
        for _, nbytes, at, first, last in values:
            if at == offset:
                np.maximum(held[first : last + 1], nbytes, out=held[first : last + 1])
        totals += held
    return Heap(
        size=size,
        values=[(name, nbytes, offset, "") for name, nbytes, offset, _, _ in values],
        live={name: (first, last) for name, _, _, first, last in values},
        steps={},
        totals=totals,
    )


def test_values_at_one_offset_are_one_buffer_where_their_live_ranges_meet():
    heap = heap_of(
        [("carry{}", 5, 0, 0, 2), ("body.param{}", 5, 0, 3, 4), ("later{}", 3, 0, 7, 8), ("other{}", 2, 5, 1, 8)], 7
    )
    assert sorted(heap.buffers()) == [(0, 4, 5), (1, 8, 2), (7, 8, 3)]


def test_packing_fills_the_room_a_placement_left_above_a_buffer_gone():
    # a (4 bytes, steps 0-1) at 0, b (2, steps 0-3) at 4, c (4, steps 2-3) placed at 6 above b: a heap of 10
    # whose live bytes never pass 6; packed, c takes a's offset once a is gone and b sits above them: 6
    heap = heap_of([("a{}", 4, 0, 0, 1), ("b{}", 2, 4, 0, 3), ("c{}", 4, 6, 2, 3)], 10)
    assert heap.live_peak_bytes == 6
    assert heap.packed_bytes() == 6


def test_packing_takes_the_tightest_room_even_where_the_lowest_would_have_packed_tighter():
    # (bytes, steps): a (4, 2-3) at 0; b (4, 3) at 4; c (3, 1-2) at 4; d (2, 1-3) at 8; e (1, 0-1) meets c (4-7)
    # and d (8-10): rooms 0-4 and 7-8, the tighter taken, 7; f (1, 1-2) finds no room below 10: 11, where
    # the live bytes reach 10 (steps 2 and 3) and e at 0 would have left f the room at 7
    spans = [("a", 4, 2, 3), ("b", 4, 3, 3), ("c", 3, 1, 2), ("d", 2, 1, 3), ("e", 1, 0, 1), ("f", 1, 1, 2)]
    offsets = np.cumsum([0] + [n for _, n, _, _ in spans])
    heap = heap_of([(f"{name}{{}}", n, int(offsets[i]), s, e) for i, (name, n, s, e) in enumerate(spans)], 15)
    assert heap.live_peak_bytes == 10
    assert heap.packed_bytes() == 11


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 10), st.integers(1, 64)), min_size=1, max_size=30))
def test_the_packed_heap_holds_the_live_peak_and_no_more_than_every_buffer_apart(spans):
    offsets = np.cumsum([0] + [n for _, _, n in spans])
    heap = heap_of([(f"v{i}{{}}", n, int(offsets[i]), s, s + d) for i, (s, d, n) in enumerate(spans)], offsets[-1])
    assert heap.live_peak_bytes <= heap.packed_bytes() <= sum(n for _, _, n in spans)
