"""Step times measured elsewhere: a CSV of plans and seconds, or MaxText log lines with its flags."""
from __future__ import annotations

import csv
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from cost_models.errors import CpplanError
from cost_models.models import get_model
from planner.plan import Plan, make_mesh

CSV_COLUMNS = ("model", "topology", "seq_len", "global_batch", "strategy", "data", "fsdp", "context",
               "context_ulysses", "tensor", "remat", "load_balance", "step_seconds")
MAXTEXT_STEP = re.compile(r"completed step:\s*(\d+),\s*seconds:\s*([\d.]+),\s*TFLOP/s/device:\s*([\d.]+)")


@dataclass(frozen=True)
class MeasuredStep:
    """One plan and the step time measured for it."""

    plan: Plan
    step_seconds: float
    source: str


def read_csv(path: "str | Path") -> list[MeasuredStep]:
    """Rows of `CSV_COLUMNS` (a header line first); axis sizes default to 1, remat to full.

    Raises:
        CpplanError: unreadable file, missing columns, or a row that is not a plan.
    """
    path = Path(path)
    try:
        rows = list(csv.DictReader(path.read_text().splitlines()))
    except OSError as err:
        raise CpplanError(f"cannot read {str(path)!r}: {err}") from None
    needed = {"model", "topology", "seq_len", "global_batch", "strategy", "step_seconds"}
    if not rows or not needed <= set(rows[0]):
        raise CpplanError(f"{str(path)!r}: a measured-steps CSV needs a header with at least {sorted(needed)}; "
                          f"all columns: {', '.join(CSV_COLUMNS)}.")
    out = []
    for line, row in enumerate(rows, start=2):
        try:
            mesh = make_mesh(**{a: int(row.get(a) or 1) for a in ("data", "fsdp", "context", "context_ulysses", "tensor")})
            plan = Plan(model=get_model(row["model"]), topology=row["topology"], seq_len=int(row["seq_len"]),
                        global_batch=int(row["global_batch"]), mesh=mesh, cp_strategy=row["strategy"],
                        load_balance=row.get("load_balance") or "none", remat=row.get("remat") or "full")
            out.append(MeasuredStep(plan, float(row["step_seconds"]), f"{path.name}:{line}"))
        except (ValueError, CpplanError) as err:
            raise CpplanError(f"{path.name} line {line}: {err}") from None
    return out


def read_maxtext_log(log: "str | Path", flags: str) -> MeasuredStep:
    """The median step time of a MaxText run (steps after the first) with the flags it ran with.

    Raises:
        CpplanError: no `completed step: N, seconds: X, TFLOP/s/device: Y` line after step 0.
    """
    path = Path(log)
    try:
        text = path.read_text()
    except OSError as err:
        raise CpplanError(f"cannot read MaxText log {str(path)!r}: {err}") from None
    steps = [(int(m.group(1)), float(m.group(2))) for m in MAXTEXT_STEP.finditer(text)]
    timed = [seconds for step, seconds in steps if step > 0]
    if not timed:
        raise CpplanError(f"{str(path)!r} has no 'completed step: N, seconds: X, TFLOP/s/device: Y' line after step 0.")
    flag_text = Path(flags).read_text() if Path(flags).is_file() else flags
    return MeasuredStep(Plan.from_maxtext(flag_text), statistics.median(timed), f"{path.name} ({len(timed)} steps)")
