"""The measuring commands on real chips, checked without one: `validate` starts jax with the compiler
flags its plans need, records a plan that fails to compile or runs out of memory and measures the
next, and `calibrate` on one device fits no links."""

import json
import os

import numpy as np
import pytest

from cost_models.errors import CpplanError
from cost_models.topology import get_topology
from validation.steptime import failure_reason

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "tpu_v5e")
VMEM_FLAG = "--xla_tpu_scoped_vmem_limit_kib=98304"


@pytest.mark.pure
def test_a_failed_plan_says_what_failed_in_one_line():
    vmem = RuntimeError(
        "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: Ran out of memory in memory space vmem. "
        "Scoped allocation with size 22.99M and limit 16.00M exceeded scoped vmem limit by 6.99M.\n\nmore"
    )
    assert failure_reason(vmem) == (
        "does not compile: splash's scoped VMEM exceeds the compiler's limit: RESOURCE_EXHAUSTED: E1001: "
        "CompileTimeScopedVmemOom: Ran out of memory in memory space vmem. Scoped allocation with size 22.99M "
        "and limit 16.00M exceeded scoped vmem limit by 6.99M."
    )
    hbm = RuntimeError("RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 4.50G.")
    assert failure_reason(hbm) == f"out of memory: {hbm}"
    assert failure_reason(CpplanError("bad blocks.")) == "bad blocks."
    other = failure_reason(ValueError("x" * 1000 + "\nsecond line"))
    assert other.startswith("failed (ValueError): xxx") and other.endswith("…") and len(other) < 450


@pytest.mark.runtime_extra
def test_validate_starts_jax_with_the_scoped_vmem_its_plans_need(monkeypatch, tmp_path, capsys):
    """At 32K the v5e plans run splash blocks of 2048, over the compiler's default scoped VMEM: the
    flag `cpplan run` sets is in LIBTPU_INIT_ARGS when jax's backend starts; at 8K it is not."""
    jax = pytest.importorskip("jax")
    from cli import main

    class Device:
        platform = "cpu"  # not the chip: the device check refuses, after the backend started

    started = []
    monkeypatch.setattr(jax, "devices", lambda: started.append(os.environ.get("LIBTPU_INIT_ARGS", "")) or [Device()])
    model = os.path.join(CONFIGS, "llama-4l-h128.json")
    for length, flagged in (("32k", True), ("8k", False)):
        monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_jf_dump_to=/nowhere")
        argv = ["validate", "--model", model, "--seq-lens", length, "--topology", "v5e:1x1"]
        assert main([*argv, "--compute-dtype", "bfloat16", "--out", str(tmp_path / length)]) == 2
        assert "needs 1 tpu devices, this process has 1 cpu" in capsys.readouterr().err
        args = started[-1].split()
        assert args[0] == "--xla_jf_dump_to=/nowhere" and (VMEM_FLAG in args) == flagged


@pytest.mark.runtime_extra
def test_a_plan_that_fails_on_the_chip_is_recorded_and_the_next_is_measured(monkeypatch, tmp_path):
    """The first plan's compile runs out of scoped VMEM (the error jax raises), the second is measured:
    both are in the journal as they happen and in the report, the failure with its reason."""
    import runtime
    from runtime.runner import RunReport
    from validation.outputs import write_atomic
    from validation.steptime import choose_plans, validate_step_times

    chosen = choose_plans(
        os.path.join(CONFIGS, "llama-4l-h128.json"), [8192], "v5e:1x1", max_plans=2, top=2, compute_dtype="bfloat16"
    )
    assert len(chosen) == 2

    def run(plan, **_):
        if plan == chosen[0].plan:
            raise RuntimeError("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: Scoped allocation ...")
        return RunReport(plan, 1.0, (0.5, 0.2, 0.25), (5.0, 4.9, 4.8), 1e12)

    monkeypatch.setattr(runtime, "run", run)
    journal = write_atomic(tmp_path / "measurements.jsonl", "")
    report = validate_step_times(None, [], "v5e:1x1", steps=3, journal=journal, plans=chosen)
    failed, measured = report.results
    assert failed.failure.startswith("does not compile: splash's scoped VMEM") and failed.measured_step_s is None
    assert measured.failure is None and measured.measured_step_s == 0.2
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [line["failure"] for line in lines] == [failed.failure, None]
    files = report.write(tmp_path / "report", plots=False)
    text = (tmp_path / "report" / "report.md").read_text()
    assert files and "failed: 1" in text and "does not compile: splash's scoped VMEM" in text


@pytest.mark.runtime_extra
def test_calibrate_on_one_device_times_no_links_and_keeps_the_cited_ones(monkeypatch):
    """One chip (v5e:1x1) or one host device (cpu:1) has no links: no collective is timed, the row keeps
    the cited link figures, each source saying it was not measured; the rest is measured."""
    from runtime import measure
    from validation.calibration import calibrate

    class Mesh:
        devices = np.zeros(1)

    timed = []
    monkeypatch.setattr(measure, "device_mesh", lambda topo: Mesh())
    monkeypatch.setattr(measure, "measure_matmul", lambda *a, **k: 1.5e14)
    monkeypatch.setattr(measure, "measure_memory", lambda *a, **k: 7.5e11)
    monkeypatch.setattr(
        measure, "time_attention", lambda mesh, topo, dtype, shapes, **k: [1e-3 * (i + 1) for i in range(len(shapes))]
    )
    monkeypatch.setattr(measure, "measure_collectives", lambda *a, **k: timed.append(a) or {})
    for name in ("v5e:1x1", "cpu:1"):
        cited = get_topology(name).chip
        result = calibrate(name, repeats=1)
        row = result.chip
        field = "ici_link_bw_bytes_per_s" if cited.kind.name == "TPU" else "core_link_bw_bytes_per_s"
        assert getattr(row, field) == getattr(cited, field) and row.ici_hop_latency_s == cited.ici_hop_latency_s
        for source in (row.sources[field], row.sources["ici_hop_latency_s"]):
            assert source.startswith(f"not measured: `cpplan calibrate --topology {name}` had one device")
        assert row.hbm_bw_bytes_per_s == 7.5e11 and "measured by" in row.sources["hbm_bw_bytes_per_s"]
        assert result.raw["links_measured"] is False and result.raw["collectives"] == {}
    assert timed == []
