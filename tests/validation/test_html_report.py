"""The HTML reports' figures, drawn from the dicts `--json` prints: the same numbers as the text
(no second computation), every feasible plan in the plan space, the placement's groups, and a clear
refusal of JSON that is not a report's or has nothing to draw."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

import planner
from cost_models.errors import CpplanError
from cost_models.units import GiB
from planner.explanation import format_seconds
from planner.plan import Plan
from validation.html_report import explain, measured, sweep
from validation.html_report.draw import kind_of, page_of
from validation.html_report.torus import axis_groups

pytestmark = pytest.mark.pure

VALIDATE_JSON = Path(__file__).resolve().parents[1] / "testdata" / "validate_tiny_cpu8_report.json"


@pytest.fixture(scope="module")
def tpu7x():
    return planner.explain("llama3.1-8b", "1M", "tpu7x-128")


def test_the_plan_space_holds_every_feasible_plan_and_marks_the_choice(tpu7x):
    d = tpu7x.to_dict()
    fig = explain.plan_space(d)
    by_strategy = {t["name"]: t for t in fig["data"]}
    plotted = sum(len(t["x"]) for name, t in by_strategy.items() if name != "chosen")
    assert plotted == len(tpu7x.result.ranked) == d["feasible"]
    chosen = by_strategy["chosen"]
    assert chosen["y"] == [tpu7x.estimate.step_time_s]
    assert chosen["x"][0] == pytest.approx(tpu7x.estimate.hbm_bytes_per_device / GiB)
    band = next(s for s in fig["layout"]["shapes"] if s["type"] == "rect")
    assert band["y1"] == pytest.approx(tpu7x.estimate.step_time_s * (1 + tpu7x.error_band.relative))
    capacity = next(s for s in fig["layout"]["shapes"] if s["type"] == "line")
    assert capacity["x0"] == pytest.approx(tpu7x.estimate.hbm_capacity_bytes / GiB)


def test_the_step_bars_sum_to_the_step_time_and_the_memory_bars_peak_at_its_hbm(tpu7x):
    d = tpu7x.to_dict()
    plans = explain.compared(d)
    assert plans[0][1]["summary"] == d["best"]["summary"] and len(plans) == len(d["best_per_strategy"])
    for _, r in plans:
        terms = explain.step_terms(r["estimate"])
        stacked = sum(v for k, v in terms.items() if k != "hidden communication")
        assert stacked == pytest.approx(r["estimate"]["step_time_s"], rel=1e-9)
        hidden = sum(r["estimate"]["comm_s"].values()) - sum(r["estimate"]["exposed_s"].values())
        assert terms["hidden communication"] == pytest.approx(hidden)
        phases = explain.memory_phases(r["estimate"])
        backward = max(phases["all step"] + phases["layer"], explain.loss_state(r["estimate"]) + phases["loss"])
        peak = max(backward, phases["update"], phases["forward"])
        assert peak == pytest.approx(r["estimate"]["hbm_bytes_per_device"], rel=1e-9)
    bars = explain.step_breakdown(d)["data"]
    assert {t["name"] for t in bars} >= {"compute: attention", "compute: matmul", "HBM-bound work"}


def test_the_page_shows_the_chosen_plan_and_its_figures(tpu7x):
    markup = explain.draw(tpu7x.to_dict()).html()
    summary = tpu7x.to_dict()["best"]["summary"]
    assert summary in markup
    assert f"{tpu7x.estimate.mfu:.1%}" in markup and format_seconds(tpu7x.estimate.step_time_s) in markup
    assert "NaN" not in _data_of(markup)
    assert markup.count("Plotly.newPlot") == 3 and "<script src=" not in markup  # one inlined plotly.js


def _data_of(markup: str) -> str:
    """The figures' data: what follows each Plotly.newPlot call."""
    return "".join(part[:50_000] for part in markup.split("Plotly.newPlot(")[1:])


def test_each_axis_group_holds_the_axis_size_of_devices_in_rank_order():
    e = planner.explain("llama3.1-8b", "1M", "v5p-128", num_slices=2)
    plan = e.best
    groups = axis_groups(plan)
    assert set(groups) == {a for a, s in plan.mesh if s > 1}
    for axis, (group, rank) in groups.items():
        size = plan.axis_size(axis)
        assert group.shape == (2, 4, 4, 4) and group.max() + 1 == plan.topology_spec.num_devices // size
        for g in range(group.max() + 1):
            assert sorted(rank[group == g]) == list(range(size))
    data_group, data_rank = groups["data"]
    assert (data_rank[0] == 0).all() and (data_rank[1] == 1).all()  # data crosses the two slices over DCN


def test_sweep_crossovers_are_where_the_best_strategy_changes():
    rows = [
        {"seq_len": 1 << 17, "fits": True, "strategy": "ring"},
        {"seq_len": 1 << 19, "fits": True, "strategy": "usp"},
        {"seq_len": 1 << 20, "fits": False},
        {"seq_len": 1 << 22, "fits": True, "strategy": "usp"},
    ]
    assert sweep.crossovers(rows) == [(1 << 17, 1 << 19, "ring", "usp")]


def test_the_sweep_key_gives_the_length_that_fits_with_the_memory_error_to_spare():
    longest = {"max_seq_len": 13 << 17, "max_seq_len_surely": 12 << 17, "estimate": {"memory_margin": 0.036}}
    assert sweep._surely(longest) == "; 1536K tokens with the memory price's measured error (3.6%) to spare"
    assert sweep._surely({**longest, "max_seq_len_surely": None}).startswith("; no length with")
    assert sweep._surely({**longest, "max_seq_len_surely": 13 << 17}) == ""


def test_the_validate_report_plots_every_measured_plan_with_a_band():
    d = json.loads(VALIDATE_JSON.read_text())
    fig = measured.predicted_vs_measured(d)
    points = [t for t in fig["data"] if t["mode"] == "markers"]
    assert sum(len(t["x"]) for t in points) == d["summary"]["plans_measured"]
    width, label = measured.band(d)
    assert width == pytest.approx(d["mape"]) and "MAPE" in label  # a host has no stated band
    markup = page_of(d, "report.json").html()
    for p in d["plans"]:
        assert f"{p['predicted_step_s']:.4f}" in markup


def test_kinds_and_refusals():
    assert kind_of([{"seq_len": 1, "fits": False}]) == "sweep"
    assert kind_of(json.loads(VALIDATE_JSON.read_text())) == "validate"
    with pytest.raises(CpplanError, match="not the JSON of `cpplan explain --json`"):
        page_of({"flags": {}}, "x.json")
    with pytest.raises(CpplanError, match="no swept length fits"):
        page_of([{"seq_len": 1024, "fits": False}], "x.json")
    nothing = planner.explain("llama3.1-70b", "4M", "v5p-16").to_dict()
    with pytest.raises(CpplanError, match="no plan fits, so there is no plan to draw"):
        page_of(nothing, "x.json")


def test_plan_device_positions_cover_the_mesh_once():
    plan = planner.explain("llama3.1-8b", "1M", "tpu7x-128").best
    positions = plan.device_positions().reshape(-1, len(plan.mesh_sizes))
    flat = np.ravel_multi_index(positions.T, plan.mesh_sizes)
    assert sorted(flat) == list(range(math.prod(plan.mesh_sizes)))
    assert Plan.from_dict(plan.to_dict()).device_positions().tolist() == plan.device_positions().tolist()
