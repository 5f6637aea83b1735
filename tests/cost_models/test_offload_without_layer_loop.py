"""An offloading TPU step of at most two layers has no layer loop (the compiler peels one iteration
off each loop to pipeline the host transfers and inlines the one-trip loops left), and there its
offloaded values stay in HBM: the memory price holds them as kept values
(cost_models.remat: `FLAT_OFFLOAD_MAX_LAYERS`, `offloads_leave_hbm`)."""

import dataclasses

import pytest

from cost_models.chips import get_chip
from cost_models.models import MODELS
from cost_models.remat import FLAT_OFFLOAD_MAX_LAYERS, offloads_leave_hbm
from cost_models.units import MiB
from planner import Plan, make_mesh
from planner.estimate import estimate

pytestmark = pytest.mark.pure
BASE = MODELS["llama3.1-8b"]


def priced(layers, remat, topology="v5p-16", target=None, **fields):
    model = dataclasses.replace(BASE, name=f"{BASE.name}-{layers}l", num_layers=layers)
    return estimate(
        Plan(
            model=model,
            topology=topology,
            seq_len=8192,
            global_batch=8,
            mesh=make_mesh(fsdp=4, tensor=2),
            remat=remat,
            **fields,
        ),
        target=target,
    )


def test_the_rule_reads_the_chip_row():
    assert FLAT_OFFLOAD_MAX_LAYERS == 2
    for name in ("v5p", "tpu7x"):
        assert [offloads_leave_hbm(get_chip(name), n) for n in (1, 2, 3, 32)] == [False, False, True, True]
    assert offloads_leave_hbm(get_chip("cpu"), 1)
    # a row whose compiler does not peel the loops frees what it offloads at any depth
    assert offloads_leave_hbm(dataclasses.replace(get_chip("v5p"), offload_peels_layer_loops=False), 1)


def test_the_maxtext_target_holds_a_flat_programs_offloads_as_its_twin_does_too():
    offloading, twin = priced(2, "minimal_offloaded", target="maxtext"), priced(2, "minimal", target="maxtext")
    assert offloading.hbm_bytes == pytest.approx(twin.hbm_bytes)
    assert (
        priced(3, "minimal_offloaded", target="maxtext").hbm_bytes["activations"]
        < priced(3, "minimal", target="maxtext").hbm_bytes["activations"]
    )


@pytest.mark.parametrize("layers", [1, 2])
def test_a_flat_program_holds_what_it_offloads_as_its_in_hbm_twin_does(layers):
    offloading, twin = priced(layers, "minimal_offloaded"), priced(layers, "minimal")
    assert offloading.hbm_bytes == pytest.approx(twin.hbm_bytes)
    # the values still go to the host and come back: their copies are priced
    assert offloading.comm_s["host_offload"] > 0 == twin.comm_s["host_offload"]


def test_a_layer_loop_frees_what_it_offloads():
    # at 3 layers minimal_offloaded keeps none of q, k, v, the out projection and the MLP's two input
    # projections in HBM: per layer, per device (2 sequences of 8192 tokens, split over tensor 2),
    # q 4096 + k, v 1024 each + out 4096 + 2 x 14336 = 38912 values a token in bf16:
    # 16384 x 38912 / 2 x 2 bytes = 608 MiB
    offloading, twin = priced(3, "minimal_offloaded"), priced(3, "minimal")
    assert twin.hbm_bytes["activations"] - offloading.hbm_bytes["activations"] == pytest.approx(3 * 608 * MiB)


def test_custom_placements_follow_the_same_rule_and_plans_that_offload_nothing_do_not_move():
    custom = {"query_proj": "offload", "mlpwi_0": "offload", "mlpwi_1": "offload"}
    in_hbm = {name: "device" for name in custom}
    assert priced(2, "custom", remat_custom=custom).hbm_bytes == pytest.approx(
        priced(2, "custom", remat_custom=in_hbm).hbm_bytes
    )
    assert (
        priced(3, "custom", remat_custom=custom).hbm_bytes_per_device
        < priced(3, "custom", remat_custom=in_hbm).hbm_bytes_per_device
    )
