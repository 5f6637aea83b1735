"""The report command: a saved `--json` (explain, sweep) or validate's report.json drawn as HTML."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.args import add_command, html_target, write_html
from cost_models.errors import CpplanError


def cmd_report(args: argparse.Namespace) -> int:
    """Draws the HTML report of a saved JSON file."""
    from validation.html_report.draw import read_saved

    if args.html is None:
        # a path the user named is theirs to replace (as every --html is); one cpplan chose is not
        default = Path(args.file).with_suffix(".html")
        if default.exists() or default.is_symlink():
            raise CpplanError(
                f"{str(default)!r} exists already (report writes FILE.json's name with .html by default); "
                f"give --html {default} to replace it, or --html with another file name."
            )
        args.html = str(default)
    html = html_target(args)
    write_html(read_saved(args.file), html, source=repr(args.file))
    return 0


def register(sub) -> None:
    """Adds report to the subparsers `sub`."""
    p = add_command(sub, "report", cmd_report, "draw a saved explain/sweep --json or validate report.json as HTML")
    p.add_argument("file", metavar="FILE.json", help="the output of explain --json or sweep --json, or report.json")
    p.add_argument("--html", metavar="FILE", help="where to write the report (default: FILE.json's name, .html)")
