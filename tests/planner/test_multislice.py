"""Multi-slice plans: data and fsdp span slices over DCN, context and tensor stay inside a slice;
DCN traffic is priced hierarchically at the chip row's per-chip DCN bandwidth."""

import json

import pytest
from bounded_work import at_most_lines

import planner
from cost_models.collectives import all_gather
from cost_models.errors import CpplanError
from cost_models.models import get_model
from cost_models.topology import DCN_DIM, AxisLinks, get_topology
from planner.estimate import estimate
from planner.explanation import dcn_traffic
from planner.plan import Plan, make_mesh

pytestmark = pytest.mark.pure
V5P_DCN = 6.25e9  # v5p's chip row: How to Scale Your Model, ch. TPUs, per chip
V5P_DCN_LATENCY = (2.02e-4, 1.371e-4)  # v5p's chip row: v5e's fit (regenerate/fit_dcn_latency.py), base and per slice


@pytest.mark.parametrize(
    "name, canonical, slices, devices",
    [
        ("2xv5p-16", "2xv5p:2x2x2", 2, 16),
        ("2xv5p:2x2x2", "2xv5p:2x2x2", 2, 16),
        ("4xtpu7x-128", "4xtpu7x:4x4x4", 4, 512),
        ("1xv5p-16", "v5p:2x2x2", 1, 8),
        ("3xv5e:16x16", "3xv5e:16x16", 3, 768),
    ],
)
def test_multi_slice_names_parse_and_print_round_trip(name, canonical, slices, devices):
    topo = get_topology(name)
    assert (topo.name, topo.num_slices, topo.num_devices) == (canonical, slices, devices)
    assert topo.devices_per_slice * slices == devices
    assert get_topology(topo.name) == topo
    assert get_topology(name.split("x", 1)[1] if name[0].isdigit() else name, num_slices=slices) == topo


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        ("2xcpu:8", {}, "no DCN"),
        ("0xv5p-16", {}, "at least 1"),
        ("cpu:8", {"num_slices": 2}, "no DCN"),
        ("2xv5p-16", {"num_slices": 3}, "give the count once"),
        ("v5p-16", {"num_slices": 0}, "at least 1"),
        ("v5p-16", {"num_slices": 2.0}, "whole number"),
        ("99999999999999999xv5p-16", {}, "more than the 256"),
        ("v5p-16", {"num_slices": 257}, "more than the 256"),
    ],
)
def test_bad_slice_counts_are_refused_at_once_with_the_fix(name, kwargs, message):
    # at once: before any walk over the slices or their chips (reading the chip rows cold is a few
    # thousand lines of Python; a walk over 10^17 slices would be billions)
    with at_most_lines(50_000), pytest.raises(CpplanError, match=message):
        get_topology(name, **kwargs)


def test_across_slices_is_the_hierarchical_time_by_hand():
    topo = get_topology("2xv5p-16")
    ici = AxisLinks(4, 9e10, 2e-6, 4.5e10, 1e-6, True)
    crossing = topo.across_slices(ici, 2)
    gathered = 2**30
    # ICI: 3/4 of the array at 9e10; DCN: half of this device's quarter at 6.25e9 per chip; the latency:
    # ICI's and the row's DCN latency across 2 slices
    dcn_latency = V5P_DCN_LATENCY[0] + 2 * V5P_DCN_LATENCY[1]
    by_hand = gathered * 3 / 4 / 9e10 + gathered / 4 / 2 / V5P_DCN + 2e-6 + dcn_latency
    assert crossing.size == 8
    assert float(
        all_gather(gathered, 8, crossing.collective_bw_bytes_per_s, crossing.collective_latency_s)
    ) == pytest.approx(by_hand, rel=1e-12)
    dcn_part = gathered / 4 / 2 / V5P_DCN
    assert topo.dcn_share(ici, 2) == pytest.approx(dcn_part / (by_hand - 2e-6 - dcn_latency), rel=1e-12)
    assert topo.across_slices(ici, 1) is ici and topo.dcn_share(ici, 1) == 0.0


def _plan(**kwargs) -> Plan:
    return Plan(model=get_model("llama3.1-8b"), topology="2xv5p-16", seq_len=8192, global_batch=16, **kwargs)


