"""`cpplan validate --engine maxtext`: the plans validate chooses, each trained by MaxText 0.2.5, recorded as
validate records its own runtime's.

One case runs MaxText itself (cpu_mesh, so the stage on MaxText's stack runs it: 2 plans of `tiny` on cpu:8,
3 steps each, about a minute and a half); it skips, saying so, without MaxText. The others give the engine
the stand-in for MaxText's Python of tests/cli/test_engine_maxtext.py (its trainer logs five steps; its first
run may end out of HBM) to check the records, a failed plan, the signal, and the refusals.
"""

import json
import os
import signal
import statistics
from pathlib import Path

import pytest
from cli_process import cpplan, finish, wait_until
from test_engine_maxtext import STEPS, _has_maxtext, fake_maxtext, refused

from cli import main
from cli.engine_maxtext import CONFIG_FILE, MAXTEXT_DIR, VENV_ENV, parse_step_line
from cost_models.flops import model_flops_per_step
from cost_models.models import get_model
from cost_models.topology import get_topology
from validation.report import MEASUREMENTS_FILE

VALIDATE = ["validate", "--engine", "maxtext", "--model", "tiny", "--seq-lens", "1k", "--topology", "cpu:8"]


def journal(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / MEASUREMENTS_FILE).read_text().splitlines()]


