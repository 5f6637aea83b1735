"""The child process of `runtime.compile.compile_in_child`: `python -m runtime.compile_child REQUEST RESULT`
compiles the plan of REQUEST (JSON: plan, packed, compiler_options) deviceless with `compile_for` and writes
what came of it to RESULT (JSON: outcome "compiled" with the report's fields, "refused" with the compiler's
error, or "error" with cpplan's). A compiler that ends the process (a failed check: SIGABRT) leaves no
RESULT; the parent reads the reason from this process's output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from pathlib import Path


def answer_of(request: dict) -> dict:
    """Compiles the request's plan and says what came of it."""
    from cost_models.errors import CpplanError
    from planner.plan import Plan

    plan = Plan.from_dict(request["plan"])
    try:
        from jax.errors import JaxRuntimeError

        from runtime.compile import compile_for
    except ImportError as err:
        return {"outcome": "error", "message": f"compiling needs the jax runtime ({err}); pip install -e '.[runtime]'."}
    try:
        report = compile_for(plan, packed=request["packed"], compiler_options=request["compiler_options"] or None)
    except CpplanError as err:
        return {"outcome": "error", "message": str(err)}
    except JaxRuntimeError as err:
        return {"outcome": "refused", "message": str(err).strip()}
    fields = {f.name: getattr(report, f.name) for f in dataclasses.fields(report) if f.name != "plan"}
    return {"outcome": "compiled", "report": fields}


def main(argv: list[str]) -> int:
    request_path, result_path = argv
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # an interrupt ends the compile at once, not after it
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    answer = answer_of(json.loads(Path(request_path).read_text()))
    partial = f"{result_path}.partial"
    Path(partial).write_text(json.dumps(answer))
    os.replace(partial, result_path)  # the parent reads a whole answer or none
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
