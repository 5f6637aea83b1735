"""MaxText as a target: its price, its rules in the search, and its flags out and in."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from cost_models.errors import CpplanError
from cost_models.models import MODELS, DecoderBlock
from cost_models.pricing.memory import PACKED_PLACEMENT_FLAG
from cost_models.pricing.target import vocab_tiles
from cost_models.strategies.base import maxtext_local_layers_problem
from cost_models.targets import Target
from cost_models.units import GiB
from cost_models.vocabulary import CPStrategy, HostState, LoadBalance, Placement, RematPolicy
from planner import Plan
from planner.api import run_search
from planner.estimate import estimate
from planner.maxtext import export_maxtext, format_flags, maxtext_problems, read_maxtext
from planner.plan import make_mesh

pytestmark = pytest.mark.pure

ANCHOR_USP = (
    "python -m maxtext.trainers.pre_train.train_compile base.yml compile_topology=v5p-16 "
    "compile_topology_num_slices=1 model_name=llama3.1-8b max_target_length=131072 "
    "per_device_batch_size=0.125 dataset_type=synthetic attention=flash remat_policy=full "
    "ici_fsdp_parallelism=1 ici_context_parallelism=4 ici_context_usp_ulysses_parallelism=2 "
    "context_parallel_strategy=usp context_parallel_load_balance=False use_tokamax_splash=True"
)


def test_reads_a_maxtext_command_line():
    plan = Plan.from_maxtext(ANCHOR_USP)
    assert plan.topology == "v5p:2x2x2" and plan.seq_len == 131072 and plan.global_batch == 1
    assert plan.cp_strategy is CPStrategy.USP and plan.load_balance is LoadBalance.NONE
    assert plan.mesh_dict == {"data": 1, "fsdp": 1, "context": 4, "context_ulysses": 2, "tensor": 1, "expert": 1}
    assert plan.loss_chunk_tokens == 0  # MaxText's default num_vocab_tiling=1: full logits


def test_prices_the_maxtext_config_and_the_chosen_plan_beats_it():
    from planner.estimate import estimate

    theirs = estimate(Plan.from_maxtext(ANCHOR_USP))
    ours = planner.explain("llama3.1-8b", "128k", "v5p-16", global_batch_tokens="128k").estimate
    assert ours.step_time_s <= theirs.step_time_s
    assert ours.hbm_bytes["logits"] < theirs.hbm_bytes["logits"]  # chunked loss vs full fp32 logits


def test_maxtext_defaults_and_errors():
    plan = Plan.from_maxtext(
        {
            "model_name": "tiny",
            "compile_topology": "v5p-8",
            "max_target_length": 1024,
            "per_device_batch_size": 1,
            "ici_context_parallelism": 2,
            "context_parallel_strategy": "ring",
        }
    )
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
    # (the dq and dK/dV kernels: the fused one's partials, one per key block of 512, would not fit)
    plan = dataclasses.replace(plan, block_q=512, block_kv=512, fused_attention_backward=False)
    assert planner.estimate(plan).fits  # cpplan's own runtime shares one small table across heads
    assert plan.to_maxtext()["sa_block_q"] == 1024


def test_maxtext_context_minus_one_and_unbalanced_ulysses():
    flags = {
        "model_name": "tiny",
        "compile_topology": "v5p-8",
        "max_target_length": 1024,
        "per_device_batch_size": 1,
        "ici_fsdp_parallelism": 1,
        "ici_context_parallelism": -1,
        "context_parallel_strategy": "ring",
    }
    assert Plan.from_maxtext(flags).axis_size("context") == 4
    flags.update(context_parallel_strategy="ulysses")
    with pytest.raises(CpplanError, match="set it to False"):
        Plan.from_maxtext(flags)
    flags.update(context_parallel_load_balance=False, model_name="tiny-mha")
    assert Plan.from_maxtext(flags).axis_size("context_ulysses") == 4
    with pytest.raises(CpplanError, match="per_device_batch_size='abc' is not a number"):
        Plan.from_maxtext({**flags, "per_device_batch_size": "abc"})


def _ring_plan(**changes) -> Plan:
    """llama3.1-8b, ring 4 over v5p-8 at 64K, one sequence, remat full, full logits."""
    base = dict(
        model=MODELS["llama3.1-8b"],
        topology="v5p-8",
        seq_len=65536,
        global_batch=1,
        mesh=make_mesh(context=4),
        cp_strategy="ring",
        load_balance="zigzag",
        remat="full",
        block_q=1024,
        block_kv=1024,
    )
    return Plan(**{**base, **changes})


def test_maxtext_keeps_full_vocabulary_fp32_logits_per_token_tile():
    plan = _ring_plan()
    theirs, ours = estimate(plan, target="maxtext"), estimate(plan)
    tokens = 65536 // 4  # per device
    # 16384 tokens × 128256 vocabulary × 4 bytes = 7.83 GiB, whatever cpplan's runtime does
    assert theirs.hbm_bytes["logits"] == tokens * 128256 * 4
    assert theirs.hbm_bytes["logits"] / GiB == pytest.approx(7.83, abs=0.005)
    assert ours.hbm_bytes["logits"] < theirs.hbm_bytes["logits"] / 4  # cpplan's loss splits the vocabulary too
    # num_vocab_tiling splits the tokens, never the vocabulary: 4096-token chunks are 4 tiles
    tiled = estimate(dataclasses.replace(plan, loss_chunk_tokens=4096), target="maxtext")
    assert tiled.hbm_bytes["logits"] == tokens / 4 * 128256 * 4
    # the loss holds the output head gathered (bf16) and its fp32 gradient: 128256 × 4096 × 6 bytes
    assert theirs.hbm_bytes["head_buffers"] == 128256 * 4096 * 6


def test_maxtext_ring_holds_a_dq_partial_per_key_block():
    plan = _ring_plan(block_q=512, block_kv=512)
    theirs, ours = estimate(plan, target="maxtext"), estimate(plan)
    # f32[16384 / 512 key blocks, 32 heads, 16384 local queries, 128] = 8 GiB more than cpplan's ring,
    # which accumulates dq in place; held around the kernel, on the attention's side of a layer's backward
    partials = 32 * 32 * 16384 * 128 * 4
    assert theirs.hbm_bytes["attention_buffers"] - ours.hbm_bytes["attention_buffers"] == partials == 8 * GiB
    assert theirs.hbm_bytes["activations"] == ours.hbm_bytes["activations"]
    # larger key blocks, fewer partials
    wider = estimate(_ring_plan(block_q=1024, block_kv=1024), target="maxtext").hbm_bytes["attention_buffers"]
    assert theirs.hbm_bytes["attention_buffers"] - wider == 4 * GiB


def test_maxtext_layer_gradients_are_held_in_the_backward_only():
    plan = _ring_plan()
    theirs, ours = estimate(plan, target="maxtext"), estimate(plan)
    model = plan.model
    layer_grads = model.num_layers * model.params_per_layer / 4 * 4  # fp32, sharded over the 4 context ranks
    assert ours.hbm_bytes["layer_grads"] == pytest.approx(layer_grads) and theirs.hbm_bytes["layer_grads"] == 0
    # the loss's input as cpplan's chunked loss holds it was read from cpplan's compiles only
    assert theirs.hbm_bytes["loss_input"] == 0 < ours.hbm_bytes["loss_input"]
    # held whichever side of the layer is live; beside them tokamax's ring is priced with the whole
    # working set (2 · 22528 values a token), cpplan's with its hop's (4 · 4096 + 2 · 4096)
    hop_difference = 16384 * (2 * 22528 - 6 * 4096) * 2
    assert theirs.hbm_bytes["attention_working_set"] - ours.hbm_bytes["attention_working_set"] == pytest.approx(
        layer_grads + hop_difference
    )
    # and MaxText's MLP runs on all 16384 tokens of a device at once (its input-projection outputs and
    # their gradients; its input and the input's gradient are the ones both count for every token), where
    # cpplan's chunk loop runs 4096 at a time (each chunk's input-projection outputs and its copy of the
    # MLP input, and their gradients, bf16) and carries one more matrix, a bf16 gradient sum over the chunks
    tokens, chunk = 16384, 4096
    unchunked = (
        tokens * 2 * 2 * model.intermediate - chunk * 2 * (2 * model.intermediate + model.hidden)
    ) * 2 - model.hidden * model.intermediate * 2
    assert theirs.hbm_bytes["mlp_working_set"] - ours.hbm_bytes["mlp_working_set"] == pytest.approx(
        layer_grads + unchunked
    )
    # MaxText compiled this plan (blocks of 512) to 47.3 GiB per device (train_compile; bench_maxtext)
    assert estimate(
        _ring_plan(block_q=512, block_kv=512), target="maxtext"
    ).hbm_bytes_per_device / GiB == pytest.approx(47.3, rel=0.10)


def test_vocab_tiles_divide_the_tokens():
    assert vocab_tiles(16384, 0) == 1 and vocab_tiles(16384, 16384) == 1
    assert vocab_tiles(16384, 4096) == 4 and vocab_tiles(16384, 5000) == 4
    assert vocab_tiles(24576, 5000) == 6  # 5 does not divide 24576; 6 does
    assert 24576 % vocab_tiles(24576, 5000) == 0


def test_maxtext_target_offers_only_what_maxtext_runs():
    """Ulysses 16 over 8 KV heads: cpplan's runtime replicates KV heads, MaxText refuses it."""
    options = dict(strategies=["ulysses"], mesh={"context_ulysses": 16, "fsdp": 2}, global_batch=2, remat="full")
    ours = run_search("llama3.1-8b", "256k", "v5p:2x4x4", **options)
    theirs = run_search("llama3.1-8b", "256k", "v5p:2x4x4", target="maxtext", **options)
    assert ours.ranked and not theirs.ranked
    assert any(
        r.category == "maxtext" and "num_kv_heads=8 divisible by its degree 16" in r.reason for r in theirs.rejections
    )


