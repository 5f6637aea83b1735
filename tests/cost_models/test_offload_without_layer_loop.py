"""An offloading TPU step of at most two layers has no layer loop (the compiler peels one iteration
off each loop to pipeline the host transfers and inlines the one-trip loops left). At one layer its
offloaded values stay in HBM through its one backward: the memory price holds them as kept values. At
two the program holds through the forward and the loss what a loop would have freed, priced by what it
holds (`flat_program_held`), and its layers' backward is priced as a loop's (cost_models.remat:
`FLAT_OFFLOAD_MAX_LAYERS`, `offloads_leave_hbm`, `flat_offload_program`)."""

import dataclasses

import pytest

from cost_models.chips import get_chip
from cost_models.models import MODELS
from cost_models.pricing.memory import LOSS_MEMORY, LOSS_STATE
from cost_models.remat import FLAT_OFFLOAD_MAX_LAYERS, flat_offload_program, offloads_leave_hbm
from cost_models.units import MiB
from planner import Plan, explain, make_mesh
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
        assert [offloads_leave_hbm(get_chip(name), n) for n in (1, 2, 3, 32)] == [False, True, True, True]
        assert [flat_offload_program(get_chip(name), n) for n in (1, 2, 3, 32)] == [False, True, False, False]
    assert offloads_leave_hbm(get_chip("cpu"), 1)
    assert not flat_offload_program(get_chip("cpu"), 2)
    # a row whose compiler does not peel the loops frees what it offloads at any depth
    unpeeled = dataclasses.replace(get_chip("v5p"), offload_peels_layer_loops=False)
    assert offloads_leave_hbm(unpeeled, 1)
    assert not flat_offload_program(unpeeled, 2)


@pytest.mark.parametrize("target", [None, "maxtext"])
def test_a_step_of_one_layer_holds_what_it_offloads_as_its_in_hbm_twin_does(target):
    offloading, twin = priced(1, "minimal_offloaded", target=target), priced(1, "minimal", target=target)
    assert offloading.hbm_bytes == pytest.approx(twin.hbm_bytes)
    assert offloading.hbm_bytes["flat_program_held"] == 0
    # the values still go to the host and come back: their copies are priced
    assert offloading.comm_s["host_offload"] > 0 == twin.comm_s["host_offload"]


def phase(e, keys):
    return sum(e.hbm_bytes[k] for k in keys)


def test_a_flat_program_holds_at_its_loss_what_a_loop_would_have_freed():
    # minimal_offloaded offloads q, k, v and the out projection (4096 + 1024 + 1024 + 4096 = 10240 values
    # a token) and the MLP's two input projections (2 x 14336); a device holds 2 sequences of 8192 tokens,
    # each value split over tensor 2, in bf16 (2 bytes). Held through the forward and the loss:
    attention_side = 2 * 16384 * 10240 / 2 * 2  # every layer's offloaded attention values: 320 MiB
    recomputed = 2 * 8192 * 2 * 4096 * 2  # each layer's residual sum and MLP input, on 8192 tokens: 256 MiB
    mlp_chunks = 2 * 4096 * 2 * 14336 / 2 * 2  # the last MLP chunk written, the first fetched: 224 MiB
    gathered = 3 * 4096 * 14336 / 2 * 2  # the last layer's gathered MLP matrices: 168 MiB
    held = attention_side + recomputed + mlp_chunks + gathered
    assert held == 968 * MiB
    offloading, twin = priced(2, "minimal_offloaded"), priced(2, "minimal")
    assert offloading.hbm_bytes["flat_program_held"] == held
    # tpu7x holds a layer's weights more (218,112,000 less the two norms' 4096, over tensor 2, bf16)
    tpu7x = priced(2, "minimal_offloaded", topology="tpu7x:2x2x1")
    assert tpu7x.hbm_bytes["flat_program_held"] == held + (218_112_000 - 2 * 4096) / 2 * 2 == (968 + 208) * MiB
    # its offloads are gone by its layers' backward, as a loop's are; the peak is its loss
    assert twin.hbm_bytes["activations"] - offloading.hbm_bytes["activations"] == pytest.approx(2 * 608 * MiB)
    assert offloading.hbm_bytes["mlp_working_set"] < twin.hbm_bytes["mlp_working_set"]
    assert offloading.hbm_bytes_per_device == pytest.approx(phase(offloading, LOSS_STATE + LOSS_MEMORY))
    assert offloading.hbm_bytes_per_device < twin.hbm_bytes_per_device
    assert priced(3, "minimal_offloaded").hbm_bytes["flat_program_held"] == 0


def test_a_flat_program_keeps_each_layers_lane_wide_log_sum_exp_where_the_chip_holds_it():
    # tpu7x holds splash's log-sum-exp lane-wide where no layer loop's stack slices it: 2 sequences x
    # 8192 queries x 16 heads a device (32 over tensor 2) x 128 lanes x 4 bytes = 128 MiB a layer
    custom = {"query_proj": "offload", "mlpwi_0": "offload", "mlpwi_1": "offload", "context": "device"}
    flat, looped = (
        priced(n, "custom", topology="tpu7x:2x2x1", remat_custom=custom).hbm_bytes["activations"] for n in (2, 3)
    )
    assert flat / 2 - looped / 3 == pytest.approx(128 * MiB)


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
    assert priced(1, "custom", remat_custom=custom).hbm_bytes == pytest.approx(
        priced(1, "custom", remat_custom=in_hbm).hbm_bytes
    )
    assert priced(2, "custom", remat_custom=custom).hbm_bytes["flat_program_held"] > 0
    assert priced(2, "custom", remat_custom=in_hbm).hbm_bytes["flat_program_held"] == 0
    assert (
        priced(3, "custom", remat_custom=custom).hbm_bytes_per_device
        < priced(3, "custom", remat_custom=in_hbm).hbm_bytes_per_device
    )


def test_explain_shows_what_a_flat_program_holds_at_the_loss_and_in_the_forward_and_nothing_otherwise():
    lines = {}
    for layers in (2, 3):
        model = dataclasses.replace(BASE, name=f"{BASE.name}-{layers}l", num_layers=layers)
        text = str(explain(model, 8192, "v5p:2x2x2", global_batch=8, remat=["minimal_offloaded"]))
        lines[layers] = [line for line in text.splitlines() if line.startswith(("  loss", "  forward"))]
    assert len(lines[2]) == 2 and all("flat_program_held" in line for line in lines[2])
    assert len(lines[3]) == 2 and not any("flat_program_held" in line for line in lines[3])
