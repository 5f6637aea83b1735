"""`python -m cli`: the `cpplan` command."""

from cli.main import console

console()