def test_usp_with_load_balance_over_an_even_ring_is_accepted():
    """MaxText 0.2.5 accepts USP with context_parallel_load_balance=True when the ring degree is even."""
    flags = ANCHOR_USP.replace("context_parallel_load_balance=False", "context_parallel_load_balance=True")
    plan = Plan.from_maxtext(flags)
    assert plan.cp_strategy is CPStrategy.USP and plan.load_balance is LoadBalance.ZIGZAG
    assert Plan.from_maxtext(plan.to_maxtext()) == plan
    odd = Plan(
        MODELS["tiny-mha"],
        "cpu:12",
        9216,
        1,
        make_mesh(context=3, context_ulysses=4),
        cp_strategy="usp",
        load_balance="zigzag",
    )
    assert any("even ring degree" in p for p in maxtext_problems(odd))
    with pytest.raises(CpplanError, match="even ring degree"):
        odd.to_maxtext()


def test_ulysses_16_over_8_kv_heads_is_refused_on_import():
    flags = (
        "compile_topology=v5p-32 model_name=llama3.1-8b max_target_length=262144 per_device_batch_size=0.0625 "
        "ici_fsdp_parallelism=1 ici_context_parallelism=16 context_parallel_strategy=ulysses "
        "context_parallel_load_balance=False use_tokamax_splash=True"
    )
    with pytest.raises(CpplanError, match="num_kv_heads=8 divisible by its degree 16"):
        Plan.from_maxtext(flags)


