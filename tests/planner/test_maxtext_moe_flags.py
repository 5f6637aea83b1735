"""MaxText's flags of the mixture-of-experts and fp8 recipes read into plans: the axes that shard weights
as fsdp does folded into fsdp and named, the quantization read or refused by name, model names that are
another model's shape under other sharding rules, and the gpt_oss block's local layers kept."""

import pytest

from cost_models.errors import CpplanError
from cost_models.vocabulary import Quantization
from planner.maxtext import export_maxtext, read_maxtext

pytestmark = pytest.mark.pure

BASE = "model_name=deepseek3-671b per_device_batch_size=2 max_target_length=4096 compile_topology=tpu7x-512"


def test_a_second_fsdp_axis_is_folded_into_fsdp_and_named():
    read = read_maxtext(BASE + " ici_fsdp_parallelism=-1 ici_fsdp_transpose_parallelism=2")
    assert read.plan.mesh_dict["fsdp"] == 512
    assert any("ici_fsdp_transpose_parallelism=2 priced as fsdp" in n for n in read.notes)
    read = read_maxtext(BASE + " ici_fsdp_parallelism=16 ici_fsdp_transpose_parallelism=-1")
    assert read.plan.mesh_dict["fsdp"] == 512


def test_expert_parallelism_reads_into_the_expert_axis_and_exports_back():
    read = read_maxtext(BASE + " ici_fsdp_parallelism=-1 ici_expert_parallelism=4")
    assert read.plan.mesh_dict["fsdp"] == 128 and read.plan.mesh_dict["expert"] == 4
    assert not any("ici_expert_parallelism" in n for n in read.notes)
    flags = export_maxtext(read.plan).flags
    assert flags["ici_expert_parallelism"] == 4 and flags["ici_fsdp_parallelism"] == 128
    again = read_maxtext(" ".join(f"{k}={v}" for k, v in flags.items()) + " compile_topology=tpu7x-512")
    assert again.plan.mesh_dict == read.plan.mesh_dict
    # -1 on the expert axis: the rest of the devices
    assert read_maxtext(BASE + " ici_fsdp_parallelism=8 ici_expert_parallelism=-1").plan.mesh_dict["expert"] == 64


def test_expert_parallelism_maxtext_refuses_or_plans_as_fsdp():
    # 256 experts do not split over 3 devices of the expert axis (MaxText's num_experts // EP experts a device)
    with pytest.raises(CpplanError, match="expert=3 does not divide num_experts=256.*layers/moe.py"):
        read_maxtext(
            "model_name=deepseek3-671b per_device_batch_size=3 max_target_length=4096 compile_topology=tpu7x-384 "
            "ici_fsdp_parallelism=-1 ici_expert_parallelism=3"
        )
    # a dense model's expert axis is another fsdp, as MaxText's rules shard it
    read = read_maxtext(
        "model_name=llama3.1-70b per_device_batch_size=1 max_target_length=8192 compile_topology=tpu7x-128 "
        "ici_fsdp_parallelism=-1 ici_expert_parallelism=4"
    )
    assert read.plan.mesh_dict["fsdp"] == 128 and read.plan.mesh_dict["expert"] == 1
    assert any("ici_expert_parallelism=4 on model 'llama3.1-70b', which has no experts" in n for n in read.notes)
    assert "ici_expert_parallelism" not in export_maxtext(read.plan).flags


def test_quantization_is_read_or_refused_by_name():
    assert read_maxtext(BASE + " quantization=fp8_full").plan.quantization is Quantization.FP8_FULL
    assert read_maxtext(BASE).plan.quantization is Quantization.NONE
    with pytest.raises(CpplanError, match="quantization='int8'.*int8 is not priced"):
        read_maxtext(BASE + " quantization=int8")


def test_fp8_on_a_chip_without_an_fp8_peak_is_refused():
    from planner import explain

    with pytest.raises(CpplanError, match="chip v5e has no fp8 matmul peak"):
        explain("llama3.2-1b", "8k", "v5e:2x2", quantization="fp8_full")
    # v5p's row gives fp8 at its bf16 rate (the docs' table): accepted, no faster
    bf16 = explain("llama3.1-8b", "8k", "v5p-16").best
    fp8 = explain("llama3.1-8b", "8k", "v5p-16", quantization="fp8_full", global_batch=bf16.global_batch).best
    assert fp8.quantization is Quantization.FP8_FULL


def test_model_aliases_and_capacity_notes():
    read = read_maxtext(BASE.replace("deepseek3-671b", "deepseek3-671b-2dfsdp") + " capacity_factor=1.25")
    assert read.plan.model.name == "deepseek3-671b"
    assert any("2-D FSDP sharding rules" in n for n in read.notes)
    assert any("capacity_factor=1.25: acts on the dense path only" in n for n in read.notes)


def test_gpt_oss_keeps_its_alternating_sliding_window():
    read = read_maxtext(
        "model_name=gpt-oss-20b per_device_batch_size=1 max_target_length=8192 compile_topology=tpu7x-16"
    )
    assert read.plan.model.window == 128 and read.plan.model.layer_pattern == "LG"


def test_models_maxtext_ships_export_by_name_with_their_flags():
    from cost_models.models import ModelSpec
    from planner import explain
    from planner.maxtext import export_maxtext, read_maxtext

    plan = explain("qwen3-30b-a3b", "4k", "tpu7x-128", quantization="fp8_full").best
    flags = export_maxtext(plan).flags
    assert flags["model_name"] == "qwen3-30b-a3b" and flags["quantization"] == "fp8_full"
    assert flags["sparse_matmul"] is True and flags["capacity_factor"] == -1
    # the flags read back as the plan
    back = read_maxtext({**flags, **export_maxtext(plan).compile_flags}).plan
    assert (back.model, back.mesh, back.quantization) == (plan.model, plan.mesh, plan.quantization)
    # a config of a shipped model's shape goes by that name
    config = ModelSpec.from_hf_config("tests/testdata/hf_configs/mixtral-8x7b.json")
    mixtral = explain(config, "4k", "tpu7x-128").best
    assert export_maxtext(mixtral).flags["model_name"] == "mixtral-8x7b"


def test_a_moe_model_maxtext_does_not_ship_is_refused_with_why():
    import dataclasses

    from cost_models.models import MODELS
    from planner import explain
    from planner.maxtext import export_maxtext

    other = dataclasses.replace(MODELS["qwen3-30b-a3b"], name="my-moe", num_layers=24)
    plan = explain(other, "4k", "tpu7x-128").best
    with pytest.raises(CpplanError, match="model 'my-moe' has experts, q/k norms, which MaxText's shape flags"):
        export_maxtext(plan)
