"""tpu_compile tier: the training step compiled deviceless for TPU slices with libtpu."""

import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("libtpu")

from cost_models.errors import CpplanError  # noqa: E402
from cost_models.models import ModelSpec, get_model  # noqa: E402
from cost_models.topology import get_topology  # noqa: E402
from cost_models.units import GiB  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime.compile import compile_for, compile_step, parse_hbm_oom, tpu_devices  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402
from validation.compiled_program import COMPARED, count_check, plan_mesh_axes, read_compiled_program  # noqa: E402
from validation.peak_buffers import read_heap  # noqa: E402

pytestmark = pytest.mark.tpu_compile

MESHES = {
    "all_gather": dict(context=8),
    "ulysses": dict(context_ulysses=4, fsdp=2),
    "ring": dict(context=8),
    "usp": dict(context=4, context_ulysses=2),
}


def tiny_plan(topology, strategy, **kwargs):
    mesh = dict(MESHES[strategy])
    if topology.startswith("v5p"):  # 4 devices
        mesh = {k: (v // 2 if k in ("context", "fsdp") else v) for k, v in mesh.items()}
    options = dict(
        seq_len=4096,
        global_batch=2 if "fsdp" in mesh else 1,
        cp_strategy=strategy,
        load_balance="none" if strategy == "ulysses" else "zigzag",
        block_q=256,
        block_kv=256,
        loss_chunk_tokens=256,
    )
    options.update(kwargs)
    return Plan(model=get_model("tiny"), topology=topology, mesh=make_mesh(**mesh), **options)


# On tpu7x (two devices per chip) the ring and USP, whose programs hold all four strategies' kernel
# calls and collectives (USP: the all-to-all and the ring); on v5p Ulysses, since the count checks
# below compile the others for v5p.
@pytest.mark.parametrize(
    "topology, strategy", [("tpu7x:2x2x1", "ring"), ("tpu7x:2x2x1", "usp"), ("v5p:2x2x1", "ulysses")]
)
def test_tiny_model_compiles_for_tpu(topology, strategy):
    report = compile_for(tiny_plan(topology, strategy))
    assert report.fits
    assert report.argument_bytes > 0 and report.temp_bytes > 0
    assert report.required_bytes == (
        report.argument_bytes + report.output_bytes - report.alias_bytes + report.temp_bytes + report.code_bytes
    )
    assert report.available_bytes > 90 * GiB  # v5p 95.7 GiB, tpu7x 94.7 GiB per device
    assert "GiB per device" in str(report)


def test_the_heap_read_from_a_compiles_dump_is_the_compilers_temporary_allocation(tmp_path):
    options = {"xla_dump_to": str(tmp_path), "xla_dump_hlo_as_text": True, "xla_dump_hlo_module_re": "jit_fn.*"}
    report = compile_for(tiny_plan("tpu7x:2x2x1", "ring"), compiler_options=options)
    heap = read_heap(tmp_path)
    assert heap.size == report.temp_bytes
    assert 0 < heap.live_peak_bytes <= heap.size
    # the live bytes counted for the whole schedule are those listed value by value at each step
    for t in [heap.peak, *range(0, len(heap.totals), max(1, len(heap.totals) // 16))]:
        assert sum(v[1] for v in heap.live_at(t)) == heap.totals[t]


@pytest.mark.parametrize("topology, devices", [("v5p:2x2x1", 4), ("tpu7x:2x2x1", 8), ("v6e:2x2", 4)])
def test_far_over_hbm_returns_fits_false_with_the_compilers_figures(topology, devices):
    huge = ModelSpec("huge", 1, 65536, 8, 8, 128, 262144, 256)  # 52G parameters: ~200 GiB per device
    plan = Plan(
        model=huge,
        topology=topology,
        seq_len=4096,
        global_batch=1,
        mesh=make_mesh(context=devices),
        cp_strategy="ring",
        load_balance="zigzag",
        block_q=512,
        block_kv=512,
    )
    report = compile_for(plan)
    assert not report.fits
    assert report.required_bytes > 1.5 * report.available_bytes
    # the chip row's HBM per device is the compiler's figure (v5p 95.73 GiB; tpu7x 94.74 GiB, which
    # the row, read from a message rounded to 94.7, holds to within 0.05 GiB; v6e 31.24 GiB, under the 32 GiB
    # of its documents)
    assert report.available_bytes == pytest.approx(get_topology(topology).chip.hbm_bytes_per_device, abs=0.05 * GiB)
    assert "does not fit" in str(report) and "CompileTimeHbmOom" in report.message


def test_hbm_oom_message_parsing():
    message = (
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
        "Used 189.02G of 95.73G hbm. Exceeded hbm capacity by 93.29G. ... CompileTimeHbmOom: the program "
        "requires 189.02G, which exceeds available HBM (95.73G)"
    )
    need, have = parse_hbm_oom(message)
    assert need == int(189.02 * GiB) and have == int(95.73 * GiB)
    message = (
        "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required "
        "for HLO temporaries (186.89G) exceeds available HBM (95.73G). HLO module: jit_fn."
    )
    assert parse_hbm_oom(message) == (int(186.89 * GiB), int(95.73 * GiB))
    # the memory-space assignment's form alone (a step just over the limit, or over a lowered cap)
    message = (
        "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent error. Ran out of memory in "
        "memory space hbm. Used 4.24G of 4.23G hbm. Exceeded hbm capacity by 4.45M."
    )
    assert parse_hbm_oom(message) == (int(4.24 * GiB), int(4.23 * GiB))
    assert parse_hbm_oom("INVALID_ARGUMENT: something else") is None


def test_mesh_follows_the_plans_placement_on_the_torus():
    """context on z then y (innermost first), tensor on x: devices along 'context' differ in y/z only."""
    plan = Plan(
        model=get_model("tiny"),
        topology="v5p:2x2x2",
        seq_len=4096,
        global_batch=1,
        mesh=make_mesh(context=4, tensor=2),
        axis_order=("data", "fsdp", "tensor", "context_ulysses", "context"),
        physical_order=("x", "y", "z"),
        cp_strategy="ring",
    )
    mesh = build_mesh(plan, tpu_devices(plan))
    coords = np.array([[d.coords for d in row] for row in mesh.devices.reshape(4, 2).T])  # [tensor, context, xyz]
    assert (coords[:, :, 0] == coords[:, :1, 0]).all()  # x constant along context
    assert (coords[0, :, 0] != coords[1, :, 0]).all()  # tensor moves along x
    np.testing.assert_array_equal(coords[0, :, 1:], [[0, 0], [0, 1], [1, 0], [1, 1]])  # z innermost
    assert plan.axis_dims()["context"] == "z(2)·y(2)"


def test_non_tpu_plan_and_missing_libtpu(monkeypatch):
    cpu_plan = Plan(
        model=get_model("tiny"),
        topology="cpu:8",
        seq_len=4096,
        global_batch=1,
        mesh=make_mesh(context=8),
        cp_strategy="ring",
    )
    with pytest.raises(CpplanError, match="not one"):
        compile_for(cpu_plan)
    monkeypatch.setitem(sys.modules, "libtpu", None)
    with pytest.raises(CpplanError, match="pip install libtpu"):
        compile_for(tiny_plan("v5p:2x2x1", "ring"))


def test_a_two_slice_plan_builds_the_hybrid_mesh_and_compiles():
    """2 × v5p:2x2x2: ring over the 8 devices of a slice, the two slices on data (over DCN)."""
    plan = Plan(
        model=get_model("tiny"),
        topology="2xv5p:2x2x2",
        seq_len=4096,
        global_batch=2,
        mesh=make_mesh(data=2, context=8),
        dcn_data=2,
        cp_strategy="ring",
        load_balance="zigzag",
        block_q=256,
        block_kv=256,
        loss_chunk_tokens=256,
    )
    devices = tpu_devices(plan)
    assert len(devices) == 16 and {d.slice_index for d in devices} == {0, 1}
    mesh = build_mesh(plan, devices)
    grid = mesh.devices.reshape(2, 8)  # [data, context]
    assert [{d.slice_index for d in row} for row in grid] == [{0}, {1}]  # data crosses the slices
    assert len({tuple(d.coords) for d in grid[0]}) == 8  # context covers one slice's chips
    report = compile_for(plan)
    assert report.fits and report.argument_bytes > 0 and report.temp_bytes > 0
    assert report.plan.topology == "2xv5p:2x2x2"


# -- tpu_compile: the price's counts against compiled steps (v5p, whose module prints) --------
COMPILED_PLANS = {  # one tiny plan per strategy family (all-gather, ring, all-to-all with USP's ring), as in
    # benchmarks/bench_compiler_counts.py: (mesh, load balance, remat)
    "all_gather": (dict(context=4), "zigzag", "full"),
    "ring": (dict(context=4), "zigzag", "minimal_with_context"),
    # the kept attention output goes back through the all-to-all again in the backward
    "usp": (dict(context=2, context_ulysses=2), "none", "minimal_with_context"),
}


@pytest.mark.parametrize("strategy", list(COMPILED_PLANS))
def test_priced_flops_and_collective_bytes_match_the_compiled_step(strategy):
    mesh, balance, remat = COMPILED_PLANS[strategy]
    plan = Plan(
        model=get_model("small"),
        topology="v5p:2x2x1",
        seq_len=4096,
        global_batch=1,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        load_balance=balance,
        remat=remat,
        block_q=256,
        block_kv=256,
        loss_chunk_tokens=256,
    )
    step = compile_step(plan)
    check = count_check(plan, read_compiled_program(step.hlo_text, mesh_axes=plan_mesh_axes(plan)))
    assert abs(check.flops_error) <= 0.03, check
    assert check.compiled_bytes.get("context", 0.0) > 0  # the strategy's own traffic was found
    for category in COMPARED:
        error = check.bytes_error(category)
        assert error is None or abs(error) <= 0.05, (category, check)