def test_import_names_every_flag_it_did_not_read():
    found = read_maxtext(ANCHOR_USP + " steps=20 enable_checkpointing=false base_output_directory=/tmp/x")
    # the flags, then the command line's other words: the program and its config file
    assert found.unread == (
        "steps",
        "enable_checkpointing",
        "base_output_directory",
        "python",
        "-m",
        "maxtext.trainers.pre_train.train_compile",
        "base.yml",
    )
    assert found.notes == ()
    assert "use_tokamax_splash" not in found.unread and "attention" not in found.unread


def test_import_reads_model_overrides_over_maxtext_defaults():
    base = "compile_topology=v5p-8 max_target_length=8192 per_device_batch_size=1 "
    shaped = read_maxtext(base + "base_emb_dim=1024 base_num_decoder_layers=4 attention_bias=true").plan.model
    # the rest are MaxText's base.yml defaults: 16 heads of 128, 16 KV heads, MLP 7168, vocabulary 32000
    assert (
        shaped.hidden,
        shaped.num_layers,
        shaped.num_heads,
        shaped.num_kv_heads,
        shaped.head_dim,
        shaped.intermediate,
        shaped.vocab,
        shaped.qkv_bias,
    ) == (1024, 4, 16, 16, 128, 7168, 32000, True)
    overridden = read_maxtext(base + "model_name=llama3.1-8b base_num_decoder_layers=2").plan.model
    assert overridden == dataclasses.replace(MODELS["llama3.1-8b"], num_layers=2)
    with pytest.raises(CpplanError, match="attention=dot_product"):
        read_maxtext(base + "model_name=llama3.1-8b attention=dot_product")


def test_import_reads_every_splash_block_and_dcn_flags():
    flags = (
        "compile_topology=v5p-8 compile_topology_num_slices=2 model_name=llama3.1-8b max_target_length=8192 "
        "per_device_batch_size=1 dcn_data_parallelism=1 dcn_fsdp_parallelism=2 sa_block_q=1024 "
        "sa_block_kv=1024 sa_block_q_dkv=512"
    )
    found = read_maxtext(flags)
    assert (found.plan.dcn_data, found.plan.dcn_fsdp, found.plan.num_slices) == (1, 2, 2)
    assert (found.plan.block_q, found.plan.block_kv) == (1024, 1024)
    assert found.notes and "sa_block_q_dkv=512" in found.notes[0]
    assert found.unread == ()
    with pytest.raises(CpplanError, match="dcn_context_parallelism=1"):
        read_maxtext(flags + " dcn_context_parallelism=2")


def test_export_keeps_compile_flags_apart_and_says_what_changed():
    plan = planner.plan("llama3.1-8b", "128k", "v5p-16", strategies=["ulysses"], global_batch_tokens="128k")
    plan = dataclasses.replace(plan, block_q=512, block_kv=512)
    exported = export_maxtext(plan)
    assert exported.compile_flags == {"compile_topology": "v5p-16", "compile_topology_num_slices": 1}
    assert not set(exported.compile_flags) & set(exported.flags)
    assert exported.plan.block_q == exported.flags["sa_block_q"] == 1024
    assert any("512×512 → 1024×1024" in note for note in exported.notes)
    # the exported plan is priced with the blocks MaxText runs
    assert estimate(exported.plan, target="maxtext").smem_bytes <= estimate(exported.plan).smem_capacity_bytes


def test_maxtext_waits_for_its_ring_hops_where_cpplan_hides_them():
    """MaxText's compiled ring steps put no kernel between a hop's transfer start and done: the
    MaxText price exposes all the ring's traffic, cpplan's hides part of it behind the attention."""
    plan = planner.plan("llama3.1-8b", "128k", "v5p-16", strategies=["ring"], global_batch_tokens="128k")
    ours, theirs = estimate(plan), estimate(plan, target="maxtext")
    assert theirs.exposed_s["context"] == pytest.approx(theirs.comm_s["context"], rel=1e-9)
    assert ours.exposed_s["context"] < ours.comm_s["context"]


def test_export_writes_the_packed_placement_and_the_scoped_vmem_its_blocks_need():
    plan = planner.plan("llama3.1-8b", "128k", "v5p-16", strategies=["all_gather"], global_batch_tokens="128k")
    wide = export_maxtext(dataclasses.replace(plan, block_q=2048, block_kv=2048))
    assert wide.flags["sa_block_q"] == 2048
    assert wide.libtpu_init_args == f"--xla_tpu_scoped_vmem_limit_kib=65472 {PACKED_PLACEMENT_FLAG}"
    assert any("--xla_tpu_scoped_vmem_limit_kib=65472 in LIBTPU_INIT_ARGS" in note for note in wide.notes)
    narrow = export_maxtext(dataclasses.replace(plan, block_q=1024, block_kv=1024))
    assert narrow.libtpu_init_args == PACKED_PLACEMENT_FLAG  # the placement the memory price assumes, alone
    assert not any("scoped_vmem" in note for note in narrow.notes)


