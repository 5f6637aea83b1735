"""`python -m cli`: the `cpplan` command."""

import sys

from cli.main import main

sys.exit(main())
