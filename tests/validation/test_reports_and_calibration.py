"""Validation pieces: the summary statistics, imported measurements, reports, the calibration fits."""

import json

import numpy as np
import pytest

from cost_models import collectives
from cost_models.errors import CpplanError
from cost_models.topology import get_topology
from validation.calibration import (
    ATTENTION_SHAPES,
    COLLECTIVE_SIZES,
    fit_attention,
    fit_host_collectives,
    fit_links,
    splash_terms,
)
from validation.measured import MeasuredStep, read_csv, read_maxtext_log
from validation.stats import mape, regret, spearman
from validation.steptime import compare_measured


@pytest.mark.pure
def test_statistics_by_hand():
    assert mape([1.1, 0.9, 2.0], [1.0, 1.0, 2.0]) == pytest.approx((0.1 + 0.1 + 0.0) / 3)
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # one swapped pair of four: 1 − 6·Σd²/(n(n²−1)) = 1 − 6·2/60 = 0.8
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # ties share their average rank: ranks (1.5, 1.5, 3) against (1, 2, 3) correlate at √3/2
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(np.sqrt(3) / 2)
    assert np.isnan(spearman([1.0], [2.0])) and np.isnan(spearman([1, 1], [1, 2]))
    # the plan predicted fastest (index 1) measured 1.2 s; the best measured 1.0 s
    assert regret([3.0, 1.0, 2.0], [1.0, 1.2, 1.5]) == pytest.approx(1.2)


CSV = """model,topology,seq_len,global_batch,strategy,context,context_ulysses,tensor,fsdp,remat,load_balance,step_seconds
llama3.1-8b,v5p-16,131072,1,ring,8,1,1,1,full,zigzag,9.5
llama3.1-8b,v5p-16,131072,1,ulysses,1,8,1,1,full,none,10.0
"""