def test_export_carries_model_switches_or_names_what_it_cannot():
    model = dataclasses.replace(MODELS["small"], name="qwen-like", qkv_bias=True, tie_embeddings=True)
    plan = Plan(model, "v5p-8", 8192, 4, make_mesh(fsdp=4))
    exported = export_maxtext(plan)
    assert exported.flags["attention_bias"] is True and exported.flags["logits_via_embedding"] is True
    assert "model_name" not in exported.flags and exported.flags["base_emb_dim"] == 256
    assert any("rope_max_timescale" in note for note in exported.notes)
    back = read_maxtext({**exported.flags, **exported.compile_flags}).plan
    assert dataclasses.replace(back.model, name=model.name) == model


@settings(max_examples=25, deadline=None)
@given(
    model=st.sampled_from(["llama3.1-8b", "tiny", "small", "llama2-7b"]),
    exponent=st.integers(12, 20),
    topology=st.sampled_from(["v5p:2x2x2", "tpu7x:2x2x1", "v5p:2x2x1", "v5p:4x4x4"]),
)
def test_search_under_maxtext_never_yields_a_plan_export_refuses(model, exponent, topology):
    result = run_search(model, 2**exponent, topology, target="maxtext")
    best = list(result.ranked[:8])
    for ranked in best + list(result.best_infeasible):
        assert not maxtext_problems(ranked.plan)
        exported = export_maxtext(ranked.plan)  # never refuses
        if ranked not in best:
            continue
        assert exported.plan == ranked.plan  # the blocks the search chose already fit MaxText's SMEM
        back = read_maxtext({**exported.flags, **exported.compile_flags}).plan
        # the round trip keeps the plan but its placement (MaxText picks the device order) and the loss
        # chunk, which MaxText knows only as a number of token tiles: both price the same
        assert (
            dataclasses.replace(
                back,
                axis_order=ranked.plan.axis_order,
                physical_order=ranked.plan.physical_order,
                loss_chunk_tokens=ranked.plan.loss_chunk_tokens,
            )
            == ranked.plan
        )
        assert estimate(back, target="maxtext").hbm_bytes["logits"] == ranked.estimate.hbm_bytes["logits"]


def test_the_least_unfit_plans_are_plans_that_exist():
    # 1M tokens on four v5p chips: nothing fits, and the offloading preset's layer inputs would take 512 GiB of
    # a 112 GiB host per device, a plan refused outright: the least unfit plans shown are ones export writes
    result = run_search("llama3.1-8b", 2**20, "v5p:2x2x1", target="maxtext")
    assert not result.ranked and result.best_infeasible
    assert any(r.category == "host" for r in result.rejections)
    for ranked in result.best_infeasible:
        ranked.plan.check()
        export_maxtext(ranked.plan)


RING_V5P_16 = (
    "compile_topology=v5p-16 model_name=llama3.1-8b max_target_length=131072 per_device_batch_size=0.125 "
    "ici_fsdp_parallelism=1 ici_context_parallelism=8 context_parallel_strategy=ring use_tokamax_splash=True "
)


def test_import_reads_custom_remat_per_checkpoint_name_and_offload():
    # a tpu-recipes style custom policy: MaxText's fused names spread over ours
    found = read_maxtext(
        RING_V5P_16 + "remat_policy=custom decoder_layer_input=device qkv_proj=offload "
        "context=device mlpwi=remat out_proj=device"
    )
    plan = found.plan
    assert plan.remat is RematPolicy.CUSTOM and found.unread == ()
    assert dict(plan.remat_custom) == {
        "query_proj": Placement.OFFLOAD,
        "key_proj": Placement.OFFLOAD,
        "value_proj": Placement.OFFLOAD,
        "context": Placement.DEVICE,
        "out_proj": Placement.DEVICE,
    }
    assert plan.offloaded == ("query_proj", "key_proj", "value_proj")
    exported = export_maxtext(plan)
    assert exported.flags["remat_policy"] == "custom" and exported.flags["query_proj"] == "offload"
    assert read_maxtext({**exported.flags, **exported.compile_flags}).plan.remat_custom == plan.remat_custom
    # tpu-recipes' Llama 3.1 runs offload each layer's input: read, priced in host memory, exported back
    layer_input = read_maxtext(RING_V5P_16 + "remat_policy=custom decoder_layer_input=offload").plan
    assert layer_input.offloaded == ("decoder_layer_input",)
    assert export_maxtext(layer_input).flags["decoder_layer_input"] == "offload"
    # per-name flags mean nothing to MaxText under a named policy: unread, and said so
    assert read_maxtext(RING_V5P_16 + "remat_policy=full query_proj=device").unread == ("query_proj",)


@pytest.mark.parametrize(
    "policy", ["qkv_proj_offloaded", "minimal_offloaded", "custom decoder_layer_input=offload", "full", "minimal"]
)
def test_export_of_an_offloading_plan_says_it_is_priced_without_the_recipes_compiler_flags(policy):
    exported = export_maxtext(read_maxtext(RING_V5P_16 + f"remat_policy={policy}").plan)
    said = [note for note in exported.notes if "LIBTPU_INIT_ARGS" in note]
    assert len(said) == (1 if "offload" in policy else 0)
    assert all("HOST_OFFLOAD_FLAGS" in note and "priced as compiled without" in note for note in said)
    # compiler flags never travel with the training flags or the compile_topology ones
    assert not any(
        "xla" in str(k).lower() or "libtpu" in str(k).lower() for k in {**exported.flags, **exported.compile_flags}
    )


