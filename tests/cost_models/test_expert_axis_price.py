"""The `expert` mesh axis in the price: the dispatch and return all-to-alls of a small case computed by hand,
the grouped matmul run over each device's E/e experts, the experts' weights gathered over the weight group
less `expert`, and the memory they hold; with one expert device the price is the one without the axis."""

import dataclasses

import numpy as np
import pytest

from cost_models.candidates import GROUP_AXES, Candidates, LinkColumns
from cost_models.case import Case
from cost_models.experts import Experts, expert_axis_problem, expert_axis_sizes
from cost_models.models import MODELS, ModelSpec
from cost_models.pricing import price
from cost_models.pricing.communication import expert_all_to_all_s
from cost_models.pricing.experts import dispatch_bytes, grouped_seconds, local_experts, receive_buffer_rows
from cost_models.targets import Target
from cost_models.topology import get_topology
from cost_models.vocabulary import AXES, BATCH_AXES, WEIGHT_SHARDING_AXES, CPStrategy

pytestmark = pytest.mark.pure

# 2 layers, both mixture-of-experts: hidden 8, 8 routed experts of width 6, top 2
MOE = ModelSpec("tiny-moe", 2, 8, 2, 1, 4, 16, 10, experts=Experts(8, 2, 6))
LINK = LinkColumns([1e9], [0.0])  # 1 GB/s, no latency