@pytest.mark.runtime_extra  # each plan's metrics.jsonl is written by runtime.metrics.StepLog (tensorboardX)
def test_a_plan_maxtext_finds_out_of_memory_is_recorded_and_the_next_is_measured(tmp_path, capsys):
    python = fake_maxtext(tmp_path, oom_first=True)
    out = tmp_path / "report"
    argv = [*VALIDATE, "--max-plans", "2", "--steps", "5", "--out", str(out), "--no-plots", "--json"]
    code = main([*argv, "--maxtext-python", python, "--maxtext-arg", "checkpoint_period=2"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    assert summary["summary"]["plans_measured"] == 1
    first, second = journal(out)
    assert first["failure"].startswith("out of memory: jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED")
    assert first["measured_step_s"] is None and first["steps"] == 0
    # the steps after the first: 0.2, 0.25, 0.3, 0.4 s; their median is the measurement (MaxText's host loop
    # runs ahead, so its fastest logged step understates a step)
    median = statistics.median([0.2, 0.25, 0.3, 0.4])
    assert second["failure"] is None and second["step_times_s"] == [s for s, _ in STEPS]
    assert second["measured_step_s"] == second["measured_median_s"] == median == 0.275
    flops = model_flops_per_step(get_model("tiny"), 1024, 1)
    assert second["measured_mfu"] == pytest.approx(flops / (median * 8 * get_topology("cpu:8").peak_flops_per_device))
    assert second["error"] == pytest.approx(second["predicted_step_s"] / median - 1)
    assert (
        second["compile_s"] is None
        and second["engine"] == "maxtext"
        and second["losses"] == [loss for _, loss in STEPS]
    )
    # plans priced as MaxText runs them on a host: all-gather, each in a directory of its own
    assert first["strategy"] == second["strategy"] == "all_gather" and first["plan"] != second["plan"]
    config = (out / MAXTEXT_DIR / "plan-02" / CONFIG_FILE).read_text()
    assert "enable_checkpointing: false\n" in config and "steps: 5\n" in config
    assert (Path(python).parent / "train.argv").read_text().endswith(f"{CONFIG_FILE} checkpoint_period=2")
    metrics = (out / MAXTEXT_DIR / "plan-02" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in metrics] == [1, 2, 3, 4, 5]
    # the per-plan lines, and the report's
    assert "plan 1/2 all_gather" in captured.err and "out of memory" in captured.err
    assert "plan 2/2 all_gather" in captured.err and "steps 5 in 1.65 s (best 0.2 s)" in captured.err
    report = json.loads((out / "report.json").read_text())
    assert report["title"] == "Step-time validation on MaxText 0.2.5: tiny on cpu:8"
    assert [p["measured_step_s"] for p in report["plans"]] == [None, median]


@pytest.mark.runtime_extra
def test_sigterm_stops_maxtext_and_the_plan_in_hand_is_abandoned(tmp_path):
    python = fake_maxtext(tmp_path, hold=True)
    out = tmp_path / "report"
    proc = cpplan(
        *VALIDATE, "--max-plans", "2", "--steps", "100", "--out", str(out), "--no-plots", "--maxtext-python", python,
        cwd=tmp_path,
    )  # fmt: skip
    metrics = out / MAXTEXT_DIR / "plan-01" / "metrics.jsonl"
    wait_until(lambda: metrics.exists() and len(metrics.read_text().splitlines()) == len(STEPS), proc, "5 records")
    proc.send_signal(signal.SIGTERM)
    _, err = finish(proc, "cpplan's exit after SIGTERM")
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert (Path(python).parent / "got").read_text() == "SIGTERM"  # MaxText was told, and cpplan waited for it
    (only,) = journal(out)  # the second plan never started
    assert only["failure"] == "abandoned: interrupted after 5 of 100 steps" and only["measured_step_s"] is None
    assert json.loads((out / "report.json").read_text())["summary"]["interrupted"] is True
    assert "interrupted after 0 measured plans" in err
    assert not (out / MAXTEXT_DIR / "plan-02").exists()


@pytest.mark.pure
def test_flags_that_mean_nothing_to_maxtext_are_refused_by_name(tmp_path, capsys):
    line = refused([*VALIDATE, "--both-backwards"], capsys)
    assert "--both-backwards with --engine maxtext on cpu:8" in line and "dot_product" in line
    line = refused([*VALIDATE, "--blocks", "256"], capsys)
    assert "--blocks with --engine maxtext" in line and "TPU slice" in line
    line = refused([*VALIDATE, "--data", "corpus.txt"], capsys)
    assert "--data with --engine maxtext" in line and "grain_train_files=PATTERN" in line
    line = refused([*VALIDATE, "--compile-ahead", "on"], capsys)
    assert "--compile-ahead on with --engine maxtext" in line and "drop --compile-ahead" in line
    line = refused(["validate", "--engine", "maxtext", "--measured", str(tmp_path / "runs.csv")], capsys)
    assert "--measured with --engine maxtext" in line and "drop --engine maxtext" in line
    line = refused([*VALIDATE, "--maxtext-flags", "steps=5"], capsys)
    assert "--maxtext-flags with --engine maxtext" in line and "--maxtext-arg" in line
    python = fake_maxtext(tmp_path)
    line = refused([*VALIDATE, "--maxtext-python", python, "--maxtext-arg", "ici_context_parallelism=2"], capsys)
    assert "ici_context_parallelism is the plan's" in line
    line = refused(
        ["validate", "--engine", "maxtext", "--model", "tiny", "--seq-lens", "1k", "--topology", "v5e:2x2"], capsys
    )
    assert "this host has no TPU" in line and "--dry-run" not in line


@pytest.mark.cpu_mesh
@pytest.mark.skipif(
    not (_has_maxtext() or os.environ.get(VENV_ENV)),
    reason=f"MaxText 0.2.5 is installed neither in this Python nor in a venv named by {VENV_ENV} "
    "(pip install 'maxtext[tpu]==0.2.5' on Python 3.12)",
)
def test_maxtext_validates_two_plans_of_tiny_on_cpu_8(tmp_path, capsys, monkeypatch):
    """MaxText 0.2.5 itself: two plans, 3 steps each, their logged step times in the report and the journal."""
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", os.environ.get("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax")))
    out = tmp_path / "report"
    code = main([*VALIDATE, "--max-plans", "2", "--steps", "3", "--out", str(out), "--no-plots", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["summary"]["plans_measured"] == 2
    records = journal(out)
    assert len(records) == 2 and records[0]["plan"] != records[1]["plan"]
    for number, record in enumerate(records, start=1):
        log = (out / MAXTEXT_DIR / f"plan-{number:02d}" / "train.log").read_text().splitlines()
        logged = [step.seconds for step in map(parse_step_line, log) if step is not None]
        assert record["failure"] is None and record["step_times_s"] == logged and len(logged) == 3
        # the median of the logged steps after the first is the measurement (MaxText's host loop runs ahead)
        assert record["measured_step_s"] == record["measured_median_s"] == statistics.median(logged[1:])
        assert 0 < record["measured_mfu"] < 1 and record["predicted_step_s"] > 0
    report = json.loads((out / "report.json").read_text())
    assert [p["measured_step_s"] for p in report["plans"]] == [r["measured_step_s"] for r in records]