def test_a_data_all_reduce_over_dcn_alone_takes_the_dcn_time_by_hand():
    # data=2 spans the two slices and nothing else: each device all-reduces its fsdp shard of the
    # gradients over DCN in the compute dtype (bf16, as compiled steps reduce them), 2·(1/2)·B at
    # 6.25e9 B/s, no ICI part; and 4 calls a layer and 7 a step, each a reduce-scatter and an all-gather
    # waiting the row's DCN latency across 2 slices
    plan = _plan(mesh=make_mesh(data=2, fsdp=8), dcn_data=2)
    shard_bytes = plan.model.num_params * 2 / 8
    waited = (4 * 32 + 7) * 2 * (V5P_DCN_LATENCY[0] + 2 * V5P_DCN_LATENCY[1])
    e = estimate(plan)
    assert e.comm_s["data_all_reduce"] == pytest.approx(shard_bytes / V5P_DCN + waited, rel=1e-12)
    # charged whole; MaxText sends it per layer inside the backward loop (tests/cost_models/test_dcn_bytes.py)
    assert e.exposed_s["data_all_reduce"] == e.comm_s["data_all_reduce"]
    [family] = dcn_traffic(plan, e)
    assert family["collective"] == "data all-reduce" and family["slices"] == 2
    assert family["dcn_seconds"] == pytest.approx(e.comm_s["data_all_reduce"], rel=1e-12)


def test_the_same_mesh_inside_one_slice_is_faster_than_over_dcn():
    one = Plan(
        model=get_model("llama3.1-8b"), topology="v5p-32", seq_len=8192, global_batch=16, mesh=make_mesh(data=2, fsdp=8)
    )
    two = _plan(mesh=make_mesh(data=2, fsdp=8), dcn_data=2)
    assert one.num_slices == 1 and get_topology(one.topology).num_devices == 16
    assert estimate(two).comm_s["data_all_reduce"] > 3 * estimate(one).comm_s["data_all_reduce"]


def test_fsdp_over_dcn_shows_in_the_segments_and_the_explanation():
    plan = _plan(mesh=make_mesh(fsdp=16), dcn_fsdp=2)
    assert plan.segments()["fsdp"][-1].dim == DCN_DIM and plan.axis_dims()["fsdp"].endswith("dcn(2)")
    e = estimate(plan)
    [family] = dcn_traffic(plan, e)
    assert family["collective"].startswith("fsdp") and 0 < family["dcn_seconds"] < family["seconds"]
    assert family["exposed_seconds"] == e.exposed_s["fsdp"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mesh": make_mesh(data=2, fsdp=8)}, "must equal the 2 slices"),
        ({"mesh": make_mesh(data=2, fsdp=8), "dcn_fsdp": 2, "dcn_data": 2}, "must equal the 2 slices"),
        ({"mesh": make_mesh(fsdp=8, context=2), "dcn_data": 2}, "data=1 cannot span dcn_data=2"),
    ],
)
def test_a_plan_spans_every_slice_with_data_and_fsdp_only(kwargs, message):
    with pytest.raises(CpplanError, match=message):
        _plan(**kwargs)


def test_plan_json_round_trips_its_slices_and_one_slice_json_is_unchanged():
    plan = _plan(mesh=make_mesh(data=2, fsdp=8), dcn_data=2)
    row = json.loads(plan.to_json())
    assert (row["topology"], row["dcn_data"], row["dcn_fsdp"]) == ("2xv5p:2x2x2", 2, 1)
    assert Plan.from_json(plan.to_json()) == plan
    one = Plan(model=get_model("llama3.1-8b"), topology="v5p-16", seq_len=8192, global_batch=8, mesh=make_mesh(fsdp=8))
    assert "dcn_data" not in one.to_dict()


def test_the_search_keeps_context_and_tensor_inside_a_slice():
    e = planner.explain("llama3.1-8b", "128k", "v5p-128", num_slices=2)
    best = e.best
    assert best.topology == "2xv5p:4x4x4" and best.num_slices == 2
    segments = best.segments()
    for axis in ("context", "context_ulysses", "tensor"):
        assert all(s.dim != DCN_DIM for s in segments[axis])
    crossing = [axis for axis in ("data", "fsdp") if any(s.dim == DCN_DIM for s in segments[axis])]
    assert crossing and best.mesh_dict["data"] * best.mesh_dict["fsdp"] % 2 == 0
    assert estimate(best).step_time_s == pytest.approx(e.estimate.step_time_s, rel=1e-12)
    text = str(e)
    assert "across DCN     2 slices, 6.25 GB/s of DCN per chip" in text
    assert json.loads(e.to_json())["dcn"] == dcn_traffic(best, e.estimate)


