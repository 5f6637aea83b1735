"""The book report: days against chips, a point per slice coloured by chip (priced or not), and days
against cost for the priced ones with the Pareto front joined; the deadline as a line on both, the plan
on hover; from what `cpplan book --json` prints."""

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
        shapes.append(_deadline(data["deadline_days"], "x"))
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


def days_figure(data: dict) -> dict:
    """Days to train the budget against the slice's chips: a point per slice, a trace per chip; the deadline."""
    slices = data["slices"]
    chips = list(dict.fromkeys(s["chip"] for s in slices))
    traces = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": chip,
            "x": [s["chips"] for s in slices if s["chip"] == chip],
            "y": [s["days"] for s in slices if s["chip"] == chip],
            "customdata": [f"{s['topology']}<br>{s['plan_line']}" for s in slices if s["chip"] == chip],
            "hovertemplate": "%{customdata}<br>%{x} chips, %{y:.1f} days<extra></extra>",
            "marker": {"color": CHIP_COLOURS[i % len(CHIP_COLOURS)], "size": 9},
            "line": {"color": CHIP_COLOURS[i % len(CHIP_COLOURS)], "width": 1},
        }
        for i, chip in enumerate(chips)
    ]
    shapes = []
    if data["deadline_days"] is not None:
        shapes.append(_deadline(data["deadline_days"], "y"))
    return {
        "data": traces,
        "layout": {
            "title": {"text": "Days to train the budget on every slice searched"},
            "xaxis": {"type": "log", "title": {"text": "chips"}},
            "yaxis": {"type": "log", "title": {"text": "days"}},
            "shapes": shapes,
            "height": 480,
        },
    }


def _deadline(days: float, axis: str) -> dict:
    """The deadline as a dashed red line across the plot, at `days` on `axis` ("x" or "y")."""
    across = "y" if axis == "x" else "x"
    return {
        "type": "line",
        f"{axis}0": days,
        f"{axis}1": days,
        f"{across}0": 0,
        f"{across}1": 1,
        f"{axis}ref": axis,
        f"{across}ref": "paper",
        "line": {"color": "#d62728", "dash": "dash", "width": 1.5},
    }


def draw(data: dict) -> Page:
    """The book report of `cpplan book --json`'s answer."""
    page = Page(f"cpplan book: {data['model']}")
    page.heading(f"Which slice to book: {data['model']}", 1)
    page.raw(f'<p class="key">{esc(data["verdict"])}</p>')
    page.raw(figure(days_figure(data), "days"))
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
