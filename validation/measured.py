"""Step times measured elsewhere: a CSV of plans and seconds, or MaxText log lines with its flags."""

from __future__ import annotations

import csv
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from cost_models.errors import CpplanError
from cost_models.models import get_model
from planner.options import parse_seq_len
from planner.plan import Plan, make_mesh

CSV_COLUMNS = (
    "model",
    "topology",
    "seq_len",
    "global_batch",
    "strategy",
    "data",
    "fsdp",
    "context",
    "context_ulysses",
    "tensor",
    "remat",
    "load_balance",
    "step_seconds",
)
MAXTEXT_STEP = re.compile(r"completed step:\s*(\d+),\s*seconds:\s*(\S+?),\s*TFLOP/s/device:\s*(\S+)")


@dataclass(frozen=True)
class MeasuredStep:
    """One plan and the step time measured for it."""

    plan: Plan
    step_seconds: float
    source: str


def _step_seconds(value, where: str) -> float:
    """A measured step time: a positive, finite number of seconds."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise CpplanError(f"{where}: step time {value!r} is not a number of seconds.") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise CpplanError(f"{where}: step time {value!r} must be a positive, finite number of seconds.")
    return seconds


def _count(row: dict, column: str, default: "int | None" = None) -> int:
    """A positive whole number from a CSV cell (empty takes `default`)."""
    text = (row.get(column) or "").strip()
    if not text and default is not None:
        return default
    if not text.isdecimal() or int(text) < 1:
        raise CpplanError(f"{column}={text!r} must be a positive whole number.")
    return int(text)


def read_csv_rows(path: Path) -> list[dict]:
    """The rows of a CSV file under its header, a UTF-8 byte-order mark ignored.

    Raises:
        CpplanError: unreadable or not UTF-8 text, or a column named twice (which cell would count?).
    """
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
        header = next(csv.reader(lines[:1]), [])
        rows = list(csv.DictReader(lines))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise CpplanError(f"cannot read {str(path)!r}: {err}") from None
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:
        raise CpplanError(f"{str(path)!r}: the header names {', '.join(twice)} more than once; name each column once.")
    return rows


def read_csv(path: "str | Path") -> list[MeasuredStep]:
    """Rows of `CSV_COLUMNS` (a header line first); axis sizes default to 1, remat to full.

    The columns: model (a name or config.json path), topology (e.g. cpu:8), seq_len (131072, 128k,
    4M), global_batch (sequences per step), strategy (all_gather, ulysses, ring, usp, none), the
    mesh axes data, fsdp, context, context_ulysses, tensor, remat, load_balance (zigzag or none)
    and step_seconds (the measured seconds per step).

    Raises:
        CpplanError: unreadable file, missing or unknown columns, or a row that is not a plan
            with a positive, finite step time (naming its line).
    """
    path = Path(path)
    rows = read_csv_rows(path)
    needed = {"model", "topology", "seq_len", "global_batch", "strategy", "step_seconds"}
    if not rows or not needed <= set(rows[0]):
        raise CpplanError(
            f"{str(path)!r}: a measured-steps CSV needs a header with at least {sorted(needed)} and "
            f"one row per plan; all columns: {', '.join(CSV_COLUMNS)}."
        )
    unknown = sorted(str(c) for c in set(rows[0]) - set(CSV_COLUMNS) - {None})
    if unknown:
        raise CpplanError(f"{str(path)!r}: unknown columns {unknown}; the columns are {', '.join(CSV_COLUMNS)}.")
    axes = ("data", "fsdp", "context", "context_ulysses", "tensor")
    no_mesh = "" if set(axes) & set(rows[0]) else f" (the file gives no mesh columns, {', '.join(axes)}: each is 1)"
    out = []
    for line, row in enumerate(rows, start=2):
        where = f"{path.name} line {line}"
        if None in row or None in row.values():
            raise CpplanError(
                f"{where}: {'more' if None in row else 'fewer'} cells than the header's "
                f"{len(rows[0]) - (None in rows[0])} columns; give one cell per column."
            )
        seconds = _step_seconds(row["step_seconds"], where)
        try:
            mesh = make_mesh(**{a: _count(row, a, 1) for a in axes})
            plan = Plan(
                model=get_model(row["model"]),
                topology=row["topology"],
                seq_len=parse_seq_len(row["seq_len"]),
                global_batch=_count(row, "global_batch"),
                mesh=mesh,
                cp_strategy=row["strategy"],
                load_balance=row.get("load_balance") or "none",
                remat=row.get("remat") or "full",
            )
        except CpplanError as err:
            raise CpplanError(f"{where}: {str(err).rstrip('.')}{no_mesh}.") from None
        out.append(MeasuredStep(plan, seconds, f"{path.name}:{line}"))
    return out


def read_maxtext_log(log: "str | Path", flags: str) -> MeasuredStep:
    """The median step time of a MaxText run (steps after the first) with the flags it ran with.

    Args:
        log: the MaxText log file.
        flags: the run's flags as `key=value` text, or the path of a file holding them.
    Raises:
        CpplanError: no `completed step: N, seconds: X, TFLOP/s/device: Y` line after step 0, a
            step time that is not a positive, finite number, or flags that are not a plan.
    """
    path = Path(log)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise CpplanError(f"cannot read MaxText log {str(path)!r}: {err}") from None
    timed = [
        _step_seconds(m.group(2), f"{path.name} step {m.group(1)}")
        for m in MAXTEXT_STEP.finditer(text)
        if int(m.group(1)) > 0
    ]
    if not timed:
        raise CpplanError(f"{str(path)!r} has no 'completed step: N, seconds: X, TFLOP/s/device: Y' line after step 0.")
    return MeasuredStep(
        Plan.from_maxtext(_flag_text(flags)), statistics.median(timed), f"{path.name} ({len(timed)} steps)"
    )


def _flag_text(flags: str) -> str:
    """The flags themselves: `key=value` text is taken as is, anything else read as a file's path."""
    if "=" in flags:
        return flags
    try:
        return Path(flags).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise CpplanError(
            f"--maxtext-flags {flags[:80]!r} holds no key=value flag and is not a readable file "
            f"({err.strerror if isinstance(err, OSError) else err}); give the flags or their file."
        ) from None
