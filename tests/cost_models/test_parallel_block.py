"""MaxText's parallel decoder block (`ModelSpec.decoder_block`, MaxText's `decoder_block=default`):
validated by name, priced from one place (one norm, no out-projection value for a second norm,
one gather and one reduce-scatter over tensor per layer forward, a lighter elementwise pass),
read and written as MaxText's flag, and the block the corpus's 2023 synthetic models ran."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from cost_models.errors import CpplanError
from cost_models.models import MODELS, DecoderBlock, ModelSpec
from cost_models.remat import CHECKPOINTS, is_read, recomputed, remat_code, remat_table
from cost_models.units import GiB
from cost_models.vocabulary import RematPolicy
from cost_models.work_layout import tensor_collectives_per_layer, weight_arrays_per_layer
from planner import Plan, make_mesh
from planner.estimate import estimate
from planner.maxtext import export_maxtext, read_maxtext
from validation.corpus import LLAMA2_BLOCK_DEFAULT_SINCE, read_corpus, synthetic_shape

pytestmark = pytest.mark.pure
ROOT = Path(__file__).resolve().parents[2]
SEQUENTIAL = MODELS["llama3.1-8b"]
PARALLEL = dataclasses.replace(SEQUENTIAL, name="llama3.1-8b-parallel", decoder_block="default")
FLAGS = "compile_topology=v5p-16 max_target_length=8192 per_device_batch_size=1"


def test_the_block_is_validated_by_maxtexts_names():
    assert SEQUENTIAL.decoder_block is DecoderBlock.LLAMA2 and not SEQUENTIAL.decoder_block.parallel
    assert PARALLEL.decoder_block is DecoderBlock.DEFAULT and PARALLEL.decoder_block.parallel
    assert dataclasses.replace(SEQUENTIAL, decoder_block="parallel").decoder_block is DecoderBlock.DEFAULT
    with pytest.raises(CpplanError, match="decoder block 'palm'.*llama2: the sequential"):
        dataclasses.replace(SEQUENTIAL, decoder_block="palm")
    with pytest.raises(CpplanError, match="decoder_block=2 must be a name"):
        dataclasses.replace(SEQUENTIAL, decoder_block=2)
    assert PARALLEL.to_dict()["decoder_block"] == "default"
    assert ModelSpec.from_dict(PARALLEL.to_dict()) == PARALLEL
    plan = Plan(model=PARALLEL, topology="v5p-16", seq_len=8192, global_batch=8, mesh=make_mesh(fsdp=8))
    assert Plan.from_json(plan.to_json()) == plan


def test_one_norm_scale_per_layer():
    assert SEQUENTIAL.num_params - PARALLEL.num_params == SEQUENTIAL.num_layers * SEQUENTIAL.hidden
    assert weight_arrays_per_layer(SEQUENTIAL) == 9 and weight_arrays_per_layer(PARALLEL) == 8


def test_remat_table_keeps_no_out_projection_for_a_second_norm():
    out_proj = next(c for c in CHECKPOINTS if c.name == "out_proj")
    assert is_read(out_proj, SEQUENTIAL) and not is_read(out_proj, PARALLEL)
    seq, par = remat_table(SEQUENTIAL), remat_table(PARALLEL)
    minimal, full = remat_code(RematPolicy.MINIMAL), remat_code(RematPolicy.FULL)
    # minimal keeps every matmul output the backward reads: the parallel block's out projection is not one
    assert seq.saved_on_device[minimal] - par.saved_on_device[minimal] == SEQUENTIAL.hidden
    assert seq.saved_on_device[full] == par.saved_on_device[full] == SEQUENTIAL.hidden  # the layer input
    # full remat does not run the out projection again: nothing reads it
    assert "out_proj" in recomputed(RematPolicy.FULL) and "out_proj" not in recomputed(RematPolicy.FULL, model=PARALLEL)
    h, k = SEQUENTIAL.num_heads * SEQUENTIAL.head_dim, SEQUENTIAL.num_kv_heads * SEQUENTIAL.head_dim
    assert par.recompute_qkv_out[full] == pytest.approx((h + 2 * k) / (h + 2 * k + h))
    assert seq.recompute_qkv_out[full] == 1.0 and seq.recompute_mlp[full] == par.recompute_mlp[full]
    # recomputation repeats the one gather of the normed input; the summed output is never scattered again
    assert (seq.recompute_tensor_collectives[full], par.recompute_tensor_collectives[full]) == (3, 1)
    # the backward gathers each gathered input again for its weight gradients whatever the policy:
    # each block's in a sequential block, the one normed input in a parallel block (TPU compiles:
    # benchmarks/results/compiler_counts.txt)
    assert (seq.recompute_tensor_collectives[minimal], par.recompute_tensor_collectives[minimal]) == (2, 1)


def plan(model, remat, **mesh):
    return Plan(model=model, topology="v5p-16", seq_len=8192, global_batch=8, mesh=make_mesh(**mesh), remat=remat)


def test_tensor_traffic_is_four_collectives_a_layer_not_eight():
    assert tensor_collectives_per_layer(SEQUENTIAL) == 8 and tensor_collectives_per_layer(PARALLEL) == 4
    t = {
        (m.name, r): estimate(plan(m, r, fsdp=2, tensor=4)).comm_s["tensor"]
        for m in (SEQUENTIAL, PARALLEL)
        for r in ("full", "minimal")
    }
    # per layer a gather costs g: sequential 8g (+3g again under full, +2g under minimal), parallel
    # 4g (+1g under either: its one normed input gathered again); the loss's all-reduce cancels
    saved_full = t[SEQUENTIAL.name, "full"] - t[PARALLEL.name, "full"]
    saved_minimal = t[SEQUENTIAL.name, "minimal"] - t[PARALLEL.name, "minimal"]
    gather = t[SEQUENTIAL.name, "full"] - t[SEQUENTIAL.name, "minimal"]
    assert saved_minimal == pytest.approx(5 * gather) and saved_full == pytest.approx(6 * gather) and gather > 0
    # without tensor parallelism there is no tensor traffic either way
    assert estimate(plan(PARALLEL, "full", fsdp=8)).comm_s["tensor"] == 0


def test_memory_and_elementwise_work_of_the_parallel_block():
    seq, par = estimate(plan(SEQUENTIAL, "minimal", fsdp=8)), estimate(plan(PARALLEL, "minimal", fsdp=8))
    tokens = 8192  # one sequence per device
    assert seq.hbm_bytes["activations"] - par.hbm_bytes["activations"] == pytest.approx(
        SEQUENTIAL.num_layers * tokens * SEQUENTIAL.hidden * 2
    )  # bf16, one hidden value per token per layer
    assert par.hbm_bytes["attention_working_set"] < seq.hbm_bytes["attention_working_set"]
    full_seq, full_par = estimate(plan(SEQUENTIAL, "full", fsdp=8)), estimate(plan(PARALLEL, "full", fsdp=8))
    assert full_seq.hbm_bytes["activations"] == full_par.hbm_bytes["activations"]
    # same matmuls but the out projection's recompute; less HBM-bound elementwise work
    assert full_par.t_hbm_s < full_seq.t_hbm_s and full_par.step_time_s < full_seq.step_time_s
    assert np.isfinite(full_par.step_time_s) and full_par.model_flops == full_seq.model_flops  # the same matmuls
    # under full remat the sequential block's MLP input waits for the attention run again, whose values
    # (the normed input, q/out of 32 heads, K/V of 8, the residual and out projection: 14336 a token)
    # are held through the MLP's backward, and so is the residual the MLP's norm read (4096 a token);
    # the parallel block's MLP reads the layer input's norm only
    held = tokens * (4096 + (2 * 32 + 2 * 8) * 128 + 2 * 4096 + 4096) * 2
    assert full_seq.hbm_bytes["mlp_working_set"] - full_par.hbm_bytes["mlp_working_set"] == held


def test_maxtext_reads_and_writes_decoder_block():
    assert read_maxtext(f"model_name=llama3.1-8b {FLAGS}").plan.model == SEQUENTIAL
    read = read_maxtext(f"model_name=llama3.1-8b decoder_block=default {FLAGS}")
    assert read.plan.model.decoder_block is DecoderBlock.DEFAULT and "decoder_block" not in read.unread
    assert export_maxtext(read.plan).flags["decoder_block"] == "default"
    assert read_maxtext(f"base_emb_dim=1024 {FLAGS}").plan.model.decoder_block is DecoderBlock.LLAMA2  # base.yml
    assert "decoder_block" not in export_maxtext(read_maxtext(f"model_name=llama3.1-8b {FLAGS}").plan).flags
    for refused in ("mistral", "gemma2", "deepseek"):
        with pytest.raises(CpplanError, match=f"decoder_block='{refused}': cpplan runs llama2.*and default"):
            read_maxtext(f"model_name=llama3.1-8b decoder_block={refused} {FLAGS}")


SYNTHETIC = {
    "global_parameter_scale": "32",
    "base_emb_dim": "2560",
    "base_num_heads": "8",
    "base_mlp_dim": "8192",
    "base_num_decoder_layers": "16",
    "head_dim": "256",
    "vocab_size": "32768",
    "mlp_activations": "relu",
    "logits_via_embedding": "true",
}


def test_synthetic_models_take_the_block_of_their_maxtext_commit():
    assert synthetic_shape(SYNTHETIC, date="2023-12-15").block is DecoderBlock.DEFAULT
    assert synthetic_shape(SYNTHETIC, date=LLAMA2_BLOCK_DEFAULT_SINCE).block is DecoderBlock.LLAMA2
    assert synthetic_shape(SYNTHETIC).block is DecoderBlock.LLAMA2  # MaxText 0.2.5's base.yml
    assert synthetic_shape({**SYNTHETIC, "decoder_block": "llama2"}, date="2023-10-31").block is DecoderBlock.LLAMA2
    runs = read_corpus(ROOT / "benchmarks" / "public_runs.csv")
    blocks = {r.run_id: r.plan.model.decoder_block for r in runs}
    synthetic = [r.run_id for r in runs if "global_parameter_scale" in r.row["maxtext_flags"]]
    assert len(synthetic) == 40 and all(blocks[i] is DecoderBlock.DEFAULT for i in synthetic)
    assert all(b is DecoderBlock.LLAMA2 for i, b in blocks.items() if i not in synthetic)
    # the v5p minimal-remat runs keep no out projection: 10 GiB less per device than a sequential block
    run = next(r for r in runs if r.run_id == "v5p-32b-1x128")
    sequential = dataclasses.replace(run.plan, model=dataclasses.replace(run.plan.model, decoder_block="llama2"))
    saved = estimate(sequential).hbm_bytes["activations"] - estimate(run.plan).hbm_bytes["activations"]
    assert saved == pytest.approx(10 * GiB, rel=0.01)
