"""A model's price depends on its repeating layer pattern, not on its layer count: counting the
layers' masks, searching and advising do the same work for a thousand layers as for two billion,
and a model no slice can hold is told so in one line without searching slice after slice."""

import dataclasses
import sys

import pytest
from bounded_work import at_most_lines

from cost_models.models import MODELS, ModelSpec
from planner import api
from planner.explanation import Explanation

pytestmark = pytest.mark.pure

WIDE = MODELS["llama3.1-8b"]


def _lines_run(call) -> int:
    """The lines of Python `call()` runs (every function it calls): work, counted alike on any host."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        count += event == "line"
        return trace

    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


@pytest.mark.parametrize("pattern", ["", "L", "LLLLLG", "GL", "LGG"])
@pytest.mark.parametrize("layers", [1, 2, 5, 6, 7, 13, 48])
def test_layer_masks_count_each_mask_as_a_walk_over_the_layers_would(pattern, layers):
    model = ModelSpec("m", layers, 64, 4, 2, 16, 128, 256, window=32 if "L" in pattern else 0, layer_pattern=pattern)
    walked = {}
    for layer in range(layers):
        walked[model.layer_mask(layer)] = walked.get(model.layer_mask(layer), 0) + 1
    assert dict(model.layer_masks) == walked and sum(walked.values()) == layers


def test_layer_masks_of_two_billion_layers_take_the_work_of_the_pattern():
    model = dataclasses.replace(MODELS["gemma3-12b"], num_layers=2**31 - 1)
    with at_most_lines(500):
        masks = dict(model.layer_masks)
    local = 5 * ((2**31 - 1) // 6) + 1  # 357913941 whole patterns of five, then one local layer
    assert masks == {model.global_mask: 2**31 - 1 - local, model.local_mask: local}


def test_a_search_does_the_same_work_for_a_thousand_layers_as_for_a_billion():
    def search(layers: int):
        return lambda: api.run_search(dataclasses.replace(WIDE, num_layers=layers), "8k", "v5e:2x2")

    search(7)()  # the chip rows and tables read once, before counting; then each model searched afresh
    with at_most_lines(int(1.01 * _lines_run(search(10**3)))):
        search(10**9)()


def test_a_model_no_slice_can_hold_is_told_so_at_once():
    huge = dataclasses.replace(WIDE, name="huge", num_layers=10**9)
    with at_most_lines(20_000_000):  # a search or two, not a walk over the layers
        result = api.run_search(huge, "128k", "v5p-256")
    with at_most_lines(50_000):  # no slice searched: each search runs millions of lines
        advice = Explanation(result).suggestions()
    # why fewer sequences are not offered on this slice, then why no slice is
    assert len(advice) == 2 and advice[0].startswith("fewer sequences per step on v5p:4x4x8: none fits")
    assert advice[1].startswith("nothing found: the weights and optimizer state alone")
    assert "of v5p:16x20x28, of 95.7 GiB; use a smaller model" in advice[1]


def test_reading_the_model_of_a_command_does_not_walk_its_layers(tmp_path):
    """A command that does not export to MaxText or price for it does not ask whether MaxText runs
    the model's local layers (a question answered layer by layer)."""
    from cli.args import model_of
    from cli.main import build_parser

    config = tmp_path / "windowed" / "config.json"
    config.parent.mkdir()
    config.write_text(
        '{"model_type": "mistral", "num_hidden_layers": 1000000000, "hidden_size": 64, "num_attention_heads": 4, '
        '"num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "sliding_window": 512}'
    )
    args = build_parser().parse_args(["explain", "--model", str(config), "--seq-len", "8k", "--topology", "v5e:2x2"])
    with at_most_lines(100_000):
        model = model_of(args)
    assert model.num_layers == 10**9 and model.window == 512


def test_whether_maxtext_runs_a_billion_windowed_layers_is_one_pattern_period():
    from cost_models.strategies.base import maxtext_local_layers_problem

    windowed = dataclasses.replace(WIDE, name="windowed", num_layers=10**9, window=512)
    with at_most_lines(50_000):
        problem = maxtext_local_layers_problem(windowed)
    assert "on every layer" in problem and "LLLLLG" in problem
    gemma_like = dataclasses.replace(windowed, layer_pattern="LLLLLG")
    with at_most_lines(50_000):
        assert maxtext_local_layers_problem(gemma_like) is None