@pytest.mark.pure
def test_measured_csv_compared_with_predictions(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text(CSV)
    steps = read_csv(path)
    assert [s.plan.cp_strategy.value for s in steps] == ["ring", "ulysses"]
    report = compare_measured(steps)
    data = report.to_dict()
    assert set(data) >= {"mape", "spearman", "regret", "plans"} and len(data["plans"]) == 2
    predicted = [r.predicted.step_time_s for r in report.results]
    assert data["mape"] == pytest.approx(mape(predicted, [9.5, 10.0]))
    first = report.results[0]  # measured MFU: the same row's peak the prediction used, at the measured time
    assert first.measured_mfu == pytest.approx(first.predicted.mfu * first.predicted.step_time_s / 9.5)
    files = report.write(tmp_path / "out", plots=False)
    assert json.loads((tmp_path / "out" / "report.json").read_text())["plans"][0]["measured_step_s"] == 9.5
    assert all(f.exists() and f.stat().st_size > 0 for f in files) and len(files) == 2
    assert ".png" not in (tmp_path / "out" / "report.md").read_text()
    path.write_text("model,seq_len\nx,1\n")
    with pytest.raises(CpplanError, match="needs a header"):
        read_csv(path)


def test_report_plots(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "steps.csv"
    path.write_text(CSV)
    files = compare_measured(read_csv(path)).write(tmp_path / "out")
    assert {f.name for f in files} == {"report.json", "report.md", "predicted_vs_measured.png", "winners.png"}
    assert all(f.stat().st_size > 0 for f in files)
    assert "predicted_vs_measured.png" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.pure
def test_regret_is_the_predicted_best_plans_measured_time_over_the_best(tmp_path):
    """Two lengths, three plans each: at 128K the plan predicted fastest ran 1.2× the fastest
    measured; at 256K it ran fastest. The report's regret is the worse length's."""
    header, *rows = CSV.splitlines()
    rows.append("llama3.1-8b,v5p-16,131072,1,usp,4,2,1,1,full,zigzag,1")
    path = tmp_path / "steps.csv"
    path.write_text("\n".join([header, *rows, *(r.replace(",131072,", ",262144,") for r in rows)]) + "\n")
    steps = []
    for seq_len, ratio in ((131072, 1.2), (262144, 1.0)):
        results = sorted(
            (r for r in compare_measured(read_csv(path)).results if r.plan.seq_len == seq_len),
            key=lambda r: r.predicted.step_time_s,
        )
        assert len(results) == 3
        slowest = max(r.predicted.step_time_s for r in results)  # times a chip can reach
        steps += [MeasuredStep(r.plan, t * slowest, "test") for r, t in zip(results, (ratio, 1.0, 1.5))]
    summary = compare_measured(steps).summary()
    assert summary["regret_per_seq_len"] == {131072: pytest.approx(1.2), 262144: pytest.approx(1.0)}
    assert summary["regret"] == pytest.approx(1.2)


@pytest.mark.pure
def test_validate_measured_from_the_command_line(tmp_path, capsys):
    from cli import main

    path = tmp_path / "steps.csv"
    path.write_text(CSV)
    assert main(["validate", "--measured", str(path), "--out", str(tmp_path / "report"), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "step-time MAPE" in out and (tmp_path / "report" / "report.md").exists()
    assert main(["validate", "--measured", str(path), "--out", str(tmp_path / "again"), "--no-plots", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mape"] >= 0
    assert not list((tmp_path / "report").glob("*.png"))


@pytest.mark.pure
def test_maxtext_log(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "completed step: 0, seconds: 95.1, TFLOP/s/device: 10.0, loss: 11.0\n"
        "completed step: 1, seconds: 9.0, TFLOP/s/device: 200.0, loss: 10.5\n"
        "noise\ncompleted step: 2, seconds: 9.4, TFLOP/s/device: 190.0, loss: 10.1\n"
        "completed step: 3, seconds: 9.2, TFLOP/s/device: 195.0, loss: 9.9\n"
    )
    flags = (
        "compile_topology=v5p-16 model_name=llama3.1-8b max_target_length=131072 per_device_batch_size=0.125 "
        "ici_fsdp_parallelism=1 ici_context_parallelism=8 context_parallel_strategy=ring"
    )
    step = read_maxtext_log(log, flags)
    assert step.step_seconds == 9.2  # median of steps 1..3; step 0 includes compilation
    assert step.plan.cp_strategy.value == "ring" and step.plan.axis_size("context") == 8
    log.write_text("nothing here\n")
    with pytest.raises(CpplanError, match="completed step"):
        read_maxtext_log(log, flags)


@pytest.mark.pure
def test_link_fit_recovers_the_models_own_figures():
    topo = get_topology("cpu:8")
    link, hop = 3e9, 5e-5
    coll_bw, coll_lat = 2 * link, 8 / 2 * hop  # cpu:8 is one wrapped dimension of 8
    points = {
        "all_gather": [(b, float(collectives.all_gather(8 * b, 8, coll_bw, coll_lat))) for b in COLLECTIVE_SIZES],
        "reduce_scatter": [(b, float(collectives.reduce_scatter(b, 8, coll_bw, coll_lat))) for b in COLLECTIVE_SIZES],
        "all_to_all": [(b, float(collectives.all_to_all(b, 8, coll_bw, coll_lat))) for b in COLLECTIVE_SIZES],
        "ppermute": [(b, float(collectives.ppermute(b, link, hop))) for b in COLLECTIVE_SIZES],
    }
    fitted_link, fitted_hop, errors = fit_links(topo, points)
    assert fitted_link == pytest.approx(link, rel=1e-6) and fitted_hop == pytest.approx(hop, rel=1e-6)
    assert max(errors.values()) < 1e-6


@pytest.mark.pure
def test_host_collective_fit_recovers_each_kinds_rate():
    # four kinds at four different (bytes/s, latency), timed as the host formulas say; 8 devices
    truth = {
        "all_gather": (1.5e9, 2.5e-4),
        "reduce_scatter": (2e9, 2e-4),
        "all_to_all": (5e8, 3e-4),
        "ppermute": (2.1e9, 2e-4),
    }
    times = {
        "all_gather": lambda b, bw, lat: 8 * b * 7 / 8 / bw + lat,  # gathers 8·b, copies in 7/8 of it
        "reduce_scatter": lambda b, bw, lat: b * 7 / 8 / bw + lat,
        "all_to_all": lambda b, bw, lat: b * 7 / 8 / bw + lat,  # keeps 1/8 of its array, copies in the rest
        "ppermute": lambda b, bw, lat: b / bw + lat,
    }
    points = {k: [(b, times[k](b, *truth[k])) for b in COLLECTIVE_SIZES] for k in truth}
    fitted, errors = fit_host_collectives(points, 8)
    for kind, (bw, lat) in truth.items():
        assert fitted[kind] == pytest.approx([bw, lat], rel=1e-6)
    assert max(errors.values()) < 1e-6


HEADS = dict(heads=8, kv_heads=4, head_dim=32, act_bytes=4)


def _shapes(seq: int) -> list[tuple]:
    return [(seq // q, seq // kv, seq // b, causal) for q, kv, b, causal in ATTENTION_SHAPES]


@pytest.mark.pure
def test_attention_fit_recovers_known_costs():
    """Times made from four known costs: the fit finds them again, and a cost the times do not
    show stays at 0 rather than going negative."""
    shapes = _shapes(1024)
    terms = [splash_terms(*s, **HEADS) for s in shapes]
    truth = np.array([2e-10, 3e-5, 4e-12, 5e-9])
    fit = fit_attention(shapes, terms, np.array(terms) @ truth)
    assert [fit.per_flop_s, fit.per_step_s, fit.per_step_byte_s, fit.per_masked_element_s] == pytest.approx(
        truth, rel=1e-6
    )
    assert fit.mean_error < 1e-9 and len(fit.shapes) == len(ATTENTION_SHAPES)
    no_masking = truth * [1, 1, 1, 0]
    # the masked-logit cost pulled below zero by noise is clamped at 0
    noisy = np.array(terms) @ no_masking * np.array([1, 1, 1, 1, 1, 0.97, 0.97])
    assert fit_attention(shapes, terms, noisy).per_masked_element_s == 0.0


@pytest.mark.pure
def test_a_measured_row_that_breaks_a_chip_rule_is_refused_before_it_is_written():
    """A disturbed timing (the matmul slowed by other work, so the attention fit runs at 2.5x the
    matmul 'peak'; a host collective timed at no time) is refused with the rule it breaks and what
    to do, not written as a row `load_chip` would then refuse."""
    from cost_models.chips import Chip, ChipRuleError
    from validation.calibration import _measured_row

    chip = get_topology("cpu:8").chip
    assert _measured_row(chip, {}, "cpu:8") == chip  # the cited row passes, unchanged
    assert _measured_row(chip, {"attention_efficiency": 1.5}, "cpu:8").attention_efficiency == 1.5
    with pytest.raises(CpplanError) as refused:
        _measured_row(chip, {"attention_efficiency": 2.5}, "cpu:8")
    message = str(refused.value)
    assert message.startswith(
        "the row measured on cpu:8: attention_efficiency=2.5 must be > 0 and ≤ 2 (a fraction "
        "of the matmul peak). The measured figures disagree"
    )
    assert "nothing was written" in message and message.endswith("on an idle machine, with more --repeats.")
    assert "fix the row" not in message  # the advice for a hand-written row is not this one
    with pytest.raises(
        CpplanError,
        match=r"^the row measured on cpu:8: host_collectives\['all_gather'\] bandwidth="
        r"inf must be finite \(a bandwidth\)\. The measured figures disagree",
    ):
        _measured_row(chip, {"host_collectives": {"all_gather": [float("inf"), 1e-6]}}, "cpu:8")
    # the same figure in a chip file: the same rule, with the advice for a file
    with pytest.raises(ChipRuleError) as in_file:
        Chip.from_dict({**chip.to_dict(), "attention_efficiency": 2.5}, origin="mycpu.json")
    assert in_file.value.rule == "attention_efficiency=2.5 must be > 0 and ≤ 2 (a fraction of the matmul peak)"
    assert str(in_file.value) == f"mycpu.json: {in_file.value.rule}; fix the row."


@pytest.mark.runtime_extra
def test_short_calls_are_timed_in_batches_until_the_minimum_span_is_covered(monkeypatch):
    """Each call advances a fake clock by its fixed time. A 3 ms call is dispatched 7 at a time (the
    first 7 × 3 ms to cover 20 ms) and its batches repeated until 0.2 s is covered: 10 batches of 21 ms;
    a 0.5 s call once a timing, exactly the 3 repeats asked for; not back to back (a host's devices), the
    3 ms call one at a time until 0.2 s is covered: 67 calls. Each gives its own time per call."""
    from runtime import measure

    def timed_calls(call_s, repeats, back_to_back=True):
        clock, calls = [0.0], []

        def call():
            calls.append(1)
            clock[0] += call_s
            return 0.0

        monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])
        fastest = measure.best_time(call, repeats=repeats, back_to_back=back_to_back)
        return len(calls) - 2, fastest  # less the warm-up and the lone call that sizes the batch

    assert (measure.MIN_TIMED_S, measure.BATCH_S) == (0.2, 0.02)
    assert timed_calls(0.003, 1) == (70, pytest.approx(0.003))
    assert timed_calls(0.5, 3) == (3, pytest.approx(0.5))
    assert timed_calls(0.003, 1, back_to_back=False) == (67, pytest.approx(0.003))  # one call a timing


def _mean_relative_error(predicted, measured) -> float:
    return float(np.mean(np.abs(np.asarray(predicted) / np.asarray(measured) - 1)))


@pytest.mark.cpu_mesh
def test_calibrate_and_validate_on_virtual_devices(tmp_path, monkeypatch):
    """A measured row loads like a cited one, its attention figures reproduce the measured
    kernel times with the error it records, and a validation run measures real steps."""
    from cost_models.chips import CHIP_DIR_ENV, load_chip
    from cost_models.units import mfu
    from validation.calibration import calibrate
    from validation.steptime import validate_step_times

    heads = dict(heads=2, kv_heads=1, head_dim=16, act_bytes=4)
    result = calibrate(
        "cpu:8",
        repeats=1,
        matmul_size=256,
        attention_seq=1024,
        attention_heads=2,
        attention_kv_heads=1,
        attention_head_dim=16,
    )
    path = result.write(tmp_path / "chips")
    row = load_chip(path)
    topo = get_topology("cpu:8")
    assert row.peak_bf16_flops_per_s > 1e8 and row.hbm_bw_bytes_per_s > 1e8
    assert "measured by `cpplan calibrate" in row.sources["peak_bf16_flops_per_s"]

    # the row's four attention figures, back in seconds per unit, predict each timed kernel
    per_flop_s = topo.num_devices / (row.attention_efficiency * row.peak_bf16_flops_per_s * topo.num_chips)
    coef = [
        per_flop_s,
        row.attention_block_overhead_s,
        row.attention_step_s_per_operand_byte,
        row.attention_masked_element_s,
    ]
    runs = result.raw["attention_fit"]["shapes"]
    terms = np.array([splash_terms(q, kv, block, causal, **heads) for q, kv, block, causal, _, _ in runs])
    measured = np.array([t for *_, t, _ in runs])
    predicted = terms @ coef
    assert predicted == pytest.approx([fit for *_, fit in runs], rel=1e-6)
    recorded = result.raw["attention_fit_mean_error"]
    assert _mean_relative_error(predicted, measured) == pytest.approx(recorded, rel=1e-6)
    assert f"mean error {recorded:.1%}" in row.sources["attention_efficiency"]
    # non-negative least squares: no worse (in squared relative error) than FLOPs alone
    flops_only = terms[:, 0] / measured
    best_flops_only = np.sum((flops_only * flops_only.sum() / (flops_only**2).sum() - 1) ** 2)
    assert np.sum((predicted / measured - 1) ** 2) <= best_flops_only + 1e-12

    monkeypatch.setenv(CHIP_DIR_ENV, str(tmp_path / "chips"))
    report = validate_step_times(
        "tiny", [1024], "cpu:8", max_plans=1, top=1, steps=3, strategies=["ring"], compute_dtype="float32"
    )
    (only,) = report.measured
    assert only.plan.cp_strategy.value == "ring" and 0 < only.measured_step_s <= only.measured_median_s
    e = only.predicted
    assert only.measured_mfu == pytest.approx(
        mfu(e.model_flops, only.measured_step_s, topo.num_devices, row.peak_bf16_flops_per_s / topo.devices_per_chip)
    )


@pytest.mark.pure
def test_a_measurement_faster_than_the_chip_allows_is_flagged_not_averaged(tmp_path, capsys):
    """8 × 128K tokens of Llama 3.1 8B on v5p-16 in 3.2 s would be an MFU far above 100%: a wrong
    figure, left out of the statistics with a warning."""
    from cli import main

    header = "model,topology,seq_len,global_batch,strategy,context,step_seconds"
    path = tmp_path / "steps.csv"
    path.write_text(f"{header}\nllama3.1-8b,v5p-16,128k,8,ring,8,3.2\nllama3.1-8b,v5p-16,128k,8,ring,8,168\n")
    assert main(["validate", "--measured", str(path), "--out", str(tmp_path / "report"), "--no-plots"]) == 0
    captured = capsys.readouterr()
    assert "faster than the chip's peak allows" in captured.err and "left out         1" in captured.out
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["summary"]["plans_measured"] == 1 and report["summary"]["plans_impossible"] == 1
