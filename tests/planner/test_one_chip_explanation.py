"""On one chip: where nothing fits at the tokens per step aimed for, the advice says that fewer
sequences were searched down to one and why none fits (offering a count where one does); and the
chosen plan's communication lines say there is none, rather than standing empty."""

import pytest

from planner import api

pytestmark = pytest.mark.pure


def _advice(text: str) -> list[str]:
    return [line.removeprefix("  - ") for line in text.split("What would fit:\n", 1)[1].splitlines()]


def test_nothing_fitting_one_chip_says_fewer_sequences_were_searched_and_why_none_fits():
    e = api.explain("llama3.1-8b", "128k", "v5e:1x1")
    assert e.best is None and e.result.global_batch == 32
    fewer = _advice(str(e))[0]
    assert fewer.startswith("fewer sequences per step on v5e:1x1: none fits, not even one 128K-token sequence")
    assert "counts from 32 down to 1 were searched" in fewer
    assert "the weights and optimizer state alone need 89.7 GiB per device of 16.0 GiB" in fewer
    # and it is so: one sequence fits no plan either
    assert api.explain("llama3.1-8b", "128k", "v5e:1x1", global_batch=1).best is None


def test_where_the_weights_fit_but_no_sequence_does_the_advice_says_so_and_offers_a_shorter_one():
    advice = _advice(str(api.explain("small", "2M", "v5e:1x1")))
    assert advice[0] == (
        "fewer sequences per step on v5e:1x1: none fits, not even one 2M-token sequence "
        "(counts from 2 down to 1 were searched)"
    )
    assert any(line.startswith("a shorter sequence, the longest that fits") for line in advice)


def test_an_exact_batch_on_one_chip_is_offered_the_fewer_sequences_that_fit():
    advice = _advice(str(api.explain("small", "128k", "v5e:1x1", global_batch=32)))
    assert advice[0].startswith("global_batch=7 sequences (917,504 tokens per step)")
    # the most that fit: 8 are priced over the chip's 16 GiB (the layer loop's early reads of the next layer's
    # offloaded values, `offload_reads_next_layer_early`, take them past it)
    assert api.explain("small", "128k", "v5e:1x1", global_batch=8).result.best is None


def test_a_single_device_plan_says_it_has_no_communication():
    text = str(api.explain("small", "128k", "v5e:1x1", global_batch=1))  # nothing offloaded to the host
    assert "  communication  none: one device\n  exposed        none: nothing to hide\n" in text
