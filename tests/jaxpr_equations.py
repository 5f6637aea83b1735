"""Every equation of a traced program, into the programs its equations call (a scan's body, a remat's,
a custom gradient's), for tests that count what a step traces (tests/conftest.py puts tests/ on the path)."""

from collections.abc import Iterator

import jax
import jax.extend


def all_equations(jaxpr) -> Iterator:
    """The equations of `jaxpr` and of every jaxpr in their parameters, depth first."""
    for eqn in jaxpr.eqns:
        yield eqn
        for inner in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from all_equations(inner)