@pytest.mark.parametrize("policy", ["minimal", "save_qkv_proj", "qkv_proj_offloaded", "full"])
def test_import_reads_maxtexts_named_remat_policies(policy):
    plan = read_maxtext(RING_V5P_16 + f"remat_policy={policy}").plan
    assert plan.remat is RematPolicy.parse(policy)
    assert Plan.from_maxtext(plan.to_maxtext()) == plan


def test_kept_projections_cost_hbm_and_offloaded_ones_do_not():
    full, minimal, saved, offloaded = (
        estimate(read_maxtext(RING_V5P_16 + f"remat_policy={p}").plan, target="maxtext")
        for p in ("full", "minimal", "save_qkv_proj", "qkv_proj_offloaded")
    )
    # q, k, v per token and layer: (32 + 8 + 8) heads × 128 × 2 bytes, 16384 tokens per device, 32 layers
    qkv = 48 * 128 * 2 * 16384 * 32
    assert saved.hbm_bytes["activations"] - full.hbm_bytes["activations"] == pytest.approx(qkv)
    assert offloaded.hbm_bytes["activations"] == full.hbm_bytes["activations"]
    assert minimal.hbm_bytes_per_device > saved.hbm_bytes_per_device


def test_import_reads_mu_dtype_and_state_offload_flags():
    found = read_maxtext(RING_V5P_16 + "mu_dtype=bfloat16 optimizer_memory_host_offload=true")
    assert found.plan.mu_dtype == "bfloat16" and found.unread == ()
    assert found.plan.state_on_host == (HostState.OPTIMIZER,)
    assert read_maxtext(RING_V5P_16 + "weight_dtype=bfloat16").plan.mu_dtype == "bfloat16"  # "" inherits it
    assert export_maxtext(found.plan).flags["mu_dtype"] == "bfloat16"


# PR #4893's scale: 64 v5p chips, all of them on the context axes, as its rows import
PR_SCALE = (
    "model_name=llama3.1-8b max_target_length=65536 per_device_batch_size=0.015625 attention=flash "
    "compile_topology=v5p-128 ici_fsdp_parallelism=1 remat_policy=full use_tokamax_splash=True "
)


@pytest.mark.parametrize("ring, ulysses, split", [(16, 4, False), (8, 8, True), (32, 2, True)])
def test_maxtext_gathers_weights_by_all_reduce_where_the_context_axes_split_a_dimension(ring, ulysses, split):
    """USP 8 × 8 and 32 × 2 on a 4×4×4 torus split a physical dimension between the two context
    axes, and MaxText's compiler gathers their weights as all-reduces (twice the bytes); 16 × 4
    lays each axis on whole dimensions and gathers them. cpplan's own runtime is priced with
    gathers throughout."""
    plan = Plan.from_maxtext(
        PR_SCALE + f"context_parallel_strategy=usp ici_context_parallelism={ring} "
        f"ici_context_usp_ulysses_parallelism={ulysses}"
    )
    ours, theirs = (_weight_traffic(plan, target) for target in (Target.CPPLAN, Target.MAXTEXT))
    assert theirs.weight_gather_s == pytest.approx((2 if split else 1) * ours.weight_gather_s, rel=1e-12)
    assert theirs.backward_gather_s == pytest.approx((2 if split else 1) * ours.backward_gather_s, rel=1e-12)
    assert theirs.head_gather_s == ours.head_gather_s  # the output head is gathered outside the layers


def _weight_traffic(plan: Plan, target: Target):
    """The plan's per-layer weight collectives as `target`'s compiler makes them (no context traffic)."""
    from cost_models.pricing.communication import ContextTraffic, price_traffic
    from cost_models.pricing.matmul import price_matmuls
    from planner.estimate import candidates_of

    x = candidates_of(plan)
    zero = np.zeros(1)
    return price_traffic(x, price_matmuls(x).weight_bytes, ContextTraffic(zero, zero, zero, zero), traits=target.traits)


@pytest.mark.parametrize("strategy", ["all_gather", "ring"])
def test_maxtext_all_reduces_the_gradients_of_what_it_gathers_over_context(strategy):
    """MaxText reduces the weights' gradients (and all-gather's dK/dV) over the context axes with
    whole all-reduces: twice a reduce-scatter's bytes."""
    plan = Plan.from_maxtext(PR_SCALE + f"context_parallel_strategy={strategy} ici_context_parallelism=64")
    ours_layer, theirs_layer = (_weight_traffic(plan, target) for target in (Target.CPPLAN, Target.MAXTEXT))
    assert theirs_layer.gradient_scatter_s == pytest.approx(2 * ours_layer.gradient_scatter_s, rel=1e-12)
    assert theirs_layer.weight_gather_s == ours_layer.weight_gather_s  # 64 on a 4×4×4 torus: no split
    ours, theirs = estimate(plan), estimate(plan, target="maxtext")
    if strategy == "all_gather":
        # the context family: K/V gathered forward and again for the recomputed forward, their
        # gradients reduced once: 2 gathers + 1 scatter against 2 gathers + 2 scatters (a scatter
        # costs a gather's time)
        assert theirs.comm_s["context"] == pytest.approx(4 / 3 * ours.comm_s["context"], rel=1e-12)


