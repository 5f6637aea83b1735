"""A strategy registered in one place, for the tests that find it everywhere strategies are listed:
all-gather's rules, layout and price under another name, which MaxText does not have."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from cost_models.strategies import STRATEGIES, register
from cost_models.strategies.all_gather import AllGather
from cost_models.vocabulary import CPStrategy

NAME = "toy_gather"


@contextlib.contextmanager
def registered_toy(*, runtime: bool = False) -> Iterator[CPStrategy]:
    """Registers the toy strategy's spec (and, with `runtime`, all-gather's runtime for it) for
    the duration of the block, then removes every trace of it."""
    toy = CPStrategy.register(NAME)

    class ToyGather(AllGather):
        strategy = toy
        maxtext_name = None

        def describe(self, ring: int, ulysses: int, zigzag: bool) -> str:
            return f"toy gather over context={ring}"

    register(ToyGather())
    if runtime:
        from runtime.attention import IMPLEMENTATIONS, all_gather

        IMPLEMENTATIONS[toy] = all_gather
    try:
        yield toy
    finally:
        STRATEGIES.pop(toy)
        CPStrategy._members.pop(NAME)
        delattr(CPStrategy, NAME.upper())
        if runtime:
            IMPLEMENTATIONS.pop(toy)
