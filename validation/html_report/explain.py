"""The explain report: the plan space, where the step and the memory go for the choice and the best
plan of each other strategy, the placement on the torus, and the tables the text prints; all from
`Explanation.to_dict()` (the `--json` output), nothing priced again."""

from __future__ import annotations

from cost_models.pricing.memory import LOSS_MEMORY, LOSS_STATE, STATIC_MEMORY, forward_bytes, layer_bytes, update_bytes
from cost_models.units import GiB
from planner.explanation import format_seconds
from planner.options import format_tokens
from planner.plan import Plan
from validation.html_report.page import Page, by_strategy, esc, figure, table
from validation.html_report.torus import picture

PHASE_COLOURS = {
    "all step": "#9ecae1",
    "layer": "#3182bd",
    "loss": "#e6550d",
    "update": "#31a354",
    "forward": "#756bb1",
}


def title(d: dict) -> str:
    return f"cpplan explain: {d['model']['name']} at {format_tokens(d['seq_len'])} tokens on {d['topology']}"


def compared(d: dict) -> list[tuple[str, dict]]:
    """(label, ranked plan) for the choice and the best plan of each other strategy, choice first."""
    best = d["best"]
    others = [(f"best {name}", r) for name, r in d["best_per_strategy"].items() if r["summary"] != best["summary"]]
    return [(f"chosen: {best['plan']['cp_strategy']}", best), *others]


def plan_space(d: dict) -> dict:
    """Step time against HBM per device for every feasible plan, one colour per strategy, with the
    capacity, the tie band around the choice and the choice marked."""
    rows, best = d["feasible_plans"], d["best"]["estimate"]
    data = by_strategy(
        rows,
        x=lambda r: round(r["hbm_bytes_per_device"] / GiB, 3),
        y=lambda r: float(f"{r['step_time_s']:.5g}"),
        custom=lambda r: [r["summary"], r["blocks"]],
        hover="%{customdata[0]}<br>splash blocks %{customdata[1]}<br>step %{y:.4g} s, HBM %{x:.1f} GiB<extra></extra>",
        size=7,
    )
    x, y = best["hbm_bytes_per_device"] / GiB, best["step_time_s"]
    data.append(
        {
            "type": "scatter",
            "mode": "markers+text",
            "name": "chosen",
            "x": [x],
            "y": [y],
            "text": ["chosen"],
            "textposition": "top center",
            "hovertemplate": f"chosen: {d['best']['summary']}<extra></extra>",
            "marker": {"symbol": "star", "size": 18, "color": "gold", "line": {"color": "black", "width": 1}},
        }
    )
    capacity = best["hbm_capacity_bytes"] / GiB
    shapes = [_line(x0=capacity, x1=capacity, y0=0, y1=1, yref="paper", colour="black")]
    notes = [_note(capacity, 1, f"HBM capacity {capacity:.1f} GiB", yref="paper", xanchor="right")]
    band = d["error_band"]
    if band:
        top = y * (1 + band["relative"])
        shapes.append(
            {
                "type": "rect",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": y,
                "y1": top,
                "line": {"width": 0},
                "fillcolor": "rgba(255,200,0,0.25)",
                "layer": "below",
            }
        )
        notes.append(
            _note(0, top, f"tie band ±{band['relative']:.1%} ({d['ties']} ties)", xref="paper", xanchor="left")
        )
    return {
        "data": data,
        "layout": {
            "title": {"text": f"{d['feasible']} feasible plans: step time against HBM per device"},
            "xaxis": {"title": {"text": "HBM per device (GiB)"}},
            "yaxis": {"title": {"text": "predicted step time (s)"}},
            "shapes": shapes,
            "annotations": notes,
            "height": 480,
        },
    }


def _line(colour: str, **where) -> dict:
    return {"type": "line", "xref": "x", "yref": "y", **where, "line": {"color": colour, "dash": "dash", "width": 1}}


def _note(x, y, text: str, **where) -> dict:
    return {"x": x, "y": y, "text": text, "showarrow": False, "xref": "x", "yref": "y", "yanchor": "bottom", **where}


def step_terms(e: dict) -> dict[str, float]:
    """The step's terms in the order they stack: compute by kind, HBM-bound work, exposed
    communication by family (these sum to the step time), then the communication hidden under compute."""
    terms = {f"compute: {k}": v for k, v in e["compute_s"].items()}
    terms["HBM-bound work"] = sum(e["hbm_s"].values())
    terms |= {f"exposed: {k}": v for k, v in e["exposed_s"].items() if v > 0}
    terms["hidden communication"] = sum(e["comm_s"].values()) - sum(e["exposed_s"].values())
    return terms


