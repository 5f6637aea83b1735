"""Validation pieces: the summary statistics, imported measurements, reports, the link fit."""
import json

import pytest

from cost_models import collectives
from cost_models.errors import CpplanError
from cost_models.topology import get_topology
from runtime.validation.measured import read_csv, read_maxtext_log
from runtime.validation.stats import mape, regret, spearman
from runtime.validation.steptime import compare_measured

pytestmark = pytest.mark.pure


def test_statistics_by_hand():
    assert mape([1.1, 0.9, 2.0], [1.0, 1.0, 2.0]) == pytest.approx((0.1 + 0.1 + 0.0) / 3)
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # one swapped pair of four: 1 − 6·Σd²/(n(n²−1)) = 1 − 6·2/60 = 0.8
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # the plan predicted fastest (index 1) measured 1.2 s; the best measured 1.0 s
    assert regret([3.0, 1.0, 2.0], [1.0, 1.2, 1.5]) == pytest.approx(1.2)


CSV = """model,topology,seq_len,global_batch,strategy,context,context_ulysses,tensor,fsdp,remat,load_balance,step_seconds
llama3.1-8b,v5p-16,131072,1,ring,8,1,1,1,full,zigzag,9.5
llama3.1-8b,v5p-16,131072,1,ulysses,1,8,1,1,full,none,10.0
"""


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
    files = report.write(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "report.json").read_text())["plans"][0]["measured_step_s"] == 9.5
    assert all(f.exists() and f.stat().st_size > 0 for f in files)
    assert (tmp_path / "out" / "predicted_vs_measured.png").exists()
    path.write_text("model,seq_len\nx,1\n")
    with pytest.raises(CpplanError, match="needs a header"):
        read_csv(path)


def test_maxtext_log(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("completed step: 0, seconds: 95.1, TFLOP/s/device: 10.0, loss: 11.0\n"
                   "completed step: 1, seconds: 9.0, TFLOP/s/device: 200.0, loss: 10.5\n"
                   "noise\ncompleted step: 2, seconds: 9.4, TFLOP/s/device: 190.0, loss: 10.1\n"
                   "completed step: 3, seconds: 9.2, TFLOP/s/device: 195.0, loss: 9.9\n")
    flags = ("compile_topology=v5p-16 model_name=llama3.1-8b max_target_length=131072 per_device_batch_size=0.125 "
             "ici_fsdp_parallelism=1 ici_context_parallelism=8 context_parallel_strategy=ring")
    step = read_maxtext_log(log, flags)
    assert step.step_seconds == 9.2  # median of steps 1..3; step 0 includes compilation
    assert step.plan.cp_strategy.value == "ring" and step.plan.axis_size("context") == 8
    log.write_text("nothing here\n")
    with pytest.raises(CpplanError, match="completed step"):
        read_maxtext_log(log, flags)


def test_link_fit_recovers_the_models_own_figures():
    from runtime.calibrate import COLLECTIVE_SIZES, _fit_links

    topo = get_topology("cpu:8")
    link, hop = 3e9, 5e-5
    coll_bw, coll_lat = 2 * link, 8 / 2 * hop  # cpu:8 is one wrapped dimension of 8
    points = {
        "all_gather": [(b, float(collectives.all_gather(8 * b, 8, coll_bw, coll_lat))) for b in COLLECTIVE_SIZES],
        "reduce_scatter": [(b, float(collectives.reduce_scatter(b, 8, coll_bw, coll_lat))) for b in COLLECTIVE_SIZES],
        "all_to_all": [(b, float(collectives.all_to_all(b, 8, coll_bw, coll_lat))) for b in COLLECTIVE_SIZES],
        "ppermute": [(b, float(collectives.ppermute(b, link, hop))) for b in COLLECTIVE_SIZES],
    }
    fitted_link, fitted_hop, errors = _fit_links(topo, points)
    assert fitted_link == pytest.approx(link, rel=1e-6) and fitted_hop == pytest.approx(hop, rel=1e-6)
    assert max(errors.values()) < 1e-6


def test_host_collective_fit_recovers_each_kinds_rate():
    from runtime.calibrate import COLLECTIVE_SIZES, fit_host_collectives

    # four kinds at four different (bytes/s, latency), timed as the host formulas say; 8 devices
    truth = {"all_gather": (1.5e9, 2.5e-4), "reduce_scatter": (2e9, 2e-4), "all_to_all": (5e8, 3e-4),
             "ppermute": (2.1e9, 2e-4)}
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


def test_validate_measured_from_the_command_line(tmp_path, capsys):
    from planner.cli import main

    path = tmp_path / "steps.csv"
    path.write_text(CSV)
    assert main(["validate", "--measured", str(path), "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert '"mape"' in out and (tmp_path / "report" / "report.md").exists()


@pytest.mark.cpu_mesh
def test_calibrate_and_validate_on_virtual_devices(tmp_path, monkeypatch):
    """A measured row loads like a cited one, and a validation run measures real steps."""
    from cost_models.chips import CHIP_DIR_ENV, load_chip
    from runtime.calibrate import calibrate
    from runtime.validation.steptime import validate_step_times

    result = calibrate("cpu:8", repeats=1, matmul_size=256, attention_seq=1024, attention_heads=2,
                       attention_kv_heads=1, attention_head_dim=16)
    path = result.write(tmp_path / "chips")
    row = load_chip(path)
    assert row.peak_bf16_flops_per_s > 1e8 and row.hbm_bw_bytes_per_s > 1e8
    assert 0 < row.attention_efficiency < 1e3 and 0 <= row.attention_block_overhead_s < 1.0
    assert 0 <= row.attention_step_s_per_operand_byte < 1e-6
    assert "measured by `cpplan calibrate" in row.sources["peak_bf16_flops_per_s"]
    monkeypatch.setenv(CHIP_DIR_ENV, str(tmp_path / "chips"))
    report = validate_step_times("tiny", [1024], "cpu:8", max_plans=1, top=1, steps=2, strategies=["ring"],
                                 compute_dtype="float32")
    (only,) = report.measured
    assert only.plan.cp_strategy.value == "ring" and only.measured_step_s > 0
    assert report.summary()["regret"] == 1.0