def candidate(expert: int, *, fsdp: int = 1, model: ModelSpec = MOE, remat: int = 0) -> Candidates:
    """One candidate of `model`: 4 sequences of 1024 tokens on v5p:2x2x1 (4 devices), every link 1 GB/s."""
    return Candidates(
        case=Case(model, get_topology("v5p:2x2x1"), seq_len=1024, global_batch=4),
        strategy=CPStrategy.NONE,
        data=[4 // (fsdp * expert)],
        fsdp=[fsdp],
        ring=[1],
        ulysses=[1],
        tensor=[1],
        expert=[expert],
        remat=[remat],
        zigzag=[False],
        block_q=[128],
        block_kv=[128],
        links={k: LINK for k in GROUP_AXES},
        ring_link=LINK,
    )


def test_the_axis_joins_the_vocabulary_as_fsdp_does_for_all_but_the_experts():
    assert AXES[-1] == "expert"
    assert "expert" in BATCH_AXES and "expert" in WEIGHT_SHARDING_AXES
    assert GROUP_AXES["expert"] == ("expert",)
    assert "expert" not in GROUP_AXES["expert_weights"] and "fsdp" in GROUP_AXES["expert_weights"]
    x = candidate(4)
    # one sequence per device: the batch splits over data × fsdp × expert
    assert x.sequences_per_device[0] == 1.0 and x.tokens_per_device[0] == 1024
    assert x.weight_group[0] == 4 and x.expert_weight_group[0] == 1


def test_dispatch_bytes_and_time_by_hand():
    x = candidate(4)
    # each device's 1024 tokens × top 2 copies × hidden 8 × 2 bytes (bf16)
    assert dispatch_bytes(x)[0] == 1024 * 2 * 8 * 2 == 32768
    # one all-to-all over 4 devices at 1 GB/s: A·n/(4W) = 32768 · 4 / 4e9
    one = 32768 * 4 / (4 * 1e9)
    # 2 layers × (forward dispatch and return + their transposes in the backward); remat 0 recomputes no MLP
    assert x.remat_columns.recompute_mlp[0] == 0
    assert expert_all_to_all_s(x)[0] == pytest.approx(2 * 4 * one)
    priced = price(x)
    assert priced.comm_s["expert_all_to_all"][0] == pytest.approx(2 * 4 * one)
    assert priced.exposed_s["expert_all_to_all"][0] == pytest.approx(2 * 4 * one)  # the matmuls wait for it


def test_no_expert_parallelism_no_dispatch_and_a_dense_model_has_no_such_family():
    assert expert_all_to_all_s(candidate(1, fsdp=4))[0] == 0.0
    dense = dataclasses.replace(MOE, name="tiny-dense", experts=None)
    assert "expert_all_to_all" not in price(candidate(1, fsdp=4, model=dense)).comm_s


def test_a_device_runs_its_own_experts_over_its_rows():
    x1, x4 = candidate(1, fsdp=4), candidate(4)
    assert local_experts(x1)[0] == 8 and local_experts(x4)[0] == 2
    chip = x4.topology.chip
    rows = 1024 * 2
    shapes = [(8, 6), (8, 6), (6, 8)]  # gate, up, down
    by_hand = sum(
        2 * chip.grouped_matmul_seconds(2, rows, k, n) + chip.grouped_matmul_seconds(2, rows, k, n, weight_grad=True)
        for k, n in shapes
    )
    assert grouped_seconds(x4)[0] == pytest.approx(by_hand / 3)
    assert grouped_seconds(x4)[0] <= grouped_seconds(x1)[0]  # fewer groups, the same rows


def test_the_experts_weights_are_gathered_over_the_group_less_expert():
    # fsdp 2 × expert 2: the rest of the layer over 4 devices, each device's 4 experts over the 2 of fsdp
    x = candidate(2, fsdp=2)
    priced = price(x)
    m = MOE
    routed = m.experts.routed_params(m.hidden, m.mlp_inputs) * 2  # bytes, bf16, per layer
    other = m.params_per_layer * 2 - routed
    one_layer = (other * 3 / 4 + routed / 2 * 1 / 2) / 1e9  # all-gather: V·(n−1)/n / W
    head = 2 * m.vocab * m.hidden * 2 * 3 / 4 / 1e9
    # forward and backward gathers (no q/k/v regather: no ring)
    assert priced.comm_s["fsdp_all_gather"][0] == pytest.approx(2 * 2 * one_layer + head)


def test_memory_holds_a_device_s_experts_and_maxtext_s_worst_case_receive_buffer():
    x = candidate(4)
    assert receive_buffer_rows(x, worst_case=False)[0] == 1024 * 2
    # MaxText's buffer: tokens × k × min(EP, E/k) = 2048 × min(4, 4)
    assert receive_buffer_rows(x, worst_case=True)[0] == 1024 * 2 * 4
    cpplan, maxtext = price(x).memory, price(x, target=Target.MAXTEXT).memory
    buffers = 2 * 1024 * 2 * 8 * 2  # dispatch receive and return send, hidden-wide, bf16
    base = price(dataclasses.replace(x, expert=np.array([1.0]), data=np.array([4.0]))).memory
    # the balanced buffers on cpplan's price: the MLP side holds them beside its working set
    # (the gathered matrices hold 2 of 8 experts: less than with every expert)
    matrices = 3 * 2 * 8 * 6 * (8 - 2) * 2  # the MLP loop's matrices (2 × 3), 6 experts fewer, bf16
    assert cpplan["mlp_working_set"][0] == pytest.approx(base["mlp_working_set"][0] + buffers - matrices)
    assert maxtext["forward_working_set"][0] - cpplan["forward_working_set"][0] == pytest.approx(3 * buffers)


def test_one_expert_device_prices_as_before():
    # expert=1 and fsdp=4 against the same mesh written without the axis (its default)
    x = candidate(1, fsdp=4)
    y = dataclasses.replace(x, expert=1.0)
    assert price(x).step_time_s[0] == price(y).step_time_s[0]


def test_the_axis_sizes_a_model_allows():
    assert expert_axis_sizes(MODELS["llama3.1-8b"]) == (1,)
    assert expert_axis_sizes(MOE) == (1, 2, 4, 8)
    assert expert_axis_problem(MOE, 4) is None
    assert "does not divide num_experts=8" in expert_axis_problem(MOE, 3)
    assert "has no experts" in expert_axis_problem(MODELS["llama3.1-8b"], 2)
