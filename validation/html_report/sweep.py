"""The sweep report: MFU against sequence length per strategy (each strategy's best plan), the
lengths where the best strategy changes, and the longest sequence that fits; from the rows
`cpplan sweep --json` prints (and `max-seq-len`'s answer, where the sweep drew it)."""

from __future__ import annotations

import math

from planner.explanation import format_seconds
from planner.options import format_tokens
from validation.html_report.page import STRATEGY_COLOURS, Page, esc, figure, table


def crossovers(rows: list[dict]) -> list[tuple[int, int, str, str]]:
    """(shorter, longer, strategy before, after) for each pair of fitting lengths, in order, whose
    best strategies differ."""
    fits = [r for r in sorted(rows, key=lambda r: r["seq_len"]) if r["fits"]]
    return [
        (a["seq_len"], b["seq_len"], a["strategy"], b["strategy"])
        for a, b in zip(fits, fits[1:])
        if a["strategy"] != b["strategy"]
    ]


def sweep_figure(rows: list[dict], longest: dict | None) -> dict:
    rows = sorted(rows, key=lambda r: r["seq_len"])
    fits = [r for r in rows if r["fits"]]
    names = list(dict.fromkeys(s for r in fits for s in r["per_strategy"]))
    data = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": name,
            "x": [r["seq_len"] for r in fits if name in r["per_strategy"]],
            "y": [r["per_strategy"][name]["mfu"] * 100 for r in fits if name in r["per_strategy"]],
            "customdata": [
                format_seconds(r["per_strategy"][name]["step_time_s"]) for r in fits if name in r["per_strategy"]
            ],
            "hovertemplate": f"{name}: MFU %{{y:.1f}}%, step %{{customdata}}<extra></extra>",
            "line": {"color": STRATEGY_COLOURS.get(name)},
        }
        for name in names
    ]
    data.append(
        {
            "type": "scatter",
            "mode": "markers",
            "name": "best plan",
            "x": [r["seq_len"] for r in fits],
            "y": [r["mfu"] * 100 for r in fits],
            "customdata": [r["plan"] for r in fits],
            "hovertemplate": "best: %{customdata}<br>MFU %{y:.1f}%<extra></extra>",
            "marker": {"symbol": "circle-open", "size": 16, "color": "black", "line": {"width": 2}},
        }
    )
    shapes, notes = [], []
    for short, long, before, after in crossovers(rows):
        x = math.sqrt(short * long)  # half way on the log axis
        shapes.append(_vline(x, "#555"))
        notes.append(
            {
                "x": math.log10(x),
                "y": 1,
                "yref": "paper",
                "text": f"{before} → {after}",
                "showarrow": False,
                "yanchor": "bottom",
            }
        )
    for r in rows:
        if not r["fits"]:
            shapes.append(_vline(r["seq_len"], "#d62728"))
            notes.append(
                {
                    "x": math.log10(r["seq_len"]),
                    "y": 0,
                    "yref": "paper",
                    "text": "nothing fits",
                    "showarrow": False,
                    "yanchor": "bottom",
                }
            )
    if longest:
        shapes.append(_vline(longest["max_seq_len"], "#2ca02c"))
        notes.append(
            {
                "x": math.log10(longest["max_seq_len"]),
                "y": 0.5,
                "yref": "paper",
                "text": f"longest that fits: {format_tokens(longest['max_seq_len'])}",
                "showarrow": False,
                "textangle": -90,
                "xanchor": "right",
            }
        )
    lengths = [r["seq_len"] for r in rows] + ([longest["max_seq_len"]] if longest else [])
    return {
        "data": data,
        "layout": {
            "title": {"text": "MFU of each strategy's best plan against sequence length"},
            "xaxis": {
                "type": "log",
                "title": {"text": "tokens per sequence"},
                "tickvals": lengths,
                "ticktext": [format_tokens(n) for n in lengths],
            },
            "yaxis": {"title": {"text": "MFU (%)"}, "rangemode": "tozero"},
            "shapes": shapes,
            "annotations": notes,
            "height": 460,
        },
    }


def _surely(longest: dict) -> str:
    """What `max_seq_len` said fits with the memory price's measured error to spare, where less."""
    surely = longest["max_seq_len_surely"]
    if surely == longest["max_seq_len"]:
        return ""
    margin = longest["estimate"]["memory_margin"]
    length = f"{format_tokens(surely)} tokens" if surely else "no length"
    return f"; {length} with the memory price's measured error ({margin:.1%}) to spare"


def _vline(x: float, colour: str) -> dict:
    return {
        "type": "line",
        "x0": x,
        "x1": x,
        "y0": 0,
        "y1": 1,
        "xref": "x",
        "yref": "paper",
        "line": {"color": colour, "dash": "dot", "width": 1.5},
    }


def draw(rows: list[dict], longest: dict | None = None, *, title: str = "cpplan sweep") -> Page:
    """The sweep report of `cpplan sweep`'s rows; `longest` is `max_seq_len(...).to_dict()` where known."""
    page = Page(title)
    page.heading(title, 1)
    fitting = [r for r in rows if r["fits"]]
    longest_swept = max(r["seq_len"] for r in fitting)
    page.raw(
        '<div class="key"><p>'
        + esc(
            f"Longest sequence that fits: {format_tokens(longest['max_seq_len'])} tokens "
            f"({longest['plan']['cp_strategy']}, one step {format_seconds(longest['estimate']['step_time_s'])})"
            + _surely(longest)
            if longest
            else f"Longest swept length that fits: {format_tokens(longest_swept)} tokens"
        )
        + "</p><p>"
        + esc(
            "; ".join(
                f"{b} overtakes {a} between {format_tokens(s)} and {format_tokens(lo)}"
                for s, lo, a, b in crossovers(rows)
            )
            or "The same strategy wins at every length."
        )
        + "</p></div>"
    )
    page.raw(figure(sweep_figure(rows, longest), "sweep"))
    names = list(dict.fromkeys(s for r in fitting for s in r["per_strategy"]))
    page.raw(
        table(
            ["seq_len", "best", "step", "MFU", "HBM", *(f"{n} MFU" for n in names)],
            [
                [
                    format_tokens(r["seq_len"]),
                    r["plan"],
                    format_seconds(r["step_time_s"]),
                    f"{r['mfu']:.1%}",
                    f"{r['hbm_gib']:.1f} GiB",
                ]
                + [f"{r['per_strategy'][n]['mfu']:.1%}" if n in r["per_strategy"] else "—" for n in names]
                if r["fits"]
                else [format_tokens(r["seq_len"]), "nothing fits", "", "", "", *([""] * len(names))]
                for r in sorted(rows, key=lambda r: r["seq_len"])
            ],
            left=2,
        )
    )
    return page
