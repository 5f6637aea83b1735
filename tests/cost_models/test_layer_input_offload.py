"""Offload of each layer's input (MaxText's `decoder_layer_input=offload` under `remat_policy=custom`):
the remat table moves it from HBM to host memory, the price moves its bytes and its copies, and
the search and `Plan.check` refuse plans whose offloaded activations overflow the host."""

import pytest

from cost_models.errors import CpplanError
from cost_models.models import MODELS
from cost_models.remat import LAYER_INPUT, layer_input_placement, offloaded_names, remat_code, remat_table
from cost_models.units import GiB
from cost_models.vocabulary import DTYPE_BYTES, Placement, RematPolicy
from planner import Plan, make_mesh
from planner.api import run_search
from planner.estimate import estimate

pytestmark = pytest.mark.pure
MODEL = MODELS["llama3.1-8b"]
OFFLOADED = {LAYER_INPUT: "offload", "query_proj": "device"}


def plan(custom, *, tensor=1, seq_len=8192):
    return Plan(
        model=MODEL,
        topology="v5p-16",
        seq_len=seq_len,
        global_batch=8,
        mesh=make_mesh(fsdp=8 // tensor, tensor=tensor),
        remat="custom",
        remat_custom=custom,
    )


def test_table_moves_the_layer_input_to_the_host():
    custom = plan(OFFLOADED).remat_custom
    assert layer_input_placement(RematPolicy.CUSTOM, custom) is Placement.OFFLOAD
    assert offloaded_names(RematPolicy.CUSTOM, custom) == (LAYER_INPUT,)
    # no named policy offloads it: MaxText's presets name only the projections
    assert all(layer_input_placement(p) is Placement.DEVICE for p in RematPolicy)
    row = remat_code(RematPolicy.CUSTOM)
    kept = remat_table(MODEL, plan({"query_proj": "device"}).remat_custom).saved_on_device[row]
    on_device, offloaded = kept, remat_table(MODEL, custom).saved_on_device[row]
    assert on_device - offloaded == MODEL.hidden
    assert remat_table(MODEL, custom).saved_on_host[row] == MODEL.hidden


@pytest.mark.parametrize("tensor", [1, 2])
def test_price_moves_layers_times_tokens_times_hidden_to_host(tensor):
    device, host = estimate(plan({"query_proj": "device"}, tensor=tensor)), estimate(plan(OFFLOADED, tensor=tensor))
    tokens = 8 * 8192 / (8 // tensor)  # the device's tokens, before the split over tensor (sequence parallelism)
    moved = MODEL.num_layers * tokens * MODEL.hidden * DTYPE_BYTES["bfloat16"] / tensor
    assert device.hbm_bytes["activations"] - host.hbm_bytes["activations"] == pytest.approx(moved)
    # its copies to the host and back are priced on the host link, in place of the layer loop's copy of it
    # into the layer stack in HBM (read and written, bf16, at v5p's 2.76 TB/s)
    assert device.comm_s.get("host_offload", 0) == 0 < host.comm_s["host_offload"]
    stack_copy_s = moved * 2 / 2.76e12
    exposed = host.exposed_s.get("host_offload", 0.0)
    assert host.step_time_s == pytest.approx(device.step_time_s - stack_copy_s + exposed, rel=1e-9)


def test_host_memory_overflow_is_refused_by_plan_and_search():
    # 1M tokens on 8 v5p chips: 32 layers × 128K tokens × 4096 × 2 bytes = 32 GiB of layer inputs per
    # device, plus the minimal policy's matmul outputs: more than a v5p host's 104 GiB per chip
    with pytest.raises(CpplanError, match="host memory per device"):
        plan(
            {LAYER_INPUT: "offload", "mlpwi_0": "offload", "mlpwi_1": "offload", "query_proj": "offload"},
            seq_len=131072,
        ).check()
    result = run_search(MODEL, 131072, "v5p-16", global_batch=8, remat="minimal_offloaded")
    host = [r for r in result.rejections if r.category == "host"]
    assert host and all(r.remat is RematPolicy.MINIMAL_OFFLOADED for r in host)
    assert "GiB host memory per device" in host[0].reason
    needed = float(host[0].reason.split()[1])
    assert needed > 112e9 / GiB  # the v5p row's host memory per chip, one device per chip
