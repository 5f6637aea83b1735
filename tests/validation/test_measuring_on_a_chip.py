"""The measuring commands on real chips, checked without one: `validate` starts jax with the chip's
compiler flags and each plan asks for the scoped VMEM its blocks need in its own compiles, records a
plan that fails to compile or runs out of memory and measures the next, and `calibrate` on one device
fits no links."""

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
def test_validate_starts_jax_without_a_raised_scoped_vmem_and_each_plan_asks_for_its_own(monkeypatch, tmp_path, capsys):
    """At 32K the v5e plans run splash blocks of 2048, over the compiler's default scoped VMEM: each asks
    for the chip's most in its own compiles (`plan_compiler_options`); at 8K none does. LIBTPU_INIT_ARGS,
    when jax's backend starts, holds the user's flags and the chip's, never the raised limit, which
    would slow every other plan's compile."""
    jax = pytest.importorskip("jax")
    from cli import main
    from runtime.compile import plan_compiler_options
    from validation.steptime import choose_plans

    class Device:
        platform = "cpu"  # not the chip: the device check refuses, after the backend started

    started = []
    monkeypatch.setattr(jax, "devices", lambda: started.append(os.environ.get("LIBTPU_INIT_ARGS", "")) or [Device()])
    model = os.path.join(CONFIGS, "llama-4l-h128.json")
    for length, tokens, flagged in (("32k", 32768, True), ("8k", 8192, False)):
        monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_jf_dump_to=/nowhere")
        argv = ["validate", "--model", model, "--seq-lens", length, "--topology", "v5e:1x1"]
        assert main([*argv, "--compute-dtype", "bfloat16", "--out", str(tmp_path / length)]) == 2
        assert "needs 1 tpu devices, this process has 1 cpu" in capsys.readouterr().err
        args = started[-1].split()
        assert args[0] == "--xla_jf_dump_to=/nowhere" and VMEM_FLAG not in args
        chosen = choose_plans(model, [tokens], "v5e:1x1", compute_dtype="bfloat16")
        asked = {str(plan_compiler_options(r.plan)) for r in chosen}
        assert asked == ({"{'xla_tpu_scoped_vmem_limit_kib': '98304'}"} if flagged else {"None"})


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
    the cited link figures, each source saying it was not measured; the rest is measured (on the chip,
    kernel timings made by the price's formulas from v5e-like figures, which the row then holds)."""
    from runtime import measure
    from validation import kernel_calibration as kc
    from validation.calibration import calibrate

    class Mesh:
        devices = np.zeros(1)

    def time_splash(mesh, topo, dtype, shape, *, heads, kv_heads, head_dim, repeats, skip_fused=""):
        call = kc.KernelShape(*shape, heads, kv_heads, head_dim)
        terms = kc.kernel_terms(call, act_bytes=2, hbm_s_per_byte=1 / 7.5e11)
        fused = None if skip_fused else kc.predict(V5E_LIKE, terms, "backward_fused")
        times = (kc.predict(V5E_LIKE, terms, "forward"), fused, kc.predict(V5E_LIKE, terms, "backward_separate"))
        return measure.SplashTimes(*times)

    timed = []
    monkeypatch.setattr(measure, "device_mesh", lambda topo: Mesh())
    monkeypatch.setattr(measure, "measure_matmul", lambda *a, **k: 1.5e13)
    monkeypatch.setattr(
        measure, "measure_matmuls", lambda mesh, dtype, shapes, repeats: [2 * m * k * n / 1.5e14 for m, k, n in shapes]
    )
    monkeypatch.setattr(measure, "measure_memory", lambda *a, **k: 7.5e11)
    monkeypatch.setattr(
        measure, "time_attention", lambda mesh, topo, dtype, shapes, **k: [1e-3 * (i + 1) for i in range(len(shapes))]
    )
    monkeypatch.setattr(measure, "time_splash", time_splash)
    monkeypatch.setattr(measure, "measure_collectives", lambda *a, **k: timed.append(a) or {})
    for name in ("v5e:1x1", "cpu:1"):
        cited = get_topology(name).chip
        result = calibrate(name, repeats=1, dtype="bfloat16")
        row = result.chip
        field = "ici_link_bw_bytes_per_s" if cited.kind.name == "TPU" else "core_link_bw_bytes_per_s"
        assert getattr(row, field) == getattr(cited, field) and row.ici_hop_latency_s == cited.ici_hop_latency_s
        for source in (row.sources[field], row.sources["ici_hop_latency_s"]):
            assert source.startswith(f"not measured: `cpplan calibrate --topology {name}` had one device")
        assert row.hbm_bw_bytes_per_s == 7.5e11 and "measured by" in row.sources["hbm_bw_bytes_per_s"]
        assert result.raw["links_measured"] is False and result.raw["collectives"] == {}
    assert timed == []
    # the chip: its cited peak kept, the layer's matmuls at 150 of 197 TFLOP/s, the kernels' figures found again
    (chip,) = [calibrate("v5e:1x1", repeats=1, dtype="bfloat16").chip]
    assert chip.peak_bf16_flops_per_s == 197e12 and chip.matmul_efficiency == pytest.approx(150 / 197)
    assert chip.attention_efficiency == pytest.approx(0.62, rel=1e-4)
    assert chip.attention_backward_over_forward == pytest.approx(2.0, rel=1e-4)
    assert chip.attention_unfused_backward_factor == pytest.approx(1.3, rel=1e-4)
    assert "mean error 0.0%" in chip.sources["attention_unfused_backward_factor"]


V5E_LIKE = np.array([1 / (197e12 * 0.62), 2.5e-7, 4e-13, 3.0, 2.0, 2.5, 1.3])  # in `FIGURES` order


def _synthetic_points(truth, noise, seed=0):
    from validation import kernel_calibration as kc

    shapes = kc.kernel_shapes(16, 8, 128)
    terms = {s: kc.kernel_terms(s, act_bytes=2, hbm_s_per_byte=1 / 8.1e11) for s in shapes}
    rng = np.random.default_rng(seed)
    points = [
        (s, kind, kc.predict(truth, terms[s], kind) * (1 + noise * rng.standard_normal()))
        for s in shapes
        for kind in kc.KINDS
        if kind != "backward_fused" or kc.fused_partials_bytes(s, 2) <= kc.FUSED_PARTIALS_BYTES
    ]
    return points, terms


@pytest.mark.pure
def test_the_kernel_fit_finds_the_figures_that_made_the_timings():
    """Timings made by the price's own formulas from known figures (v5e-like) at the shapes a TPU
    calibration times: the fit finds them again exactly; with 2% noise the figures that carry the time
    (FLOP rate, backward ratio, unfused factor) come back within 2% and every timing within 6%."""
    from validation import kernel_calibration as kc

    exact = kc.fit_kernels(*_synthetic_points(V5E_LIKE, 0.0))
    assert np.array(exact.figures) == pytest.approx(V5E_LIKE, rel=1e-4)
    assert exact.errors().max() < 1e-6 and "mean error 0.0%" in exact.error_text()
    noisy = kc.fit_kernels(*_synthetic_points(V5E_LIKE, 0.02))
    for i in (0, 4, 6):
        assert noisy.figures[i] == pytest.approx(V5E_LIKE[i], rel=0.02), kc.FIGURES[i]
    assert noisy.errors().max() < 0.06
    shapes = kc.kernel_shapes(16, 8, 128)
    assert {s.q_len for s in shapes} == {4096, 8192, 16384, 32768, 65536, 131072}
    assert {s.block for s in shapes} == {512, 1024, 2048} and {s.head_dim for s in shapes} == {128, 256}
    assert all(4 * s.q_len**2 / 2 * s.heads * s.head_dim <= kc.FORWARD_FLOPS or s.heads == 2 for s in shapes)
    assert all(s.heads == 2 * s.kv_heads for s in shapes)  # the model's query heads per kv head


@pytest.mark.pure
def test_a_fitted_row_prices_a_call_as_the_fit_does(tmp_path, monkeypatch):
    """The figures written into the v5e row price a one-layer plan's splash call (forward, and the
    backward the strategy runs) exactly as the fit predicted the timed kernel: the fit's formulas are
    the price's."""
    import dataclasses

    from cost_models.chips import CHIP_DIR_ENV, get_chip
    from cost_models.models import ModelSpec
    from cost_models.pricing.attention import price_attention
    from cost_models.strategies import STRATEGIES
    from planner import Plan, make_mesh
    from planner.estimate import candidates_of
    from validation import kernel_calibration as kc

    per_flop, step, masked, passes, ratio, bwd_passes, unfused = V5E_LIKE
    cited = get_chip("v5e")
    row = dataclasses.replace(
        cited,
        attention_efficiency=1 / (per_flop * cited.peak_bf16_flops_per_s),
        attention_block_overhead_s=step,
        attention_masked_element_s=masked,
        attention_operand_passes=passes,
        attention_backward_over_forward=ratio,
        attention_backward_operand_passes=bwd_passes,
        attention_unfused_backward_factor=unfused,
    )
    assert kc.chip_figures(row) == pytest.approx(V5E_LIKE, rel=1e-12)  # the row read back in the fit's order
    (tmp_path / "v5e.json").write_text(json.dumps(row.to_dict()))
    monkeypatch.setenv(CHIP_DIR_ENV, str(tmp_path))
    plan = Plan(
        model=ModelSpec("one-layer", 1, 2048, 16, 8, 128, 8192, 32000),
        topology="v5e:1x1",
        seq_len=8192,
        global_batch=1,
        mesh=make_mesh(),
        cp_strategy="none",
        block_q=1024,
        block_kv=1024,
        compute_dtype="bfloat16",
    )
    x = candidates_of(plan)
    assert x.topology.chip.attention_unfused_backward_factor == unfused
    spec = STRATEGIES[plan.cp_strategy]
    (call,) = spec.kernel_calls(x, spec.layout(x))
    priced = price_attention(x, spec)
    terms = kc.kernel_terms(
        kc.KernelShape(8192, 8192, 1024, True, 16, 8, 128), act_bytes=2, hbm_s_per_byte=1 / cited.hbm_bw_bytes_per_s
    )
    backward = "backward_fused" if call.fused_backward else "backward_separate"
    assert float(priced.forward_s[0]) == pytest.approx(kc.predict(V5E_LIKE, terms, "forward"), rel=1e-9)
    assert float(priced.backward_s[0]) == pytest.approx(kc.predict(V5E_LIKE, terms, backward), rel=1e-9)
