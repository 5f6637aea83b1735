"""The validate report: predicted against measured step time per plan, with the error band, next to
the table `report.md` holds; from the report's dict (`report.json`)."""

from __future__ import annotations

from cost_models.accuracy import error_band
from validation.html_report.page import Page, by_strategy, esc, figure, number, table


def measured_rows(d: dict) -> list[dict]:
    """The plans measured with a figure the chip can reach (as the report's statistics take them)."""
    return [p for p in d["plans"] if p["measured_step_s"] is not None and not p["impossible"]]


def band(d: dict) -> tuple[float | None, str]:
    """The band drawn: the model's stated error where every plan's chip and regime has the same one,
    else the MAPE these runs measured (a calibrated host has no stated band)."""
    done = measured_rows(d)
    stated = {error_band(p["chip"], context_parallel=p["strategy"] != "none") for p in done}
    if len(stated) == 1 and None not in stated:
        (b,) = stated
        return b.relative, f"±{b.relative:.1%}: the model's stated error on {b.chip} ({b.regime})"
    if d["mape"] is None:
        return None, "no band: too few plans measured"
    return d[
        "mape"
    ], f"±{d['mape']:.1%}: these runs' MAPE (no stated band for {', '.join(sorted({p['chip'] for p in done}))})"


def predicted_vs_measured(d: dict) -> dict:
    done = measured_rows(d)
    data = by_strategy(
        done,
        x=lambda p: p["measured_step_s"],
        y=lambda p: p["predicted_step_s"],
        custom=lambda p: [p["run_id"] or p["label"], p["seq_len"], f"{p['error']:+.1%}"],
        hover="%{customdata[0]} at %{customdata[1]} tokens<br>"
        "measured %{x:.4g} s, predicted %{y:.4g} s (%{customdata[2]})<extra></extra>",
        size=10,
    )
    lo = min(min(p["measured_step_s"], p["predicted_step_s"]) for p in done) * 0.7
    hi = max(max(p["measured_step_s"], p["predicted_step_s"]) for p in done) * 1.4
    data.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": "predicted = measured",
            "x": [lo, hi],
            "y": [lo, hi],
            "line": {"color": "black", "dash": "dash", "width": 1},
            "hoverinfo": "skip",
        }
    )
    width, label = band(d)
    if width is not None:
        for sign in (1, -1):
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": label,
                    "legendgroup": "band",
                    "showlegend": sign == 1,
                    "x": [lo, hi],
                    "y": [lo * (1 + sign * width), hi * (1 + sign * width)],
                    "line": {"color": "#e6a100", "width": 1},
                    "hoverinfo": "skip",
                }
            )
    return {
        "data": data,
        "layout": {
            "title": {"text": "Predicted against measured step time", "x": 0.02},
            "xaxis": {"type": "log", "title": {"text": "measured step time (s)"}, "range": _log_range(lo, hi)},
            "yaxis": {"type": "log", "title": {"text": "predicted step time (s)"}, "range": _log_range(lo, hi)},
            "legend": {"orientation": "h", "y": -0.2},
            "height": 580,
        },
    }


def _log_range(lo: float, hi: float) -> list[float]:
    import math

    return [math.log10(lo), math.log10(hi)]


def draw(d: dict) -> Page:
    """The validate report of a report dict with at least one measured plan."""
    page = Page(d["title"])
    page.heading(d["title"], 1)
    s = d["summary"]
    page.raw(
        '<div class="key"><p>'
        + esc(
            f"plans measured {s.get('plans_measured', s.get('runs'))}; step-time MAPE {number(d['mape'], '.1%')}; "
            f"Spearman {number(d.get('spearman'), '.3f')}; regret {number(d.get('regret'), '.3f')}"
        )
        + "</p></div>"
    )
    rows = sorted(d["plans"], key=lambda p: (p["seq_len"], p["predicted_step_s"]))
    plans = table(
        ["plan", "seq_len", "predicted s", "measured s", "error", "predicted MFU", "measured MFU"],
        [
            [p["run_id"] or p["label"], p["seq_len"], f"{p['predicted_step_s']:.4f}"]
            + (
                [f"failed: {p['failure']}", "", "", ""]
                if p["measured_step_s"] is None
                else [
                    f"{p['measured_step_s']:.4f}",
                    f"{p['error']:+.1%}",
                    f"{p['predicted_mfu']:.2%}",
                    number(p["measured_mfu"], ".2%"),
                ]
            )
            for p in rows
        ],
    )
    chart = figure(predicted_vs_measured(d), "measured")
    page.raw(f'<div class="row"><div class="side">{chart}</div><div class="grow">{plans}</div></div>')
    if s.get("winners"):
        page.heading("Which strategy wins at each length")
        page.raw(
            table(
                ["seq_len", "predicted winner", "measured winner", "regret"],
                [
                    [n, w["predicted"], w["measured"], number(s["regret_per_seq_len"].get(n), ".3f")]
                    for n, w in s["winners"].items()
                ],
            )
        )
    return page
