"""Which report a dict draws, and the refusal where it has nothing to draw: explain's `--json`
(an object with `best`), sweep's (a list of rows with `seq_len`) or validate's `report.json` (an object
with `plans`)."""

from __future__ import annotations

import json
from pathlib import Path

from cost_models.errors import CpplanError
from validation.html_report import explain, measured, sweep
from validation.html_report.page import Page

KINDS = "the JSON of `cpplan explain --json`, `cpplan sweep --json` or validate's report.json"


def kind_of(data) -> str | None:
    """'explain', 'sweep', 'validate', or None for any other JSON."""
    if isinstance(data, dict) and {"best", "best_per_strategy", "rejections"} <= set(data):
        return "explain"
    if isinstance(data, dict) and {"title", "summary", "plans"} <= set(data):
        return "validate"
    if isinstance(data, list) and data and all(isinstance(r, dict) and {"seq_len", "fits"} <= set(r) for r in data):
        return "sweep"
    return None


def page_of(data, source: str, *, longest: dict | None = None, title: str | None = None) -> Page:
    """The report page of `data` (see `kind_of`); `source` names it in errors.

    Raises:
        CpplanError: data of no known kind, or with nothing to draw.
    """
    kind = kind_of(data)
    if kind is None:
        what = f"an object with keys {', '.join(sorted(data)[:8])}" if isinstance(data, dict) else type(data).__name__
        raise CpplanError(f"{source} is {what}, not {KINDS}; give one of those.")
    if kind == "explain":
        if data["best"] is None:
            raise CpplanError(
                f"{source}: no plan fits, so there is no plan to draw; `cpplan explain` without --json says what "
                f"would fit."
            )
        if "feasible_plans" not in data:
            raise CpplanError(
                f"{source} has no feasible_plans (an older cpplan wrote it); run `cpplan explain --json` again."
            )
        return explain.draw(data)
    if kind == "sweep":
        if not any(r["fits"] for r in data):
            raise CpplanError(f"{source}: no swept length fits, so there is nothing to draw; try shorter --seq-lens.")
        return sweep.draw(data, longest, title=title or "cpplan sweep")
    if not measured.measured_rows(data):
        raise CpplanError(f"{source}: no plan was measured, so there is nothing to draw; see its report.md for why.")
    return measured.draw(data)


def read_saved(path: str) -> object:
    """The JSON held in `path`.

    Raises:
        CpplanError: the file cannot be read or is not JSON.
    """
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise CpplanError(f"cannot read {path!r} ({getattr(err, 'strerror', None) or err}); give {KINDS}.") from None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise CpplanError(f"{path!r} is not JSON ({err}); give {KINDS}.") from None
