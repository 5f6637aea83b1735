"""The search for the least HBM cap a step compiles under: the bisection against a
compiler stand-in whose least cap is known, and the reading of the TPU compiler's two
out-of-memory messages."""

from __future__ import annotations

import pytest

from cost_models.units import GiB, MiB
from validation.least_hbm import LEAST_HBM_PROBES, LEAST_HBM_RESOLUTION, hbm_needed, least_cap

pytestmark = pytest.mark.pure


def compiler_needing(least_mib: int, *, holds_mib: int, says_mib: int):
    """A stand-in compiler: compiles under any cap of at least `least_mib`, then reporting it holds
    `holds_mib`; under a smaller cap fails, saying it needed `says_mib`. Records each cap."""
    caps = []

    def compile_under(cap_mib):
        caps.append(cap_mib)
        return (True, holds_mib * MiB) if cap_mib >= least_mib else (False, says_mib * MiB)

    return compile_under, caps


@pytest.mark.parametrize(
    "least_mib, holds_mib, says_mib",
    [
        (4300, 4250, 4290),  # the compiler's figures a little off the true least, as measured
        (3000, 2950, 2400),  # far below the unconstrained figure, the error's figure too low to help
        (4505, 4480, 4505),  # the least is the unconstrained figure itself
    ],
)
def test_the_bracket_closes_on_the_least_cap(least_mib, holds_mib, says_mib):
    compile_under, caps = compiler_needing(least_mib, holds_mib=holds_mib, says_mib=says_mib)
    found = least_cap(compile_under, unconstrained_bytes=4505 * MiB - 100)
    assert found["cap_mib"] >= least_mib > found["failed_cap_mib"]
    assert found["cap_mib"] - found["failed_cap_mib"] <= LEAST_HBM_RESOLUTION * found["cap_mib"]
    assert found["compiled_bytes"] == holds_mib * MiB
    assert [p["cap_mib"] for p in found["probes"]] == caps and len(caps) <= LEAST_HBM_PROBES


def test_the_need_an_error_states_is_probed_next_when_it_lies_inside_the_bracket():
    # the figures a tpu7x compile gave: under every cap from 6211 MiB it holds 6158.8 MiB, under 6159 it
    # fails saying it needs 6164.5; the stated need is probed next and closes the bracket to 6 MiB
    compile_under, caps = compiler_needing(6165, holds_mib=6159, says_mib=6165)
    found = least_cap(compile_under, unconstrained_bytes=7314 * MiB)
    assert caps == [6582, 6159, 6165]
    assert (found["failed_cap_mib"], found["cap_mib"]) == (6159, 6165)


def test_a_step_that_needs_more_than_its_unconstrained_figure_is_probed_above_it():
    compile_under, caps = compiler_needing(4700, holds_mib=4650, says_mib=4700)
    found = least_cap(compile_under, unconstrained_bytes=4500 * MiB)
    assert found["cap_mib"] == 4700 and found["compiled_bytes"] == 4650 * MiB
    assert max(caps) == 4700


def test_both_out_of_memory_messages_are_read():
    # the buffer-assignment error, and the memory-space assignment's under a cap close to the need
    assert (
        hbm_needed(
            "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory "
            "required for HLO temporaries (1.00G) exceeds available HBM (500.00M)."
        )
        == GiB
    )
    assert hbm_needed(
        "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent error. Ran out of "
        "memory in memory space hbm. Used 4.24G of 4.23G hbm. Exceeded hbm capacity by 4.45M."
    ) == int(4.24 * GiB)
    assert hbm_needed("INTERNAL: Mosaic failed to compile") is None


def test_a_cap_no_probe_compiled_under_is_marked_unverified():
    # a step that compiles at no cap the probes reach (its error always asks for more than was given)
    found = least_cap(lambda cap_mib: (False, (cap_mib + 1000) * MiB), unconstrained_bytes=4500 * MiB)
    assert len(found["probes"]) == LEAST_HBM_PROBES and not any(p["fits"] for p in found["probes"])
    assert found["verified"] is False and found["compiled_bytes"] is None
    compile_under, _ = compiler_needing(4300, holds_mib=4250, says_mib=4290)
    assert least_cap(compile_under, unconstrained_bytes=4500 * MiB)["verified"] is True
