"""One self-contained HTML page: static sections (headings, text, tables, the torus picture), readable
without JavaScript, and plotly figures, with plotly.js inlined once so the file opens offline."""

from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from cost_models.errors import CpplanError
from validation.outputs import write_atomic

REPORT_EXTRA = "pip install 'cpplan[report]'"
# the figures' toolbar without plotly's logo (a link out of the offline file)
CONFIG = {"displaylogo": False, "responsive": True}
# plain white figures, set here rather than by a plotly template (a template is inlined into every figure)
LAYOUT = {"margin": {"l": 60, "r": 20, "t": 50, "b": 50}, "plot_bgcolor": "white", "paper_bgcolor": "white"}
AXIS = {"gridcolor": "#e5e5e5", "zerolinecolor": "#bbb", "linecolor": "#888", "showline": True}
STRATEGY_COLOURS = {
    "none": "#7f7f7f",
    "all_gather": "#1f77b4",
    "ulysses": "#2ca02c",
    "ring": "#d62728",
    "usp": "#9467bd",
}
STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1b1b1b;background:#fafafa}
main{max-width:1180px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:1.45rem;margin:.4em 0}h2{font-size:1.15rem;margin:1.6em 0 .4em;border-bottom:1px solid #ddd}
h3{font-size:1rem;margin:1em 0 .3em}p{margin:.35em 0;line-height:1.4}
table{border-collapse:collapse;font-size:.85rem;margin:.4em 0}
th,td{border:1px solid #d5d5d5;padding:2px 7px;text-align:right}th{background:#eee}
td.l,th.l{text-align:left}.key{font-size:1.05rem;background:#fff;border:1px solid #ccc;padding:8px 12px}
.row{display:flex;gap:18px;align-items:flex-start;flex-wrap:wrap}.grow{flex:1 1 500px;min-width:0;overflow-x:auto}
.side{flex:0 0 560px;max-width:100%}.rejections{flex:0 0 380px}.rejections td.l{white-space:normal}
.fig{background:#fff;border:1px solid #ddd}details{margin:.3em 0}summary{cursor:pointer;color:#333}
.torus{display:flex;gap:10px;flex-wrap:wrap;align-items:flex-start;margin:.3em 0 .8em}
.layer{font-size:.72rem;text-align:center}.layer table{margin:2px 0}
.layer td{width:22px;height:20px;padding:0;text-align:center;border:1px solid #fff;font-size:.7rem}
.layer td.c{width:13px}.slice{border:1px dashed #999;padding:4px 6px}
.note{color:#555;font-size:.85rem}
"""


def plotly_parts():
    """plotly's HTML writer and its JavaScript bundle, imported only when a report is drawn.

    Raises:
        CpplanError: plotly is not installed.
    """
    try:
        import plotly.io as pio
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise CpplanError(
            f"--html reports are drawn with plotly, which is not installed; {REPORT_EXTRA} (or pip install plotly)."
        ) from None
    return pio, get_plotlyjs


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def number(value: float | None, spec: str, unit: str = "") -> str:
    """A figure for a table cell; a missing or non-finite one reads n/a (a report holds no NaN)."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return format(value, spec) + unit


@dataclass
class Page:
    """A report page built section by section; `html()` is the whole self-contained file."""

    title: str
    parts: list[str] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.parts.append(f"<h{level}>{esc(text)}</h{level}>")

    def text(self, text: str, css: str = "") -> None:
        self.parts.append(f'<p class="{css}">{esc(text)}</p>' if css else f"<p>{esc(text)}</p>")

    def raw(self, markup: str) -> None:
        self.parts.append(markup)

    def html(self) -> str:
        _, plotlyjs = plotly_parts()
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(self.title)}</title><style>{STYLE}</style>"
            f'<script type="text/javascript">{plotlyjs()}</script></head>\n<body><main>'
            '<noscript><p class="note">The charts need JavaScript; every figure they draw is in the tables '
            "beside them.</p></noscript>\n" + "\n".join(self.parts) + "\n</main></body></html>\n"
        )


def table(header: list[str], rows: list[list], *, left: int = 1) -> str:
    """An HTML table, escaped; the first `left` columns are text (left-aligned), the rest figures."""
    head = "".join(f'<th class="{"l" if i < left else ""}">{esc(h)}</th>' for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{esc(c)}</td>' for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(fig: dict, name: str) -> str:
    """A plotly figure (a dict of data and layout) as a div and the script that draws it."""
    pio, _ = plotly_parts()
    layout = {**LAYOUT, **fig.get("layout", {})}
    layout["title"] = {"x": 0.01, "xanchor": "left", **layout.get("title", {})}  # clear of the toolbar
    for axis in ("xaxis", "yaxis"):
        layout[axis] = {**AXIS, **layout.get(axis, {})}
    return (
        '<div class="fig">'
        + pio.to_html(
            {"data": fig["data"], "layout": layout},
            include_plotlyjs=False,
            full_html=False,
            validate=False,
            config=CONFIG,
            div_id=name,
            default_width="100%",
            default_height=f"{layout.get('height', 420)}px",
        )
        + "</div>"
    )


def by_strategy(rows: list[dict], *, x, y, custom, hover: str, size: int) -> list[dict]:
    """One marker trace per strategy, in the order the rows first name them, coloured as every report
    colours that strategy; `x`, `y` and `custom` read a row."""
    traces = []
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        mine = [r for r in rows if r["strategy"] == strategy]
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": strategy,
                "x": [x(r) for r in mine],
                "y": [y(r) for r in mine],
                "customdata": [custom(r) for r in mine],
                "hovertemplate": hover,
                "marker": {"color": STRATEGY_COLOURS.get(strategy), "size": size, "opacity": 0.8},
            }
        )
    return traces


def check_writable(path: "str | Path") -> Path:
    """Refuses an --html path that cannot be written before any work is done.

    Raises:
        CpplanError: the directory is missing or not writable, or the path is a directory.
    """
    path = Path(path)
    if path.is_dir():
        raise CpplanError(f"--html {str(path)!r} is a directory; give a file name, e.g. {path / 'report.html'}.")
    parent = path.parent
    if not parent.is_dir():
        raise CpplanError(f"--html {str(path)!r}: the directory {str(parent)!r} does not exist; create it first.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CpplanError(f"--html {str(path)!r}: the directory {str(parent)!r} cannot be written; give another path.")
    plotly_parts()
    return path


def write(page: Page, path: "str | Path") -> Path:
    """Writes the page at `path`, atomically."""
    return write_atomic(check_writable(path), page.html())
