"""Faults lose nothing: SIGTERM or Ctrl-C mid-measurement keeps what was measured and writes the
report; outputs that cannot be written are refused before any work; no file is written through a
symlink. Each test asserts what is on disk afterwards."""

import json
import signal
import sys
from pathlib import Path

import pytest
from cli_process import cpplan, finish, wait_until

from cli import main

ROOT = Path(__file__).resolve().parents[2]
HEADER = "model,topology,seq_len,global_batch,strategy,context,step_seconds"


@pytest.mark.cpu_mesh
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_validation_keeps_what_was_measured(signum, tmp_path):
    out = tmp_path / "out"
    # more plans than can run before the signal lands, even on a loaded host
    proc = cpplan(
        "validate",
        "--model",
        "tiny",
        "--seq-lens",
        "1k,2k,4k",
        "--topology",
        "cpu:8",
        "--max-plans",
        "4",
        "--steps",
        "2",
        "--no-plots",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    journal = out / "measurements.jsonl"
    wait_until(lambda: journal.exists() and journal.read_text().count("\n") >= 1, proc, "a first measured plan")
    proc.send_signal(signum)
    stdout, stderr = finish(proc, "the stop after the signal")
    assert proc.returncode == 128 + signum, (proc.returncode, stderr[-3000:])
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("cpplan: interrupted after")
    kept = [json.loads(line) for line in journal.read_text().splitlines()]
    report = json.loads((out / "report.json").read_text())
    # the plan in hand when the signal landed (if one was) is abandoned after its step in hand, and
    # marked so, last
    abandoned = [k for k in kept if (k["failure"] or "").startswith("abandoned: interrupted after")]
    measured = [k for k in kept if k["failure"] is None]
    assert len(abandoned) <= 1 and kept[len(measured) :] == abandoned
    assert 1 <= len(measured) < 3 * 4 and report["summary"]["interrupted"]  # 3 lengths × 4 plans, not all run
    assert report["summary"]["plans_measured"] == len(measured)
    assert [p["measured_step_s"] for p in report["plans"]] == [p["measured_step_s"] for p in kept]
    assert "interrupted" in (out / "report.md").read_text()
    assert not list(out.glob(".*.tmp"))


@pytest.mark.cpu_mesh
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_preflight_compile_stops_cleanly_with_one_line(signum, tmp_path):
    """Interrupted while it compiles, before the first step: the compile in hand ends, then one line
    and 128 + the signal, no files. (Interrupted during the steps, a run saves a checkpoint:
    tests/runtime/test_resume.py.)"""
    proc = cpplan(
        "run",
        "--model",
        "tiny",
        "--seq-len",
        "1k",
        "--topology",
        "cpu:8",
        "--steps",
        "50",
        "--run-dir",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    # the run's lines up to the pre-flight's (or, if it ends first, its exit): jax is up, compiling starts
    lines_before = [proc.stdout.readline() for _ in range(2)]
    assert any("pre-flight compile" in line for line in lines_before), lines_before
    proc.send_signal(signum)
    stdout, stderr = finish(proc, "the stop after the signal")
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("cpplan: note:")]
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, stderr
    assert lines == [f"cpplan: stopped by {name} during the pre-flight compile; nothing was trained"], stderr
    assert list(tmp_path.iterdir()) == []


pure = pytest.mark.pure


def _measured_csv(tmp_path: Path) -> Path:
    path = tmp_path / "measured.csv"
    path.write_text(HEADER + "\ntiny,cpu:8,4k,1,ring,8,0.5\n")
    return path


@pure
@pytest.mark.parametrize(
    "command",
    [
        ["validate", "--model", "tiny", "--seq-lens", "1k", "--topology", "cpu:8"],
        ["validate-memory", "--model", "tiny", "--seq-lens", "1k", "--topologies", "v5p:2x2x2"],
        ["calibrate", "--topology", "cpu:8"],
    ],
)
@pytest.mark.parametrize("kind", ["a file", "under a file", "report names a directory"])
def test_unusable_outputs_are_refused_before_any_work(command, kind, tmp_path, capsys, monkeypatch):
    from cost_models.errors import CpplanError
    from validation import outputs

    blocker = tmp_path / "taken"
    blocker.write_text("keep me")
    if kind == "a file":
        out = blocker
    elif kind == "under a file":
        out = blocker / "out"
    else:
        out = tmp_path / "out"
        for name in ("report.json", "memory.json", "cpu.json"):
            (out / name).mkdir(parents=True)
    # each command proves its output directory usable before it sets up devices, measures or
    # compiles: the refusal must be that check's, so nothing after it ran
    refused, prepare = [], outputs.prepare_out_dir

    def recording(*args, **kwargs):
        try:
            return prepare(*args, **kwargs)
        except CpplanError as err:
            refused.append(str(err))
            raise

    monkeypatch.setattr(outputs, "prepare_out_dir", recording)
    assert main([*command, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(out.name) in err
    assert len(refused) == 1 and refused[0] in err  # refused by the output check, before measuring or compiling
    assert blocker.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out", "taken"] if kind.startswith("report") else ["taken"])


@pure
def test_reports_replace_symlinks_instead_of_following_them(tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").symlink_to(victim)
    (out / "report.md").symlink_to(victim)
    assert main(["validate", "--measured", str(_measured_csv(tmp_path)), "--no-plots", "--out", str(out)]) == 0
    assert victim.read_text() == "precious"
    assert not (out / "report.json").is_symlink()
    assert json.loads((out / "report.json").read_text())["summary"]["plans_measured"] == 1
    assert not list(out.glob(".*.tmp"))


@pure
def test_the_journal_is_never_appended_through_a_symlink(tmp_path):
    from cost_models.errors import CpplanError
    from validation.outputs import append_record

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "measurements.jsonl").symlink_to(victim)
    with pytest.raises(CpplanError, match="symlink"):
        append_record(tmp_path / "measurements.jsonl", {"step": 1.0})
    assert victim.read_text() == "precious"


@pure
def test_a_json_report_never_holds_nan(tmp_path, capsys):
    # one measured plan: Spearman and regret are undefined, and written as null, not NaN
    out = tmp_path / "out"
    assert main(["validate", "--measured", str(_measured_csv(tmp_path)), "--no-plots", "--out", str(out)]) == 0
    text = (out / "report.json").read_text()
    report = json.loads(text, parse_constant=lambda name: pytest.fail(f"report.json holds {name}"))
    assert report["spearman"] is None and "n/a" in (out / "report.md").read_text()


@pytest.mark.cpu_mesh
@pytest.mark.parametrize(
    "command",
    [
        ["validate", "--model", "tiny", "--seq-lens", "1k", "--topology", "v5p-8"],
        ["calibrate", "--topology", "v5p-8"],
        ["calibrate", "--topology", "cpu:16"],
    ],
)
def test_commands_refuse_devices_that_are_absent(command, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*command, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "devices" in err
    assert list(out.iterdir()) == []  # refused before anything was measured or written


@pytest.mark.cpu_mesh
def test_run_json_prints_json_alone(capsys, tmp_path):
    """No text around the JSON, so that a killed or piped run is still read by machines."""
    assert (
        main(
            [
                "run",
                "--model",
                "tiny",
                "--seq-len",
                "1k",
                "--topology",
                "cpu:8",
                "--steps",
                "2",
                "--json",
                "--run-dir",
                str(tmp_path / "run"),
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["seq_len"] == 1024 and data["measured"]["step_time_s"] > 0
    assert data["predicted"]["step_time_s"] > 0


@pure
def test_an_interrupt_inside_a_gc_callback_is_delivered_again_not_swallowed(monkeypatch):
    """jax registers a garbage-collection callback, and Python swallows (and prints) an exception a
    callback raises: an interrupt landing there is sent again for after the callback, not raised."""
    import gc

    from cli.signals import Interrupts

    interrupts, sent, seen = Interrupts(), [], {}
    monkeypatch.setattr(interrupts, "_deliver_again", sent.append)

    def callback(phase, info):
        if phase == "start" and "raised" not in seen:
            try:
                interrupts._handle(signal.SIGINT, sys._getframe())
                seen["raised"] = False
            except KeyboardInterrupt:
                seen["raised"] = True

    gc.callbacks.append(callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(callback)
    assert seen == {"raised": False} and sent == [signal.SIGINT] and interrupts.received == [signal.SIGINT]
    with pytest.raises(KeyboardInterrupt):  # anywhere else it raises at once
        interrupts._handle(signal.SIGTERM, sys._getframe())
    assert sent == [signal.SIGINT]
