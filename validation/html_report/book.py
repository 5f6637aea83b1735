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
    traces = _chip_traces(
        data,
        priced,
        x="days",
        y="cost_usd",
        text=lambda s: f"{s['topology']} ({s['chips']} chips)<br>{s['plan_line']}",
        hovertemplate="%{customdata}<br>%{x:.1f} days, $%{y:,.0f}<extra></extra>",
        mode="markers",
        marker={"size": 11, "opacity": 0.85},
    )
    front = sorted((s for s in priced if s["on_front"]), key=lambda s: s["days"])
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
    return _log_figure(
        "Days to train the budget against its cost, per slice", "days", "cost (US dollars)", traces, data, "x"
    )


def days_figure(data: dict) -> dict:
    """Days to train the budget against the slice's chips: a point per slice, a trace per chip; the deadline."""
    traces = _chip_traces(
        data,
        data["slices"],
        x="chips",
        y="days",
        text=lambda s: f"{s['topology']}<br>{s['plan_line']}",
        hovertemplate="%{customdata}<br>%{x} chips, %{y:.1f} days<extra></extra>",
        mode="lines+markers",
        marker={"size": 9},
        line={"width": 1},
    )
    return _log_figure("Days to train the budget on every slice searched", "chips", "days", traces, data, "y")


def _chip_traces(data: dict, slices: list, *, x: str, y: str, text, hovertemplate: str, mode: str, **styles) -> list:
    """A scatter trace per chip of `slices` (fields `x` and `y`, hover `text(slice)`), each chip in its colour
    (`CHIP_COLOURS` in the order the chips come among all of `data`'s slices, alike on every figure)."""
    order = list(dict.fromkeys(s["chip"] for s in data["slices"]))
    traces = []
    for chip in dict.fromkeys(s["chip"] for s in slices):
        mine = [s for s in slices if s["chip"] == chip]
        colour = CHIP_COLOURS[order.index(chip) % len(CHIP_COLOURS)]
        traces.append(
            {
                "type": "scatter",
                "mode": mode,
                "name": chip,
                "x": [s[x] for s in mine],
                "y": [s[y] for s in mine],
                "customdata": [text(s) for s in mine],
                "hovertemplate": hovertemplate,
                **{name: {"color": colour, **style} for name, style in styles.items()},
            }
        )
    return traces


def _log_figure(title: str, x_title: str, y_title: str, traces: list, data: dict, deadline_axis: str) -> dict:
    """A figure of `traces` on log axes, with the deadline (where there is one) across it on `deadline_axis`."""
    deadline = data["deadline_days"]
    return {
        "data": traces,
        "layout": {
            "title": {"text": title},
            "xaxis": {"type": "log", "title": {"text": x_title}},
            "yaxis": {"type": "log", "title": {"text": y_title}},
            "shapes": [] if deadline is None else [_deadline(deadline, deadline_axis)],
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
