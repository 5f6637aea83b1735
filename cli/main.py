"""`cpplan`: the parser of every command, and one command run with cpplan's exit statuses."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from typing import NoReturn

from cli import booking, planning, reporting, running, validating
from cli.args import Parser
from cli.devices import note_uncalibrated_host
from cli.signals import INTERRUPTS
from cost_models.errors import CpplanError
from validation.steptime import compiles_in_flight

FAMILIES = (planning, running, validating, reporting, booking)
# the commands whose answer is a predicted step time
PREDICTING = ("explain", "sweep", "run", "validate")


def build_parser() -> Parser:
    """The `cpplan` parser with every subcommand; the parsed namespace carries its handler as `func`."""
    parser = Parser(
        prog="cpplan",
        allow_abbrev=False,
        description="Plan context parallelism for long-context training: price, choose, explain, run and validate.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for family in FAMILIES:
        family.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one `cpplan` command.

    Args:
        argv: the arguments (default: the process's).
    Returns:
        The exit status: 0 done, 1 nothing fits / does not fit / nothing measured, 2 bad input,
        128 + the signal's number when interrupted (Ctrl-C or SIGTERM).
    """
    args = build_parser().parse_args(argv)
    with INTERRUPTS.handled():
        try:
            status = args.func(args)
            answered = status in (0, 1) and args.command in PREDICTING and args.command != "run"
            if answered and getattr(args, "topology", None):
                note_uncalibrated_host(args.topology)
            return status
        except CpplanError as err:
            print(f"cpplan: error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("cpplan: interrupted", file=sys.stderr)
            return INTERRUPTS.exit_status(signal.SIGINT)
        except BrokenPipeError:  # output piped into `head` and the like
            sys.stderr.close()
            return 0


def console() -> NoReturn:
    """The `cpplan` executable: `main`'s status as the process's.

    An interrupted validation leaves its compile-ahead threads compiling plans it will not run. Python's
    teardown would destroy XLA's compiler under them and abort the process ("terminate called ...") after
    the results were written, so such a process ends without it: its output flushed where it still can be
    (a reader gone, as `head`, closes it), an error `main` did not expect printed and given status 1.
    """
    try:
        status = main()
    except Exception:
        if not compiles_in_flight():
            raise
        with contextlib.suppress(OSError, ValueError):
            traceback.print_exc()
        status = 1
    if compiles_in_flight():
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(status)
    sys.exit(status)
