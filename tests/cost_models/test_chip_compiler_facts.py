"""The chip rows' compiler-schedule facts (`COMPILER_SCHEDULE_FIELDS`): each cited with the compile
it was read from, refused when not a boolean, and read by the memory price from the row alone."""

import dataclasses
import json

import pytest

from cost_models.chips import CHIP_DIR, CHIP_DIR_ENV, COMPILER_SCHEDULE_FIELDS, Chip, get_chip, known_chips
from cost_models.errors import CpplanError
from cost_models.models import get_model
from planner import Plan, make_mesh
from planner.estimate import estimate

pytestmark = pytest.mark.pure


@pytest.mark.parametrize("chip", [c for c in known_chips().values() if c.kind.has_torus], ids=lambda c: c.name)
def test_each_fact_says_its_value_and_where_it_was_read(chip):
    for name in COMPILER_SCHEDULE_FIELDS:
        source = chip.sources.get(name, "")
        value = getattr(chip, name)
        # a flipped value with its citation left as it was no longer matches
        assert source.startswith("true:" if value else "false:"), f"{chip.name}.{name}={value}: {source!r}"
        assert "compile" in source, f"{chip.name}.{name} names no compile: {source!r}"
        # a fact read from a compile names the libtpu and where it was read; an unchecked one says so
        read = "libtpu 0.0.52" in source and "validation/peak_buffers.py" in source
        unchecked = "not checked by a compile" in source
        assert read != unchecked, f"{chip.name}.{name}: neither read from a named compile nor marked unchecked"
        if chip.name in ("tpu7x", "v5p"):
            assert read, f"{chip.name}.{name} was read from compiles; its source must say which"


def test_the_facts_read_from_compiles():
    # tpu7x showed the layout moves, the early attention and the lane-wide log-sum-exp in its
    # compiles, v5p none of them (the same plans compiled for v5p:2x2x2); both peel the layer loops
    # of an offloading step; v5p, not tpu7x, holds the forward's lane-wide log-sum-exp to the layer's end;
    # tpu7x, not v5p, holds a layer's weights more at a flat offloading program's loss, and runs its
    # reduce-scatters on the SparseCore with a scratch (v6e and v5e, like v5p, on the TensorCore)
    assert {name: getattr(get_chip("tpu7x"), name) for name in COMPILER_SCHEDULE_FIELDS} == {
        "relayout_off_tensorcore": True,
        "attention_before_mlp_backward": True,
        "offload_peels_layer_loops": True,
        "splash_lse_lanes_held": True,
        "forward_lse_lanes_held": False,
        "flat_offload_holds_layer_weights": True,
        "reduce_scatter_scratch": True,
        "logit_gradient_fused_into_head_matmul": False,
    }
    assert {name: getattr(get_chip("v5p"), name) for name in COMPILER_SCHEDULE_FIELDS} == {
        "relayout_off_tensorcore": False,
        "attention_before_mlp_backward": False,
        "offload_peels_layer_loops": True,
        "splash_lse_lanes_held": False,
        "forward_lse_lanes_held": True,
        "flat_offload_holds_layer_weights": False,
        "reduce_scatter_scratch": False,
        "logit_gradient_fused_into_head_matmul": False,
    }
    assert get_chip("v6e").reduce_scatter_scratch is get_chip("v5e").reduce_scatter_scratch is False
    # v6e's head-gradient matmul reads the logits and forms their gradient in its fusion (the 70B v6e-128
    # compile recomputes them); v5p and tpu7x write the logit gradient as its own fusion
    assert get_chip("v6e").logit_gradient_fused_into_head_matmul is True


@pytest.mark.parametrize("name", COMPILER_SCHEDULE_FIELDS)
@pytest.mark.parametrize("bad", [1, "true", None])
def test_a_fact_that_is_not_a_boolean_is_refused(name, bad):
    row = json.loads((CHIP_DIR / "tpu7x.json").read_text())
    with pytest.raises(CpplanError, match=f"{name}=.*must be true or false"):
        Chip.from_dict({**row, name: bad}, origin="test row")