def test_import_reads_which_splash_backward_maxtext_runs():
    """tokamax's splash has only the fused backward; jax's runs it with sa_use_fused_bwd_kernel.
    The strategies MaxText runs on tokamax's splash imply it, so the plan says it only for
    all-gather, and the export writes it back."""
    base = (
        PR_SCALE.replace("use_tokamax_splash=True ", "") + "context_parallel_strategy=all_gather "
        "ici_context_parallelism=64 "
    )
    assert not Plan.from_maxtext(base).fused_attention_backward
    for flag in ("use_tokamax_splash=True", "sa_use_fused_bwd_kernel=true"):
        plan = Plan.from_maxtext(base + flag)
        assert plan.fused_attention_backward
        assert export_maxtext(plan).flags["sa_use_fused_bwd_kernel"] is True
        assert Plan.from_json(plan.to_json()) == plan
        assert Plan.from_maxtext(plan.to_maxtext()) == plan
        # fewer backward kernels on either runtime: cpplan's runs the fused one where the plan says so
        unfused = dataclasses.replace(plan, fused_attention_backward=False)
        for target in ("maxtext", "cpplan"):
            assert (
                estimate(plan, target=target).compute_s["attention"]
                < estimate(unfused, target=target).compute_s["attention"]
            )
    ring = Plan.from_maxtext(PR_SCALE + "context_parallel_strategy=ring ici_context_parallelism=64")
    assert not ring.fused_attention_backward and "sa_use_fused_bwd_kernel" not in export_maxtext(ring).flags
    with pytest.raises(CpplanError, match="fused_attention_backward='yes' must be true or false"):
        dataclasses.replace(ring, fused_attention_backward="yes")


def test_a_fit_inside_the_memory_price_s_measured_error_is_marginal():
    """tpu7x-16 all-gather at 128K for MaxText is priced at 93.4 of 94.7 GiB, where MaxText's compiler
    needs 102.6 GiB: within the memory price's measured excess on tpu7x (its compiles of
    validation.anchors), so it is reported as marginal, not as fitting."""
    from cost_models.accuracy import memory_band

    best = planner.explain(
        "llama3.1-8b",
        "128k",
        "tpu7x-16",
        strategies=["all_gather"],
        remat=["full", "save_dot_except_mlp", "minimal_with_context"],
        target="maxtext",
    ).estimate
    assert best.hbm_bytes_per_device / GiB == pytest.approx(93.4, abs=0.05)
    margin = memory_band("tpu7x", "maxtext").under
    assert best.memory_margin == margin > 0
    assert best.fits and best.hbm_bytes_per_device * (1 + margin) > best.hbm_capacity_bytes
    assert best.marginal and best.verdict == "fits, marginally"
    roomy = dataclasses.replace(best, memory_margin=0.0)
    assert not roomy.marginal and roomy.verdict == "fits"


def test_a_misfit_inside_the_memory_price_s_measured_error_is_marginal():
    """The other side of the band: a plan priced over the capacity by less than the most the price has
    said beyond what the compiler needed (on v5p, MaxText's anchors) may fit, and is reported as
    marginal, not as failing; priced further over, it does not fit."""
    from cost_models.accuracy import memory_band

    best = planner.explain("llama3.1-8b", "128k", "v5p-16", strategies=["all_gather"], target="maxtext").estimate
    over = memory_band("v5p", "maxtext").over
    assert best.memory_overprice == over > 0
    priced = best.hbm_bytes_per_device
    near = dataclasses.replace(best, hbm_capacity_bytes=priced / (1 + over / 2))
    assert not near.fits and near.marginal and near.verdict == "does not fit, marginally"
    assert f"{over:.1%} more than the compiler needed" in near.marginal_reason
    far = dataclasses.replace(best, hbm_capacity_bytes=priced / (1 + 2 * over))
    assert not far.marginal and far.verdict == "does not fit" and far.marginal_reason == ""


def _masked_plan(model, strategy: str, mesh: dict, *, seq_len: int = 32768) -> Plan:
    return Plan(model, "v5p-16", seq_len, 8, make_mesh(**mesh), cp_strategy=strategy, load_balance="none")


WINDOWLESS = "max_target_length=32768 per_device_batch_size=1"
GEMMA_FLAGS = (
    "model_name=gemma3-12b override_model_config=True base_num_decoder_layers=48 base_emb_dim=3840 "
    "base_num_query_heads=16 base_num_kv_heads=8 head_dim=256 base_mlp_dim=15360 vocab_size=262208 "
    "attention_bias=False logits_via_embedding=True mlp_activations='[gelu,linear]' decoder_block=gemma3 "
    "sliding_window_size=1024"
)


