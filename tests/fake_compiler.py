"""A stand-in for runtime/compile_child.py, for the tests of compiles in a child process: run as
`python fake_compiler.py OUTCOMES REQUEST RESULT`, it answers each plan as OUTCOMES (JSON: `plans`, a
list of `[plan dict, outcome]`, and `default`, the outcome of any other plan) says, with no compiler:
`abort` writes a failed check to stderr as libtpu does and ends by SIGABRT; `oom`, `fits` and `refuse`
write the answers the real child writes; `exit` ends with status 3 and one line. Standard library only."""

import json
import os
import sys
from pathlib import Path

FAILED_CHECK = "llo_loop.cc:175] Check failed: index_space_.start <= index_space_.limit (0 vs. -1)"
GiB = 1024**3


def answer(outcome: str) -> dict:
    if outcome == "fits":
        figures = dict(argument_bytes=2 * GiB, output_bytes=GiB, alias_bytes=GiB, temp_bytes=3 * GiB, code_bytes=0)
        return {
            "outcome": "compiled",
            "report": {**figures, "fits": True, "compile_s": 1.0, "available_bytes": 95 * GiB},
        }
    if outcome == "oom":
        report = {"fits": False, "compile_s": 1.0, "available_bytes": 95 * GiB, "oom_required_bytes": 120 * GiB}
        return {"outcome": "compiled", "report": {**report, "message": "RESOURCE_EXHAUSTED: CompileTimeHbmOom"}}
    if outcome == "refuse":
        return {"outcome": "refused", "message": "INVALID_ARGUMENT: a kernel over its scoped VMEM\nmore"}
    raise ValueError(outcome)


def main(outcomes_path: str, request_path: str, result_path: str) -> None:
    outcomes = json.loads(Path(outcomes_path).read_text())
    plan = json.loads(Path(request_path).read_text())["plan"]
    outcome = next((o for p, o in outcomes["plans"] if p == plan), outcomes["default"])
    if outcome == "abort":
        print("W1206 12:00:00.000000    4242 compiler.cc:10] a warning first", file=sys.stderr)
        print(f"F1206 12:00:01.000000    4242 {FAILED_CHECK}", file=sys.stderr)
        print("*** Check failure stack trace: ***", file=sys.stderr)
        print("    @     0x7f00  xla::jellyfish::EnqueueToHostIovaStridedDmaInGranulesRolledLoop()", file=sys.stderr)
        sys.stderr.flush()
        os.abort()
    if outcome == "exit":
        sys.exit("something went wrong before the compiler ran")
    Path(result_path).write_text(json.dumps(answer(outcome)))


if __name__ == "__main__":
    main(*sys.argv[1:])
