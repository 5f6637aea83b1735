"""MaxText flags: the configurations of docs/measurements.md read back and priced."""
import dataclasses

import pytest

import planner
from cost_models.errors import CpplanError
from cost_models.vocabulary import CPStrategy, LoadBalance
from planner import Plan

pytestmark = pytest.mark.pure

ANCHOR_USP = ("python -m maxtext.trainers.pre_train.train_compile base.yml compile_topology=v5p-16 "
              "compile_topology_num_slices=1 model_name=llama3.1-8b max_target_length=131072 "
              "per_device_batch_size=0.125 dataset_type=synthetic attention=flash remat_policy=full "
              "ici_fsdp_parallelism=1 ici_context_parallelism=4 ici_context_usp_ulysses_parallelism=2 "
              "context_parallel_strategy=usp context_parallel_load_balance=False use_tokamax_splash=True")


def test_reads_a_maxtext_command_line():
    plan = Plan.from_maxtext(ANCHOR_USP)
    assert plan.topology == "v5p:2x2x2" and plan.seq_len == 131072 and plan.global_batch == 1
    assert plan.cp_strategy is CPStrategy.USP and plan.load_balance is LoadBalance.NONE
    assert plan.mesh_dict == {"data": 1, "fsdp": 1, "context": 4, "context_ulysses": 2, "tensor": 1}
    assert plan.loss_chunk_tokens == 0  # MaxText's default num_vocab_tiling=1: full logits


def test_prices_the_maxtext_config_and_the_chosen_plan_beats_it():
    from planner.estimate import estimate

    theirs = estimate(Plan.from_maxtext(ANCHOR_USP))
    ours = planner.explain("llama3.1-8b", "128k", "v5p-16", global_batch_tokens="128k").estimate
    assert ours.step_time_s <= theirs.step_time_s
    assert ours.hbm_bytes["logits"] < theirs.hbm_bytes["logits"]  # chunked loss vs full fp32 logits


def test_maxtext_defaults_and_errors():
    plan = Plan.from_maxtext({"model_name": "tiny", "compile_topology": "v5p-8", "max_target_length": 1024,
                              "per_device_batch_size": 1, "ici_context_parallelism": 2,
                              "context_parallel_strategy": "ring"})
    assert plan.mesh_dict["fsdp"] == 2  # MaxText's ici_fsdp_parallelism=-1 takes the rest
    assert plan.load_balance is LoadBalance.ZIGZAG  # MaxText balances by default
    with pytest.raises(CpplanError, match="no topology"):
        Plan.from_maxtext({"model_name": "tiny"})
    with pytest.raises(CpplanError, match="Did you mean 'ring'"):
        Plan.from_maxtext({"model_name": "tiny", "compile_topology": "v5p-8", "context_parallel_strategy": "rng"})
    with pytest.raises(CpplanError, match="covers 8 devices; v5p:2x2x1 has 4"):
        Plan.from_maxtext({"model_name": "tiny", "compile_topology": "v5p-8", "ici_fsdp_parallelism": 8})


def test_export_grows_splash_blocks_where_maxtext_metadata_needs_it():
    # docs/measurements.md: MaxText's Ulysses 8 at 128K overflows SMEM with blocks of 512 and fits with 1024
    plan = planner.plan("llama3.1-8b", "128k", "v5p-16", strategies=["ulysses"], global_batch_tokens="128k")
    plan = dataclasses.replace(plan, block_q=512, block_kv=512)
    assert planner.estimate(plan).fits  # cpplan's own runtime shares one small table across heads
    assert plan.to_maxtext()["sa_block_q"] == 1024


def test_maxtext_context_minus_one_and_unbalanced_ulysses():
    flags = {"model_name": "tiny", "compile_topology": "v5p-8", "max_target_length": 1024, "per_device_batch_size": 1,
             "ici_fsdp_parallelism": 1, "ici_context_parallelism": -1, "context_parallel_strategy": "ring"}
    assert Plan.from_maxtext(flags).axis_size("context") == 4
    flags.update(context_parallel_strategy="ulysses")
    with pytest.raises(CpplanError, match="set it to False"):
        Plan.from_maxtext(flags)
    flags.update(context_parallel_load_balance=False)
    assert Plan.from_maxtext(flags).axis_size("context_ulysses") == 4
    with pytest.raises(CpplanError, match="per_device_batch_size='abc' is not a number"):
        Plan.from_maxtext({**flags, "per_device_batch_size": "abc"})
