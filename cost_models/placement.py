"""How logical mesh axes lie on physical torus dimensions. The device grid, transposed to the physical
order, flattened and reshaped to the logical sizes (both orders outermost first), is the mesh, as
`numpy.reshape` and so the runtime realise it; walking both orders from the inside gives each logical
axis its segments."""

from __future__ import annotations

import math

from cost_models.topology import Segment


def axis_segments(axis_sizes: tuple[int, ...], dim_sizes: tuple[int, ...]) -> tuple[tuple[Segment, ...], ...] | None:
    """Segments of each logical axis (innermost first), or None when the sizes do not tile the dimensions
    in order; sizes are outermost first, and `Segment.dim` indexes `dim_sizes`."""
    result: list[tuple[Segment, ...]] = []
    dim = len(dim_sizes) - 1
    used = 1  # positions of the current dimension already taken by inner axes
    for size in reversed(axis_sizes):
        need = size
        segs = []
        while need > 1:
            while dim >= 0 and dim_sizes[dim] // used == 1:
                dim, used = dim - 1, 1
            if dim < 0:
                return None
            remaining = dim_sizes[dim] // used
            if need % remaining == 0:
                segs.append(Segment(dim, remaining, used))
                need //= remaining
                dim, used = dim - 1, 1
            elif remaining % need == 0:
                segs.append(Segment(dim, need, used))
                used *= need
                need = 1
            else:
                return None
        result.append(tuple(segs))
    return tuple(reversed(result))


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