def _hbm_with(monkeypatch, tmp_path, plan: Plan, target: str = "cpplan", **facts) -> dict:
    """The plan's HBM breakdown with its chip row's facts replaced (a row in $CPPLAN_CHIP_DIR
    overrides the cited one, as a measured row does)."""
    name = plan.topology.split(":")[0]
    row = {**json.loads((CHIP_DIR / f"{name}.json").read_text()), **facts}
    directory = tmp_path / str(len(list(tmp_path.iterdir())))  # one directory a call
    directory.mkdir()
    (directory / f"{name}.json").write_text(json.dumps(row))
    monkeypatch.setenv(CHIP_DIR_ENV, str(directory))
    return estimate(plan, target=target).hbm_bytes


def test_the_price_reads_the_facts_from_the_row(monkeypatch, tmp_path):
    # all-gather over context with the attention output recomputed and out_proj kept ("minimal"):
    # the MLP side holds the recomputed attention only where the row says the compiler runs it first;
    # the head's update (with its gradient stacked by vocabulary piece, as priced for MaxText) holds
    # new buffers only where the row says layouts move off the TensorCore; cpplan's moves none
    plan = Plan(
        model=get_model("llama3.1-8b"),
        topology="v5p:2x2x2",
        seq_len=32 * 1024,
        global_batch=2,
        mesh=make_mesh(context=4, fsdp=2),
        cp_strategy="all_gather",
        remat="minimal",
        load_balance="zigzag",
    )
    base = _hbm_with(monkeypatch, tmp_path, plan, relayout_off_tensorcore=False, attention_before_mlp_backward=False)
    early = _hbm_with(monkeypatch, tmp_path, plan, relayout_off_tensorcore=False, attention_before_mlp_backward=True)
    moved = _hbm_with(monkeypatch, tmp_path, plan, relayout_off_tensorcore=True, attention_before_mlp_backward=False)
    assert early["mlp_working_set"] > base["mlp_working_set"]
    assert moved["optimizer_update"] == base["optimizer_update"] == 0
    stacked = {
        facts: _hbm_with(
            monkeypatch, tmp_path, plan, "maxtext", relayout_off_tensorcore=facts, attention_before_mlp_backward=False
        )["optimizer_update"]
        for facts in (False, True)
    }
    assert stacked[True] > stacked[False] > 0
    # the lane-wide log-sum-exp is held only where the attention runs again ahead of the MLP's
    # backward because the policy recomputes the out projection too (full), not under minimal
    for remat, grows in (("full", True), ("minimal", False)):
        policy = dataclasses.replace(plan, remat=remat)
        sliced, lanes = (
            _hbm_with(
                monkeypatch,
                tmp_path,
                policy,
                relayout_off_tensorcore=False,
                attention_before_mlp_backward=False,
                splash_lse_lanes_held=held,
            )["mlp_working_set"]
            for held in (False, True)
        )
        assert (lanes > sliced) is grows and lanes >= sliced
    assert early["optimizer_update"] == base["optimizer_update"] and moved["mlp_working_set"] == base["mlp_working_set"]


@pytest.mark.parametrize("tensor", [1, 2, 4, 8])
def test_the_reduce_scatter_scratch_is_its_share_of_the_input_gradient(monkeypatch, tmp_path, tensor):
    # tensor-parallel over the sequence between the matmuls: each side's backward scatters the layer
    # input's gradient (every token of the tensor group, bf16) back over tensor; the SparseCore's
    # scratch is (n - 2)/n of it: over 8 devices at 16K tokens, 16384 x 4096 x 2 B x 6/8 = 96 MiB
    plan = Plan(
        model=get_model("llama3.1-8b"),
        topology="tpu7x:2x2x1",
        seq_len=16 * 1024,
        global_batch=8 // tensor,
        mesh=make_mesh(fsdp=8 // tensor, tensor=tensor),
        cp_strategy="none",
        remat="full",
    )
    off, on = (_hbm_with(monkeypatch, tmp_path, plan, reduce_scatter_scratch=held) for held in (False, True))
    scratch = {1: 0, 2: 0, 4: 16384 * 4096 * 2 // 2, 8: 96 * 2**20}[tensor]
    for side in ("attention_working_set", "mlp_working_set"):
        assert on[side] - off[side] == pytest.approx(scratch)
    assert {k: v for k, v in on.items() if not k.endswith("working_set")} == {
        k: v for k, v in off.items() if not k.endswith("working_set")
    }