def step_breakdown(d: dict) -> dict:
    """Stacked bars on one time axis: what each compared plan's step is made of (one bar), and the
    communication that overlaps its compute (a bar beneath, off the step's sum)."""
    plans = compared(d)
    rows = [(label, step_terms(r["estimate"])) for label, r in plans]
    names = list(dict.fromkeys(k for _, terms in rows for k in terms))
    palette = ["#4c78a8", "#72b7b2", "#54a24b", "#f58518", "#e45756", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac"]
    data = []
    for i, name in enumerate(names):
        hidden = name == "hidden communication"
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": name,
                "y": [f"{label}: hidden" if hidden else label for label, _ in rows],
                "x": [terms.get(name, 0.0) for _, terms in rows],
                "marker": {"color": "#c7c7c7" if hidden else palette[i % len(palette)]},
                "hovertemplate": f"{name}: %{{x:.4g}} s<extra>%{{y}}</extra>",
            }
        )
    order = [y for label, _ in rows for y in (label, f"{label}: hidden")]
    return {
        "data": data,
        "layout": {
            "title": {"text": "Where the step goes (exposed communication stacks; hidden overlaps compute)"},
            "barmode": "stack",
            "xaxis": {"title": {"text": "seconds per step"}},
            "yaxis": {"categoryorder": "array", "categoryarray": order[::-1], "automargin": True},
            "legend": {"orientation": "h", "yanchor": "top", "y": -0.3},
            "margin": {"l": 60, "r": 20, "t": 50, "b": 120},
            "height": 200 + 60 * len(rows),
        },
    }


def memory_phases(e: dict) -> dict[str, float]:
    """HBM per device in each phase, as the price composes them (`cost_models.pricing.memory`):
    what is held all step and on top of it a layer's backward; the loss on that state less the layers'
    gradients (which their backward forms after it); the update and a layer's forward alone."""
    mem = e["hbm_bytes"]
    return {
        "all step": sum(mem[k] for k in STATIC_MEMORY),
        "layer": float(layer_bytes(mem)),
        "loss": sum(mem[k] for k in LOSS_MEMORY),
        "update": float(update_bytes(mem)),
        "forward": float(forward_bytes(mem)),
    }


def loss_state(e: dict) -> float:
    """What the loss holds of the step's state: all of it but the layers' gradients."""
    return sum(e["hbm_bytes"][k] for k in LOSS_STATE)


def memory_figure(d: dict) -> dict:
    """Per compared plan, a bar per phase (held all step + a layer's backward; the loss on all but the
    layers' gradients; the update; a layer's forward) against the capacity, each with the memory price's
    measured error above it."""
    rows = []
    for label, r in compared(d):
        p = memory_phases(r["estimate"])
        rows += [
            (f"{label}: layer", {"all step": p["all step"], "layer": p["layer"]}, r["estimate"]),
            (f"{label}: loss", {"all step": loss_state(r["estimate"]), "loss": p["loss"]}, r["estimate"]),
            (f"{label}: update", {"update": p["update"]}, r["estimate"]),
            (f"{label}: forward", {"forward": p["forward"]}, r["estimate"]),
        ]
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": phase,
            "y": [label for label, _, _ in rows],
            "x": [parts.get(phase, 0.0) / GiB for _, parts, _ in rows],
            "marker": {"color": colour},
            "hovertemplate": f"{phase}: %{{x:.2f}} GiB<extra>%{{y}}</extra>",
        }
        for phase, colour in PHASE_COLOURS.items()
    ]
    totals = [sum(parts.values()) / GiB for _, parts, _ in rows]
    data.append(
        {
            "type": "scatter",
            "mode": "markers",
            "name": "memory price's error",
            "y": [label for label, _, _ in rows],
            "x": totals,
            "marker": {"color": "black", "size": 4},
            "error_x": {
                "type": "data",
                "symmetric": False,
                "array": [t * e["memory_margin"] for t, (_, _, e) in zip(totals, rows)],
                "arrayminus": [0] * len(rows),
            },
            "hovertemplate": "%{x:.2f} GiB priced; the compiler has needed up to %{error_x.array:.2f} GiB more"
            "<extra></extra>",
        }
    )
    capacity = d["best"]["estimate"]["hbm_capacity_bytes"] / GiB
    return {
        "data": data,
        "layout": {
            "title": {"text": "Where the memory goes: HBM per device by phase"},
            "barmode": "stack",
            "xaxis": {"title": {"text": "GiB per device"}},
            "yaxis": {
                "categoryorder": "array",
                "categoryarray": [label for label, _, _ in rows][::-1],
                "automargin": True,
            },
            "shapes": [_line(x0=capacity, x1=capacity, y0=0, y1=1, yref="paper", colour="black")],
            "annotations": [_note(capacity, 1, f"capacity {capacity:.1f} GiB", yref="paper", xanchor="right")],
            "legend": {"orientation": "h", "yanchor": "top", "y": -0.12},
            "margin": {"l": 60, "r": 20, "t": 50, "b": 110},
            "height": 220 + 28 * len(rows),
        },
    }


