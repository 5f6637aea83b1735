"""MaxText's `grad_dtype`: the weight gradients cast from fp32 (bf16 in DeepSeek-V3's recipe, whose
compiled backward loop carries its layer-gradient stacks in bf16: docs/moe_compiled.md, Run C), read into a
plan, written back, and priced at its bytes."""

import dataclasses

import pytest

from cost_models.errors import CpplanError
from cost_models.pricing.memory import layer_gradient_bytes
from planner.estimate import candidates_of, estimate
from planner.maxtext import export_maxtext, read_maxtext
from planner.plan import Plan

pytestmark = pytest.mark.pure

LLAMA = (
    "model_name=llama3.1-8b per_device_batch_size=1 max_target_length=8192 ici_fsdp_parallelism=-1 "
    "compile_topology=v5p-16"
)


def test_read_written_and_round_tripped():
    plan = read_maxtext(LLAMA + " grad_dtype=bfloat16").plan
    assert plan.grad_dtype == "bfloat16"
    assert export_maxtext(plan).flags["grad_dtype"] == "bfloat16"
    assert Plan.from_dict(plan.to_dict()).grad_dtype == "bfloat16"
    default = read_maxtext(LLAMA).plan
    assert default.grad_dtype == "" and "grad_dtype" not in export_maxtext(default).flags
    assert "grad_dtype" not in default.to_dict()
    # the parameters' own dtype is spelled one way
    assert dataclasses.replace(default, grad_dtype="float32").grad_dtype == ""


def test_bf16_gradients_halve_their_bytes():
    fp32 = read_maxtext(LLAMA).plan
    bf16 = dataclasses.replace(fp32, grad_dtype="bfloat16")
    x32, x16 = candidates_of(fp32), candidates_of(bf16)
    # every layer's parameters over the 8 fsdp devices of v5p-16 (8 chips), 4 then 2 bytes each
    layers = 32 * fp32.model.params_per_layer / 8
    assert float(layer_gradient_bytes(x32)[0]) == pytest.approx(layers * 4)
    assert float(layer_gradient_bytes(x16)[0]) == pytest.approx(layers * 2)
    saved = (
        estimate(fp32, target="maxtext").hbm_bytes["update_gradients"]
        + estimate(fp32, target="maxtext").hbm_bytes["layer_grads"]
    )
    halved = (
        estimate(bf16, target="maxtext").hbm_bytes["update_gradients"]
        + estimate(bf16, target="maxtext").hbm_bytes["layer_grads"]
    )
    assert halved < saved


def test_bad_grad_dtype_refused():
    with pytest.raises(CpplanError, match="grad_dtype='int8'"):
        read_maxtext(LLAMA + " grad_dtype=int8")
    with pytest.raises(CpplanError, match="grad_dtype"):
        dataclasses.replace(read_maxtext(LLAMA).plan, grad_dtype="int8")