def test_gemma3_style_layers_travel_as_maxtexts_gemma3_block_and_back():
    plan = _masked_plan(MODELS["gemma3-12b"], "all_gather", dict(context=2, fsdp=4))
    exported = export_maxtext(plan)
    line = format_flags(exported.flags)
    # cpplan's vocabulary is the published config's 262208, not gemma3-12b.yml's 262144: the flags override it
    assert line.endswith(GEMMA_FLAGS)
    assert "context_parallel_strategy=all_gather context_parallel_load_balance=False" in line
    assert any("gemma3 block" in n and "norms after attention" in n for n in exported.notes)
    found = read_maxtext({**exported.flags, **exported.compile_flags})
    assert found.plan == dataclasses.replace(plan, axis_order=found.plan.axis_order, physical_order=())
    assert found.unread == () and found.notes == ()
    # MaxText's gemma3-12b.yml gives the block and the window when the flags leave them out
    short = read_maxtext(f"model_name=gemma3-12b compile_topology=v5p-16 ici_fsdp_parallelism=8 {WINDOWLESS}")
    assert short.plan.model == MODELS["gemma3-12b"]
    assert read_maxtext(f"{GEMMA_FLAGS.replace('=1024', '=512')} compile_topology=v5p-16").plan.model.window == 512


def test_search_under_maxtext_offers_gemma3_only_what_its_block_runs():
    result = run_search("gemma3-12b", 2**15, "v5p:2x2x2", target="maxtext")
    assert result.ranked
    for ranked in result.ranked[:4]:
        assert ranked.plan.cp_strategy in (CPStrategy.NONE, CPStrategy.ALL_GATHER)
        back = read_maxtext(ranked.plan.to_maxtext()).plan
        assert back.model == ranked.plan.model
    assert any(r.category == "maxtext" and "runs global layers only" in r.reason for r in result.rejections)


MISTRAL = MODELS["mistral-7b-v0.1"]
GEMMA = MODELS["gemma3-12b"]


@pytest.mark.parametrize(
    "model, strategy, mesh, match",
    [
        (
            MISTRAL,
            "all_gather",
            dict(context=2, fsdp=4),
            r"sliding_window of 4096 tokens\) on every layer.*only in its gemma3",
        ),
        (dataclasses.replace(GEMMA, layer_pattern="LG"), "none", dict(fsdp=8), r"in the pattern 'LG'.*'LLLLLG'"),
        (dataclasses.replace(GEMMA, local_kind="chunked"), "none", dict(fsdp=8), "chunked layers only in its llama4"),
        (dataclasses.replace(GEMMA, decoder_block="default"), "none", dict(fsdp=8), "is sequential, not the parallel"),
        (GEMMA, "ring", dict(context=8), "ring runs global layers only"),
        (GEMMA, "ulysses", dict(context_ulysses=8), "ulysses runs global layers only"),
        (GEMMA, "usp", dict(context=2, context_ulysses=4), "usp runs global layers only"),
        (dataclasses.replace(MODELS["llama3.1-8b"], documents=8192), "all_gather", dict(context=8), "jax's splash"),
        (dataclasses.replace(MODELS["llama3.1-8b"], documents=8192), "ring", dict(context=8), "around the whole ring"),
    ],
)
def test_export_refuses_masks_maxtext_does_not_run_and_says_why(model, strategy, mesh, match):
    plan = _masked_plan(model, strategy, mesh)
    with pytest.raises(CpplanError, match=match):
        export_maxtext(plan)
    # the same rule the search applies under the MaxText target
    assert maxtext_problems(plan)


def test_packed_documents_leave_the_layer_pattern_maxtexts_block_runs():
    # packed, a global layer is causal within each document (a chunk) but still a global layer: the
    # gemma3 block runs the pattern, and what MaxText's kernel lacks is only the documents
    packed = dataclasses.replace(GEMMA, documents=8192)
    assert packed.global_mask.local and packed.layer_type(5) == "G"
    assert maxtext_local_layers_problem(packed) is None
    with pytest.raises(CpplanError, match="jax's splash") as refused:
        export_maxtext(_masked_plan(packed, "all_gather", dict(context=8)))
    assert "pattern" not in str(refused.value) and "every layer" not in str(refused.value)


def test_packed_documents_travel_as_packing_under_ulysses():
    packed = dataclasses.replace(MODELS["llama3.1-8b"], documents=8192)
    plan = _masked_plan(packed, "ulysses", dict(context_ulysses=8))
    exported = export_maxtext(plan)
    assert exported.flags["model_name"] == "llama3.1-8b" and exported.flags["packing"] is True
    assert "base_emb_dim" not in exported.flags  # MaxText ships the model: the documents are the data's
    assert any("documents of 8192 tokens each" in n for n in exported.notes)
    flags = {**exported.flags, **exported.compile_flags}
    # no flag holds the documents' length: the model given holds it, the flags alone read whole rows
    assert read_maxtext(flags, model=packed).plan == dataclasses.replace(plan, physical_order=())
    alone = read_maxtext(flags)
    assert alone.plan.model == MODELS["llama3.1-8b"]
    assert any("packing=True packs the data's own documents" in n for n in alone.notes)
    with pytest.raises(CpplanError, match="packing=False attends across each whole row"):
        read_maxtext({**flags, "packing": False}, model=packed)