def draw(d: dict) -> Page:
    """The explain report of an explanation dict that has a chosen plan."""
    best, e = d["best"], d["best"]["estimate"]
    page = Page(title(d))
    page.heading(title(d), 1)
    band = d["error_band"]
    page.raw(
        '<div class="key"><p><b>Chosen plan:</b> ' + esc(best["summary"]) + "</p>"
        f"<p>predicted step <b>{format_seconds(e['step_time_s'])}</b>, MFU {e['mfu']:.1%}, "
        f"HBM {e['hbm_bytes_per_device'] / GiB:.1f} of {e['hbm_capacity_bytes'] / GiB:.1f} GiB per device "
        f"({e['hbm_bytes_per_device'] / e['hbm_capacity_bytes']:.0%}); bound by {esc(e['bottleneck'])}; "
        + (
            f"error band ±{band['relative']:.1%} ({esc(band['regime'])}), {d['ties']} ties"
            if band
            else "no error band measured for this chip"
        )
        + f"; splash blocks {best['plan']['block_q']}×{best['plan']['block_kv']}, "
        f"remat {esc(best['plan']['remat'])}</p>"
        + (f"<p>{esc(d['why'])}</p>" if d.get("why") else "")
        + (f'<p class="note">Note: {esc(d["batch_note"])}.</p>' if d.get("batch_note") else "")
        + "</div>"
    )
    page.heading("The plan space")
    rejections = [[c, r["count"], r["example"]] for c, r in d["rejections"].items()]
    page.raw(
        f'<div class="row"><div class="grow">{figure(plan_space(d), "plan-space")}</div><div class="rejections">'
        f"<h3>Rejected: {sum(r[1] for r in rejections)} candidates by reason</h3>"
        f"{table(['reason', 'e.g.', 'count'], [[r[0], r[2], r[1]] for r in rejections], left=2)}"
        f'<p class="note">{d["priced"]} priced placements kept {d["feasible"]} feasible plans.</p></div></div>'
    )
    page.heading("Where the step goes")
    page.raw(figure(step_breakdown(d), "step"))
    plans = compared(d)
    terms = [step_terms(r["estimate"]) for _, r in plans]
    names = list(dict.fromkeys(k for t in terms for k in t))
    page.raw(
        table(
            ["plan", "step", "MFU", *names],
            [
                [
                    f"{label} [{r['summary']}]",
                    format_seconds(r["estimate"]["step_time_s"]),
                    f"{r['estimate']['mfu']:.1%}",
                ]
                + [format_seconds(t[n]) if n in t else "—" for n in names]
                for (label, r), t in zip(plans, terms)
            ],
        )
    )
    if d.get("dcn"):
        page.raw(
            table(
                ["collective across DCN", "slices", "in all", "on DCN", "exposed"],
                [
                    [
                        f["collective"],
                        f["slices"],
                        *(format_seconds(f[k]) for k in ("seconds", "dcn_seconds", "exposed_seconds")),
                    ]
                    for f in d["dcn"]
                ],
            )
        )
    page.heading("Where the memory goes")
    page.raw(figure(memory_figure(d), "memory"))
    page.raw(
        table(
            ["plan", "all step", "layer", "loss", "update", "forward", "peak", "capacity", "compiler held up to"],
            [
                [label]
                + [f"{v / GiB:.1f} GiB" for v in memory_phases(r["estimate"]).values()]
                + [
                    f"{r['estimate']['hbm_bytes_per_device'] / GiB:.1f} GiB",
                    f"{r['estimate']['hbm_capacity_bytes'] / GiB:.1f} GiB",
                    f"+{r['estimate']['memory_margin']:.1%}",
                ]
                for label, r in plans
            ],
        )
    )
    plan = Plan.from_dict(best["plan"])
    page.heading(f"Where the mesh lies on {d['topology']}")
    page.text(
        "Each axis of more than one device drawn on the slice's chip grid: a cell is a device, its colour the "
        "axis's group (the devices its collectives run among), its number the device's rank along the axis "
        "(a ring passes from rank r to r+1). Hover a cell for its coordinates.",
        "note",
    )
    page.raw(picture(plan))
    page.heading("Alternatives")
    page.raw(
        table(
            ["plan", "step", "slower", "tie", "why"],
            [
                [
                    a["summary"],
                    format_seconds(a["estimate"]["step_time_s"]),
                    f"+{a['slower_than_best']:.1%}",
                    "tie" if a["tie"] else "",
                    a["why"],
                ]
                for a in d["alternatives"]
            ],
        )
    )
    return page
