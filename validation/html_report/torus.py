"""Where a plan's mesh lies on its slice: every device of the chip grid (x, y, z; both cores of a
TPU7x chip; each slice over DCN), drawn once per logical axis, coloured by the axis's group it is in
and numbered by its rank there. The positions come from `Plan.device_positions`, the placement the
planner priced (the runtime's mesh lays devices the same way: tests/validation/test_torus_picture.py)."""

from __future__ import annotations

import numpy as np

from cost_models.vocabulary import AXES
from planner.plan import Plan
from validation.html_report.page import esc

GOLDEN_ANGLE = 137.508  # hues this far apart stay distinct for any number of groups


def axis_groups(plan: Plan) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each axis of more than one device: (group, rank) of every device, arrays shaped (slices,
    *physical dims). A group is the devices that differ only along the axis (its collectives run
    among them), numbered in the order the grid first meets them; rank is the position along the axis."""
    positions, sizes = plan.device_positions(), plan.mesh_sizes
    out = {}
    for k, axis in enumerate(AXES):
        if sizes[k] == 1:
            continue
        others = [i for i in range(len(AXES)) if i != k]
        key = np.ravel_multi_index(tuple(positions[..., i] for i in others), [sizes[i] for i in others])
        _, first, inverse = np.unique(key.ravel(), return_index=True, return_inverse=True)
        order = np.argsort(np.argsort(first))  # group numbers in order of first appearance
        out[axis] = (order[inverse].reshape(key.shape), positions[..., k])
    return out


def colours(count: int) -> str:
    """CSS classes g0..g{count-1}, one light colour per group."""
    return "".join(
        f".g{i}{{background:hsl({i * GOLDEN_ANGLE % 360:.0f},70%,{78 - 8 * (i // 12 % 2)}%)}}" for i in range(count)
    )


def picture(plan: Plan) -> str:
    """The placement as static HTML (no JavaScript): one row of layers per axis; a cell's tooltip
    names its device and its group and rank."""
    dims = plan.topology_spec.physical_dims
    names = [d.name for d in dims]
    groups = axis_groups(plan)
    placed = plan.axis_dims()
    most = max((int(g.max()) + 1 for g, _ in groups.values()), default=1)
    parts = [f"<style>{colours(most)}</style>"]
    for axis, (group, rank) in groups.items():
        wraps = [dims[s.dim].name for s in plan.segments()[axis] if s.dim >= 0 and dims[s.dim].wraps]
        parts.append(
            f"<h3>{esc(axis)} = {plan.axis_size(axis)} on {esc(placed.get(axis, ''))}: "
            f"{int(group.max()) + 1} group{'s' if group.max() else ''} of {plan.axis_size(axis)} "
            f"({'wraps on ' + ', '.join(wraps) if wraps else 'no wraparound'})</h3>"
        )
        parts.append(
            '<div class="torus">'
            + "".join(_slice(group[s], rank[s], names, s, len(group)) for s in range(len(group)))
            + "</div>"
        )
    return "\n".join(parts)


def _slice(group: np.ndarray, rank: np.ndarray, names: list[str], index: int, slices: int) -> str:
    """One slice's devices: a table per z layer (or one for a 2-D slice), rows y, columns x (× cores)."""
    at = {n: i for i, n in enumerate(names)}
    shape = group.shape
    size = lambda n: shape[at[n]] if n in at else 1  # noqa: E731
    layers = []
    for z in range(size("z")):
        rows = []
        for y in range(size("y")):
            cells = []
            for x in range(size("x")):
                for c in range(size("core")):
                    where = {"x": x, "y": y, "z": z, "core": c}
                    idx = tuple(where[n] for n in names)
                    label = " ".join(f"{n}{where[n]}" for n in names)
                    cells.append(
                        f'<td class="g{group[idx]}{" c" if "core" in at and "x" in at else ""}" '
                        f'title="{label}: group {group[idx]}, rank {rank[idx]}">{rank[idx]}</td>'
                    )
            rows.append("<tr>" + "".join(cells) + "</tr>")
        caption = f"z={z}" if "z" in at else ("x × y" if "y" in at else " · ".join(names))
        layers.append(f'<div class="layer">{caption}<table>{"".join(rows)}</table></div>')
    body = "".join(layers)
    return (
        f'<div class="slice"><div class="layer">slice {index}</div><div class="torus">{body}</div></div>'
        if slices > 1
        else body
    )