def test_import_reads_the_window_where_maxtexts_block_runs_it():
    base = "compile_topology=v5p-16 ici_fsdp_parallelism=8 " + WINDOWLESS
    # llama2's block passes its own global type: the window flag changes nothing, and is read as such
    found = read_maxtext(f"model_name=llama3.1-8b sliding_window_size=4096 {base}")
    assert found.plan.model == MODELS["llama3.1-8b"] and "sliding_window_size" not in found.unread
    assert any("attends globally in every layer" in n for n in found.notes)
    # gemma3-12b under MaxText's llama2 block: its layers attend globally, in that block, with no q/k norms
    plain = read_maxtext(f"model_name=gemma3-12b decoder_block=llama2 override_model_config=True {base}")
    as_llama2 = {"decoder_block": DecoderBlock.LLAMA2, "qk_norm": False}
    assert plain.plan.model == dataclasses.replace(MODELS["gemma3-12b"].all_global(), **as_llama2)
    # under its own block, Gemma 3's: four norms a layer and q/k norms
    own = read_maxtext(f"model_name=gemma3-12b {base}")
    assert own.plan.model == MODELS["gemma3-12b"] and own.plan.model.decoder_block is DecoderBlock.GEMMA3
    with pytest.raises(CpplanError, match="decoder_block=gemma3 with model_name=default"):
        read_maxtext(f"decoder_block=gemma3 base_emb_dim=1024 {base}")
    with pytest.raises(CpplanError, match="sliding_window_size=0: the gemma3 block's local layers"):
        read_maxtext(f"model_name=gemma3-12b sliding_window_size=0 {base}")
    with pytest.raises(CpplanError, match="ring runs global layers only"):
        read_maxtext(
            f"model_name=gemma3-12b compile_topology=v5p-16 ici_fsdp_parallelism=1 ici_context_parallelism=8 "
            f"context_parallel_strategy=ring context_parallel_load_balance=False use_tokamax_splash=True {WINDOWLESS}"
        )


def test_cli_refuses_up_front_a_model_no_maxtext_block_runs(capsys):
    from cli import main

    assert main(["export", "--model", "mistral-7b-v0.1", "--seq-len", "4k", "--topology", "v5p:2x2x1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cpplan: error: --format maxtext with --model mistral-7b-v0.1: ")
    assert "on every layer" in err and "--format json writes the plan" in err


def test_from_maxtext_refuses_a_stray_word_but_reads_the_command_line():
    # the README's line run literally: the `...` would otherwise be dropped without a word
    with pytest.raises(CpplanError, match=r"'\.\.\.'"):
        planner.Plan.from_maxtext("compile_topology=v5p-16 model_name=llama3.1-8b ...")
    command = "python3 -m maxtext.trainers.pre_train.train src/maxtext/configs/base.yml"
    plan = planner.Plan.from_maxtext(f"{command} compile_topology=v5p-16 model_name=llama3.1-8b max_target_length=8192")
    assert (plan.topology, plan.seq_len) == ("v5p:2x2x2", 8192)


LONG_CONTEXT_RECIPE = (
    "model_name=llama3.1-8b override_model_config=true head_dim=256 base_num_query_heads=16 base_num_kv_heads=4 "
    "compile_topology=v5p-128 max_target_length=1048576 per_device_batch_size=0.03125 ici_context_parallelism=64 "
    "ici_fsdp_parallelism=1 context_parallel_strategy=ring use_tokamax_splash=true use_jax_splash=false "
    "ring_scan_unroll=16 dq_reduction_steps=3 param_scan_axis=1 dataset_type=synthetic attention=flash"
)


def test_the_long_context_recipes_flags_are_read_and_dq_reduction_steps_round_trips():
    found = planner.maxtext.read_maxtext(f"{LONG_CONTEXT_RECIPE} --xla_tpu_dvfs_p_state=5")
    for flag in ("dq_reduction_steps", "ring_scan_unroll", "use_jax_splash", "param_scan_axis", "dataset_type"):
        assert flag not in found.unread
    assert any("--xla_tpu_dvfs_p_state=5" in n and "not modelled" in n for n in found.notes)
    assert found.plan.dq_reduction_steps == 3
    assert planner.Plan.from_json(found.plan.to_json()) == found.plan
    assert planner.maxtext.export_maxtext(found.plan).flags["dq_reduction_steps"] == 3
    with pytest.raises(CpplanError, match="dq_reduction_steps=2: tokamax's fused backward accepts only 3"):
        planner.maxtext.read_maxtext(LONG_CONTEXT_RECIPE.replace("dq_reduction_steps=3", "dq_reduction_steps=2"))


def test_rolled_dq_partials_by_hand():
    # 1M over ring 64 with load balancing: a ring block of 16384 keys in blocks of 1024 is 16 key blocks;
    # without reduction steps 16 fp32 partials of the ring block's queries, with them 3 in bf16
    found = planner.maxtext.read_maxtext(LONG_CONTEXT_RECIPE + " sa_block_q=1024 sa_block_kv=1024")
    rolled = planner.estimate(found.plan, target="maxtext").hbm_bytes["attention_buffers"]
    unrolled_plan = dataclasses.replace(found.plan, dq_reduction_steps=0)
    unrolled = planner.estimate(unrolled_plan, target="maxtext").hbm_bytes["attention_buffers"]
    queries = 2 * 16 * 16384 * 256  # 2 sequences a device, 16 heads, the ring block's queries, heads of 256
    assert unrolled - rolled == pytest.approx(queries * (16 * 4 - 3 * 2))


def test_a_negative_maxtext_count_is_refused_by_its_rule():
    with pytest.raises(CpplanError, match=r"ici_fsdp_parallelism='-2' must be 0 or more"):
        read_maxtext("model_name=llama3.1-8b compile_topology=v5p-8 ici_fsdp_parallelism=-2")
    with pytest.raises(CpplanError, match=r"max_target_length='1.5' must be a whole number"):
        read_maxtext("model_name=llama3.1-8b compile_topology=v5p-8 max_target_length=1.5")
