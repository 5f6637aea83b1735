"""The weights and the optimizer's state kept on the host between steps (MaxText's
`parameter_memory_host_offload`, `optimizer_memory_host_offload`): HBM, host memory and copies, by hand."""

import dataclasses

import pytest

from cost_models.errors import CpplanError
from cost_models.models import get_model
from cost_models.vocabulary import HostState
from planner import make_mesh
from planner.estimate import estimate
from planner.maxtext import export_maxtext, read_maxtext
from planner.plan import Plan

pytestmark = pytest.mark.pure

# Llama 3.1 8B on v5p-16 (8 chips, one device each), ring 8: every weight split 8 ways
RING_V5P_16 = (
    "compile_topology=v5p-16 model_name=llama3.1-8b max_target_length=131072 per_device_batch_size=0.125 "
    "ici_fsdp_parallelism=1 ici_context_parallelism=8 context_parallel_strategy=ring use_tokamax_splash=True "
)
PARAMS = 8_030_261_248  # llama3.1-8b: 32 layers × 218,112,000 + 2 × 128,256 × 4,096 + 4,096
WEIGHTS_BYTES = PARAMS * 4 // 8  # fp32 weights, split over 8 devices
MOMENTS_BYTES = PARAMS * (4 + 4) // 8  # AdamW's two fp32 moments
HOST_LINK = 1.6e10  # v5p's host link, B/s per chip and direction (one device a chip)


def _plan(flags: str = "") -> Plan:
    return read_maxtext(RING_V5P_16 + flags).plan


def test_the_model_has_the_parameters_the_hand_figures_count():
    assert get_model("llama3.1-8b").num_params == PARAMS


def test_state_on_host_is_in_hbm_all_step_as_maxtext_brings_it_in_at_the_steps_start():
    # MaxText 0.2.5's deviceless compile of this plan holds 35.98 GiB with the moments on the host or not
    base = estimate(_plan(), target="maxtext")
    both = estimate(
        _plan("optimizer_memory_host_offload=true parameter_memory_host_offload=true param_scan_axis=0"),
        target="maxtext",
    )
    assert base.hbm_bytes["optimizer"] == both.hbm_bytes["optimizer"] == pytest.approx(MOMENTS_BYTES)
    assert base.hbm_bytes["params"] == both.hbm_bytes["params"] == pytest.approx(WEIGHTS_BYTES)
    assert both.hbm_bytes_per_device == pytest.approx(base.hbm_bytes_per_device)
    assert both.comm_s["host_state"] == pytest.approx(2 * (WEIGHTS_BYTES + MOMENTS_BYTES) / HOST_LINK)


def test_the_moments_copy_in_runs_beside_the_layers_and_every_other_copy_is_waited_for():
    base = estimate(_plan(), target="maxtext")
    moments = estimate(_plan("optimizer_memory_host_offload=true"), target="maxtext")
    weights = estimate(_plan("parameter_memory_host_offload=true param_scan_axis=0"), target="maxtext")
    assert base.exposed_s["host_state"] == 0
    # the layers' compute of this step is far longer than the 0.50 s copy in: only the copy back is exposed
    assert moments.exposed_s["host_state"] == pytest.approx(MOMENTS_BYTES / HOST_LINK)  # 0.5019 s
    assert moments.step_time_s - base.step_time_s == pytest.approx(MOMENTS_BYTES / HOST_LINK)
    # the first layer waits for the weights' copy in, and the copy back follows the update
    assert weights.exposed_s["host_state"] == pytest.approx(2 * WEIGHTS_BYTES / HOST_LINK)  # 0.5019 s


def test_import_needs_the_layers_stacked_on_axis_0_to_offload_the_weights():
    with pytest.raises(CpplanError, match="param_scan_axis=0"):
        _plan("parameter_memory_host_offload=true")


def test_state_on_host_round_trips_through_maxtext_flags_and_json():
    plan = _plan("parameter_memory_host_offload=true optimizer_memory_host_offload=true param_scan_axis=0")
    assert plan.state_on_host == (HostState.PARAMS, HostState.OPTIMIZER)
    flags = export_maxtext(plan).flags
    assert flags["parameter_memory_host_offload"] is flags["optimizer_memory_host_offload"] is True
    assert flags["param_scan_axis"] == 0
    assert Plan.from_json(plan.to_json()) == plan
    assert "state_on_host" not in _plan().to_dict()
    assert "optimizer_memory_host_offload" not in export_maxtext(_plan()).flags
    assert dataclasses.replace(plan, state_on_host=["optimizer", "params"]).state_on_host == plan.state_on_host


def test_state_on_host_names_what_it_accepts():
    with pytest.raises(CpplanError, match="params, optimizer"):
        dataclasses.replace(_plan(), state_on_host="optimizer")
    with pytest.raises(CpplanError, match="host-offloaded state"):
        dataclasses.replace(_plan(), state_on_host=("gradients",))


def test_state_on_host_is_checked_against_the_hosts_memory():
    # Llama 3.1 405B on v5p-8 (4 chips), fsdp 4: its moments are 810 GB a device, the host has 112 GiB a chip
    plan = Plan(
        model=get_model("llama3.1-405b"),
        topology="v5p-8",
        seq_len=8192,
        global_batch=4,
        mesh=make_mesh(fsdp=4),
        state_on_host=("optimizer",),
    )
    with pytest.raises(CpplanError, match=r"the optimizer on the host: 75\d\.\d GiB.*112\.0 GiB"):
        plan.check()
