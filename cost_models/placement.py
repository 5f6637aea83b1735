"""How logical mesh axes lie on physical torus dimensions. The device grid, transposed to the physical
order, flattened and reshaped to the logical sizes (both orders outermost first), is the mesh, as
`numpy.reshape` and so the runtime realise it. A logical axis spans the flattened positions from the
product of the sizes inside it to that times its size; where that span meets each dimension is one of
its segments."""

from __future__ import annotations

import math
from functools import lru_cache

from cost_models.topology import Segment


def inner_sizes(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The positions inside each of `sizes` (outermost first) in the flattened order: the product of the
    sizes after it (1 for the innermost)."""
    inner, out = 1, []
    for size in reversed(sizes):
        out.append(inner)
        inner *= size
    return tuple(reversed(out))


def digit_bounds(dim_sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The flattened positions of the boundaries of dimensions of `dim_sizes` (outermost first), innermost
    first: the product of the sizes inside each (1 for the innermost), then of all."""
    out = [1]
    for size in reversed(dim_sizes):
        out.append(out[-1] * size)
    return tuple(out)


def splits_no_digit(position: int, bounds: tuple[int, ...]) -> bool:
    """Whether a boundary between axes at flattened `position` and the boundaries between dimensions `bounds`
    form one chain, each dividing the next: so neither splits a digit of the other."""
    return all(bound % position == 0 or position % bound == 0 for bound in bounds)


@lru_cache(maxsize=1 << 16)  # a search asks of the same few sizes on every slice of a shape
def tiles(axis_sizes: tuple[int, ...], dim_sizes: tuple[int, ...]) -> bool:
    """Whether logical axes of `axis_sizes` tile dimensions of `dim_sizes` (both outermost first): the
    boundaries between axes and those between the dimensions they cross, in order, each divide the next,
    so each axis takes whole digits of the dimensions it crosses."""
    total = math.prod(axis_sizes)
    bounds = digit_bounds(dim_sizes)
    crossed = next((i for i, bound in enumerate(bounds) if bound >= total), None)
    if crossed is None:
        return False
    # a set of numbers is such a chain when every two divide one way: those within each side do
    return all(splits_no_digit(position, bounds[: crossed + 1]) for position in (*inner_sizes(axis_sizes), total))


def span_segments(low: int, high: int, dim_sizes: tuple[int, ...]) -> tuple[Segment, ...]:
    """The segments (innermost first) of the flattened positions `low` to `high` (the product of the
    sizes inside a logical axis or group of adjacent axes, and that times their size) on dimensions that
    they tile (`tiles`); `Segment.dim` indexes `dim_sizes`."""
    out = []
    inner = 1
    for dim in reversed(range(len(dim_sizes))):
        first, last = max(low, inner), min(high, inner * dim_sizes[dim])
        if last > first:
            out.append(Segment(dim, last // first, first // inner))
        inner *= dim_sizes[dim]
    return tuple(out)


def axis_segments(axis_sizes: tuple[int, ...], dim_sizes: tuple[int, ...]) -> tuple[tuple[Segment, ...], ...] | None:
    """Segments of each logical axis (innermost first), or None when the sizes do not tile the dimensions
    in order; sizes are outermost first, and `Segment.dim` indexes `dim_sizes`."""
    if not tiles(axis_sizes, dim_sizes):
        return None
    return tuple(
        span_segments(inner, inner * size, dim_sizes) for inner, size in zip(inner_sizes(axis_sizes), axis_sizes)
    )


def positions_along(segments: tuple[Segment, ...], coords):
    """Each device's index along one logical axis, read off its segments (innermost first): its share of
    each dimension is one digit, the innermost least significant. `coords[..., d]` is a device's
    position on dimension `d`; a `DCN_DIM` (-1) segment reads the last entry, its slice's index along
    the axis. Works on numpy arrays of coordinates."""
    index, weight = 0 * coords[..., 0], 1
    for seg in segments:
        index = index + coords[..., seg.dim] // seg.stride % seg.size * weight
        weight *= seg.size
    return index


def axes_on_whole_dimensions(axis_sizes: tuple[int, ...], dim_sizes: tuple[int, ...]) -> bool:
    """Whether each axis of more than one device (`axis_sizes`, any order) can span whole physical
    dimensions of its own, none split between two axes (true for fewer than two such axes)."""
    axes = sorted((s for s in axis_sizes if s > 1), reverse=True)
    if len(axes) < 2:
        return True

    def assign(i: int, free: tuple[int, ...]) -> bool:
        if i == len(axes):
            return True
        for mask in range(1, 1 << len(free)):
            chosen = [free[j] for j in range(len(free)) if mask >> j & 1]
            if math.prod(chosen) == axes[i] and assign(
                i + 1, tuple(free[j] for j in range(len(free)) if not mask >> j & 1)
            ):
                return True
        return False

    return assign(0, tuple(d for d in dim_sizes if d > 1))
