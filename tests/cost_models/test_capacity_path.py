"""MaxText's dense mixture-of-experts path with a capacity factor (`sparse_matmul=False`): slots, einsums and
slot matmuls by hand, the flags read into a plan's `expert_capacity` and written back, bad values refused."""

import dataclasses
import math

import pytest

from cost_models.errors import CpplanError
from cost_models.pricing.capacity import capacity_seconds, slot_rows, slots_per_sequence
from cost_models.pricing.experts import dispatched_rows, price_experts
from planner.estimate import candidates_of
from planner.maxtext import export_maxtext, read_maxtext
from planner.plan import Plan

pytestmark = pytest.mark.pure

MIXTRAL = (
    "model_name=mixtral-8x7b per_device_batch_size=12 max_target_length=4096 ici_fsdp_parallelism=-1 "
    "compile_topology=v6e-256 remat_policy=full"
)


def test_slots_einsums_and_slot_matmuls_by_hand():
    plan = read_maxtext(MIXTRAL + " sparse_matmul=False megablox=False capacity_factor=1.25").plan
    assert plan.expert_capacity == 1.25
    x = candidates_of(plan)
    # C = int(ceil(4096 · 2 / 8) · 1.25) = 1280 slots per expert per sequence (MaxText's generate_masks)
    assert float(slots_per_sequence(x)[0]) == 1280
    # 12 sequences a device, 8 experts of 1280 slots each: 122,880 rows, 1.25 × the 98,304 routed copies
    assert float(slot_rows(x)[0]) == 12 * 8 * 1280 == 1.25 * 12 * 4096 * 2
    assert float(dispatched_rows(x)[0]) == 122880
    experts_s, einsums_s = capacity_seconds(x)
    chip = x.topology.chip
    achievable = chip.peak_bf16_flops_per_s / chip.devices_per_chip * chip.matmul_efficiency
    # Mixtral: hidden 4096, expert width 14336 (both whole MXU tiles), 3 matrices
    assert float(experts_s[0]) == pytest.approx(122880 * 2 * 3 * 4096 * 14336 / achievable)
    # dispatch and combine: each 2 · 49,152 tokens · 4096 · 8 experts · 1280 slots
    assert float(einsums_s[0]) == pytest.approx(2 * 2 * 49152 * 4096 * 8 * 1280 / achievable)
    priced = price_experts(x)
    assert float(priced.grouped_s[0]) == pytest.approx(float(experts_s[0]))
    assert float(priced.permute_s[0]) == pytest.approx(float(einsums_s[0]))


def test_the_dense_path_prices_above_dropless():
    capacity = read_maxtext(MIXTRAL + " sparse_matmul=False capacity_factor=1.25").plan
    dropless = dataclasses.replace(capacity, expert_capacity=0.0)
    assert price_experts(candidates_of(capacity)).total_s[0] > price_experts(candidates_of(dropless)).total_s[0]


def test_capacity_without_the_dense_path_is_dropless_and_noted():
    read = read_maxtext(MIXTRAL + " capacity_factor=1.25")  # sparse_matmul stays True: the factor does nothing
    assert read.plan.expert_capacity == 0.0
    assert any(n.startswith("capacity_factor=1.25: acts on the dense path only") for n in read.notes)
    read = read_maxtext(MIXTRAL + " sparse_matmul=False")  # the dense path, no capacity: not priced, said
    assert read.plan.expert_capacity == 0.0 and any(n.startswith("sparse_matmul=False:") for n in read.notes)


def test_exported_and_read_back():
    plan = read_maxtext(MIXTRAL + " sparse_matmul=False capacity_factor=1.5").plan
    flags = export_maxtext(plan).flags
    assert (flags["sparse_matmul"], flags["megablox"], flags["capacity_factor"]) == (False, False, 1.5)
    again = read_maxtext(" ".join(f"{k}={v}" for k, v in flags.items()) + " compile_topology=v6e-256").plan
    assert again.expert_capacity == 1.5
    assert Plan.from_dict(plan.to_dict()).expert_capacity == 1.5


@pytest.mark.parametrize("value", [-1.0, math.inf, math.nan, True, "1.25"])
def test_bad_capacity_refused(value):
    plan = read_maxtext(MIXTRAL).plan
    with pytest.raises(CpplanError, match="expert_capacity"):
        dataclasses.replace(plan, expert_capacity=value)


def test_capacity_on_a_dense_model_refused():
    plan = read_maxtext(
        "model_name=llama3.1-8b per_device_batch_size=1 max_target_length=4096 compile_topology=v6e-8"
    ).plan
    with pytest.raises(CpplanError, match="has none; leave it 0"):
        dataclasses.replace(plan, expert_capacity=1.25)
    with pytest.raises(CpplanError, match="capacity_factor='x'"):
        read_maxtext(MIXTRAL + " sparse_matmul=False capacity_factor=x")