def test_maxtext_flags_carry_the_slices_both_ways():
    plan = _plan(mesh=make_mesh(data=2, fsdp=8), dcn_data=2)
    flags = plan.to_maxtext()
    assert (flags["ici_data_parallelism"], flags["ici_fsdp_parallelism"]) == (1, 8)
    assert (flags["dcn_data_parallelism"], flags["dcn_fsdp_parallelism"], flags["num_slices"]) == (2, 1, 2)
    assert (flags["compile_topology"], flags["compile_topology_num_slices"]) == ("v5p-16", 2)
    back = Plan.from_maxtext(flags)
    assert (back.mesh_dict, back.dcn_data, back.dcn_fsdp, back.global_batch) == (plan.mesh_dict, 2, 1, 16)


def test_a_maxtext_two_slice_run_is_priced_over_both_slices():
    # MaxText's multi-slice AOT example: the defaults put the slices on data (dcn_data_parallelism=-1)
    # and one slice's devices on fsdp (ici_fsdp_parallelism=-1); per_device_batch_size counts every device
    flags = (
        "python3 -m MaxText.train_compile MaxText/configs/base.yml compile_topology=v5e-256 "
        "compile_topology_num_slices=2 model_name=llama3.1-8b per_device_batch_size=4 max_target_length=2048"
    )
    plan = Plan.from_maxtext(flags)
    assert plan.topology == "2xv5e:16x16" and (plan.dcn_data, plan.dcn_fsdp) == (2, 1)
    assert plan.mesh_dict["data"] == 2 and plan.mesh_dict["fsdp"] == 256
    assert plan.global_batch == 4 * 512
    fsdp_across = Plan.from_maxtext(flags + " dcn_data_parallelism=1 dcn_fsdp_parallelism=2")
    assert fsdp_across.mesh_dict["fsdp"] == 512 and fsdp_across.dcn_fsdp == 2


@pytest.mark.parametrize(
    "extra, message",
    [
        ("dcn_tensor_parallelism=2", "dcn_tensor_parallelism=1"),
        ("dcn_data_parallelism=4", "must equal the 2 slices"),
    ],
)
def test_maxtext_dcn_axes_that_the_planner_does_not_span_are_refused(extra, message):
    flags = f"compile_topology=v5e-256 compile_topology_num_slices=2 model_name=llama3.1-8b {extra}"
    with pytest.raises(CpplanError, match=message):
        Plan.from_maxtext(flags)


def test_max_seq_len_over_two_slices_takes_a_sequence_per_slice():
    one = planner.max_seq_len("llama3.1-8b", "v5p-16")
    two = planner.max_seq_len("llama3.1-8b", "v5p-16", num_slices=2)
    assert two.plan.topology == "2xv5p:2x2x2" and two.sequences == 2
    assert "a sequence stays inside one slice" in two.note
    # each slice holds what one slice holds, with the weights sharded over both: never shorter
    assert two.seq_len >= one.seq_len


def test_the_cli_flag_plans_over_several_slices(capsys):
    import cli

    assert (
        cli.main(
            [
                "export",
                "--model",
                "llama3.1-8b",
                "--seq-len",
                "128k",
                "--topology",
                "v5p-128",
                "--num-slices",
                "2",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    flags, compile_flags = out["flags"], out["compile_flags"]
    assert compile_flags["compile_topology"] == "v5p-128" and compile_flags["compile_topology_num_slices"] == 2
    assert flags["dcn_data_parallelism"] * flags["dcn_fsdp_parallelism"] == 2
    assert cli.main(["explain", "--model", "tiny", "--seq-len", "8k", "--topology", "cpu:8", "--num-slices", "2"]) == 2
    assert "no DCN between slices" in capsys.readouterr().err


def test_a_fixed_mesh_that_cannot_stay_inside_a_slice_is_refused_first():
    with pytest.raises(CpplanError, match=r"puts 16 devices on context, context_ulysses and tensor.*has 8"):
        planner.explain("tiny", "64k", "2xv5p-16", mesh={"context": 16})
    best = planner.explain("tiny", "64k", "2xv5p-16", mesh={"context": 8}).best
    assert best.axis_size("context") == 8 and best.num_slices == 2
