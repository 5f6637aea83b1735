"""The `cpplan` command line: one module per command family, built from the layers below.

Planning (explain, sweep, max-seq-len, export, import) uses `planner/` alone. The commands that
touch devices (run, compile, calibrate, validate, validate-memory) import `runtime/` and
`validation/` inside their handlers, so `cpplan explain` never imports jax; those that run on a
`cpu:N` host ask XLA for the N virtual devices before jax is imported.
"""

from cli.main import build_parser, main

__all__ = ["build_parser", "main"]
