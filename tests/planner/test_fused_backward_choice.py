"""Pure tier: the search runs splash's fused backward on cpplan's runtime where its dq partials fit and it is
faster, and the separate dq and dK/dV kernels where they do not; the partials' bytes by hand; validate's
variants of a chosen plan."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import planner
from cost_models.candidates import both_backwards
from cost_models.compute import dq_partials, fused_backward_key_chunks
from cost_models.errors import CpplanError
from cost_models.pricing import price, priced_rows
from planner.estimate import candidates_of
from planner.explanation import fused_key_chunks

pytestmark = pytest.mark.pure

H128 = str(Path(__file__).resolve().parents[2] / "benchmarks" / "tpu_v5e" / "llama-4l-h128.json")


def test_jax_splash_keeps_one_partial_per_key_block_in_q_dtype_and_tokamax_fp32():
    # 8192 keys in blocks of 1024: 8 partials, bf16 in jax's kernel, fp32 in tokamax's, 3 bf16 rolled ones
    assert [float(v) for v in dq_partials(8192, 1024, act_bytes=2, in_q_dtype=True)] == [8, 2]
    assert [float(v) for v in dq_partials(8192, 1024, act_bytes=2)] == [8, 4]
    assert [float(v) for v in dq_partials(8192, 1024, reduction_steps=3, act_bytes=2)] == [3, 2]


def test_the_fused_plan_holds_its_partials_beside_the_separate_one():
    # the h128 model alone on a v5e chip at 16K, blocks 1024: 16 partials of 16 heads × 16384 × 128 in bf16
    chosen = planner.explain(H128, "16k", "v5e:1x1", global_batch=1).best
    fused = dataclasses.replace(chosen, block_q=1024, block_kv=1024, fused_attention_backward=True)
    separate = dataclasses.replace(fused, fused_attention_backward=False)
    e_fused, e_separate = planner.estimate(fused), planner.estimate(separate)
    partials = 16 * 16 * 16384 * 128 * 2
    buffers = e_fused.hbm_bytes["attention_buffers"] - e_separate.hbm_bytes["attention_buffers"]
    assert buffers == pytest.approx(partials)
    # faster by the backward's kernels alone: the chip's separate kernels cost more than the fused one
    assert e_fused.compute_s["attention"] < e_separate.compute_s["attention"]
    assert e_fused.compute_s["matmul"] == e_separate.compute_s["matmul"]


def _columns(priced) -> list:
    """Every figure of a one-row price, by name, as exact floats."""
    out = []
    for field in dataclasses.fields(priced):
        value = getattr(priced, field.name)
        for name, column in sorted(value.items()) if isinstance(value, dict) else [(field.name, value)]:
            out.append((name, np.broadcast_to(column, (1,)).tolist()))
    return out


@pytest.mark.parametrize("model,seq_len,topology", [(H128, "16k", "v5e:1x1"), ("llama3.1-8b", "128k", "v5p:2x2x2")])
def test_one_table_prices_both_backwards_as_two_prices_do(model, seq_len, topology):
    chosen = planner.explain(model, seq_len, topology, global_batch=1).best
    x = candidates_of(dataclasses.replace(chosen, block_q=1024, block_kv=1024))
    both = price(both_backwards(x))  # row 0: the dq and dK/dV kernels, row 1: the fused kernel
    rows = [priced_rows(both, slice(row, row + 1)) for row in (0, 1)]
    for row, fused in zip(rows, (False, True)):
        assert _columns(row) == _columns(price(dataclasses.replace(x, fused_attention_backward=fused)))
    assert _columns(rows[0]) != _columns(rows[1])
    if model == H128:  # 16 partials of 16 heads × 16384 × 128 in bf16 beside the separate kernels' buffers
        held = [float(np.asarray(r.memory["attention_buffers"]).item()) for r in rows]
        assert held[1] - held[0] == pytest.approx(16 * 16 * 16384 * 128 * 2)


@pytest.mark.parametrize(
    "seq_len,remat,fused,chunks",
    [("16k", None, True, 1), ("64k", None, True, 4), ("128k", "full", True, 16), ("160k", "full", False, 1)],
)
def test_the_search_runs_the_fused_backward_where_its_partials_fit(seq_len, remat, fused, chunks):
    options = {"remat": remat} if remat else {}
    e = planner.explain(H128, seq_len, "v5e:1x1", global_batch=1, **options)
    assert e.best.fused_attention_backward is fused
    flipped = dataclasses.replace(e.best, fused_attention_backward=not fused)
    other = planner.estimate(flipped)
    # the separate kernels fit too, and are slower; at 160K the fused kernel's partials fit only over 80 chunks
    # of the keys (160K / 2048 = 80 partials of 16 heads × 160K × 128 in bf16 against an eighth of 16 GiB),
    # whose passes over q make it the slower one
    assert other.fits and other.step_time_s > e.estimate.step_time_s
    if not fused:
        assert fused_key_chunks(flipped) == 80
    assert ("fused kernel" in str(e)) is fused
    assert fused_key_chunks(e.best) == chunks
    if chunks > 1:
        # one chunk's partials (a partial per key block of 2048 over the chunks) of 16 heads × seq × 128 in
        # bf16, and the fp32 sum of those before: at 64K 8 partials (4 chunks), at 128K 4 (16 chunks)
        tokens = e.best.seq_len
        held = e.estimate.hbm_bytes["attention_buffers"] - other.hbm_bytes["attention_buffers"]
        assert held == pytest.approx(16 * tokens * 128 * (tokens // 2048 // chunks * 2 + 4))
        assert f"over {chunks} chunks of the keys" in str(e)


def test_key_chunks_by_hand():
    # 16 heads × 65536 × 128 in bf16 is 256 MiB a partial; 2048-token key blocks
    chunks = lambda kv_len, hbm, block=2048: float(
        fused_backward_key_chunks(16, 65536, kv_len, head_dim=128, block_kv=block, act_bytes=2, hbm_bytes=hbm)
    )
    assert chunks(65536, 16 * 2**30) == 4  # 32 partials, 8 GiB, over 2 GiB: 4
    assert chunks(65536, 64 * 2**30) == 1  # within 8 GiB: whole
    assert chunks(65536, 0) == 1  # no bound
    assert chunks(65536, 2**20) == 32  # more than the key blocks: one chunk per block
    assert chunks(24 * 2048, 12 * 2**30) == 4  # 24 partials, 6 GiB over 1.5 GiB: 4 divides 24
    assert chunks(6 * 2048, 2**30) == 6  # 6 partials over 128 MiB asks 16: one per block
    assert chunks(6 * 2048, 6 * 2**30) == 2  # 1.5 GiB over 768 MiB: 2 divides 6
    assert chunks(6 * 2048, 4 * 2**30) == 6  # over 512 MiB asks 4, which 6 blocks do not split into


def test_maxtext_keeps_its_own_choice():
    e = planner.explain(H128, "16k", "v5e:1x1", global_batch=1, target="maxtext")
    assert e.best.fused_attention_backward is False


def test_validate_runs_each_variant_that_fits_priced_as_it_is():
    from validation.steptime import choose_plans, plan_variants

    best = choose_plans(H128, [163840], "v5e:1x1", max_plans=1, top=1, compute_dtype="bfloat16", remat="full")[0]
    variants = plan_variants(best, blocks=[256, 1024, 2048], both_backwards=True)
    kinds = [(r.plan.block_q, r.plan.fused_attention_backward) for r in variants]
    # the chosen plan first (at 160K its separate kernels); blocks of 256 fit with neither backward (the
    # kernel's block tables outgrow the chip's 1 MiB of SMEM); both backwards at the other block
    assert kinds[0] == (best.plan.block_q, False) == (2048, False)
    assert sorted(kinds) == [(1024, False), (1024, True), (2048, False), (2048, True)]
    assert not any(
        planner.estimate(dataclasses.replace(best.plan, block_q=256, block_kv=256, fused_attention_backward=f)).fits
        for f in (False, True)
    )
    for r in variants:
        assert r.estimate.step_time_s == planner.estimate(r.plan).step_time_s and r.estimate.fits


def test_a_block_that_is_not_a_power_of_two_is_refused():
    from cli.args import block_sizes

    assert block_sizes("1024, 2048") == [1024, 2048] and block_sizes(None) == []
    with pytest.raises(CpplanError, match="--blocks '1000'.*powers of two from 128"):
        block_sizes("1000")
    assert np.all(np.array(block_sizes("128,256")) >= 128)
