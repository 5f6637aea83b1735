"""The book report: days against cost, a point per slice coloured by chip, the Pareto front joined, the
deadline as a line, the plan on hover; from what `cpplan book --json` prints."""

from __future__ import annotations

from validation.html_report.page import Page, esc, figure, number, table

# a colour per chip, in the order the chips come
CHIP_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def front_figure(data: dict) -> dict:
    """Days against cost: the priced slices, a trace per chip; the front as a line; the deadline."""
    priced = [s for s in data["slices"] if s["cost_usd"] is not None]
    chips = list(dict.fromkeys(s["chip"] for s in priced))
    traces = [
        {
            "type": "scatter",
            "mode": "markers",
            "name": chip,
            "x": [s["days"] for s in priced if s["chip"] == chip],
            "y": [s["cost_usd"] for s in priced if s["chip"] == chip],
            "customdata": [
                f"{s['topology']} ({s['chips']} chips)<br>{s['plan_line']}" for s in priced if s["chip"] == chip
            ],
            "hovertemplate": "%{customdata}<br>%{x:.1f} days, $%{y:,.0f}<extra></extra>",
            "marker": {"color": CHIP_COLOURS[i % len(CHIP_COLOURS)], "size": 11, "opacity": 0.85},
        }
        for i, chip in enumerate(chips)
    ]
    front = [s for s in priced if s["on_front"]]
    front.sort(key=lambda s: s["days"])
    traces.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": "Pareto front",
            "x": [s["days"] for s in front],
            "y": [s["cost_usd"] for s in front],
            "hoverinfo": "skip",
            "line": {"color": "black", "dash": "dot", "width": 1.5},
        }
    )
    shapes = []
    if data["deadline_days"] is not None:
        shapes.append(
            {
                "type": "line",
                "x0": data["deadline_days"],
                "x1": data["deadline_days"],
                "y0": 0,
                "y1": 1,
                "xref": "x",
                "yref": "paper",
                "line": {"color": "#d62728", "dash": "dash", "width": 1.5},
            }
        )
    return {
        "data": traces,
        "layout": {
            "title": {"text": "Days to train the budget against its cost, per slice"},
            "xaxis": {"type": "log", "title": {"text": "days"}},
            "yaxis": {"type": "log", "title": {"text": "cost (US dollars)"}},
            "shapes": shapes,
            "height": 480,
        },
    }


def draw(data: dict) -> Page:
    """The book report of `cpplan book --json`'s answer."""
    page = Page(f"cpplan book: {data['model']}")
    page.heading(f"Which slice to book: {data['model']}", 1)
    page.raw(f'<p class="key">{esc(data["verdict"])}</p>')
    if any(s["cost_usd"] is not None for s in data["slices"]):
        page.raw(figure(front_figure(data), "front"))
    else:
        page.text("No slice has a price (give --price), so there is no cost to draw.", "note")
    rows = [
        [
            ("*" if s["on_front"] else "") + s["topology"],
            s["chips"],
            number(s["step_time_s"], ".2f", " s"),
            f"±{s['error_band']['relative']:.0%}" if s["error_band"] else "n/a",
            number(s["tokens_per_s"], ",.0f"),
            number(s["days"], ".1f"),
            number(s["chip_hours"], ",.0f"),
            number(s["cost_usd"], ",.0f", " $"),
            s["plan_line"],
        ]
        for s in data["slices"]
    ]
    page.heading("Every slice")
    header = ["slice (*: front)", "chips", "step", "band", "tokens/s", "days", "chip-hours", "cost", "best plan"]
    page.raw(table(header, rows))
    page.heading("Prices")
    for chip, price in data["prices"].items():
        if "none" in price:
            page.text(f"{chip}: time only — {price['none']}")
        else:
            page.text(f"{chip}: ${price['per_chip_hour_usd']:.2f} per chip-hour ({price['kind']}): {price['source']}")
    return page
