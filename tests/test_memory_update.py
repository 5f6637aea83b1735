"""The optimizer update's phase of the HBM price (cost_models.pricing.memory), by hand.

The figures are bench_memory's row "tpu7x ulysses4 tensor2 save_qkv_proj" (Llama 3.1 8B's shapes
with 2 layers, 32K tokens): its compile peaks in the output head's AdamW update, where the buffer
assignment holds eight fp32 arrays of the head's shard, [1024, 64128] (250.5 MiB each): the
head, mu and nu moved into the gradient's layout, the two gradient terms and the three results.
"""
import dataclasses

import pytest

from cost_models.models import MODELS
from cost_models.pricing.memory import optimizer_update_bytes_per_head_weight
from planner import Plan, estimate, make_mesh

pytestmark = pytest.mark.pure
MiB = 2 ** 20
TWO_LAYERS = dataclasses.replace(MODELS["llama3.1-8b"], name="llama3.1-8b-2l", num_layers=2)
HEAD_SHARD = 4096 * 128256 // 8  # hidden over ulysses 4, vocabulary over tensor 2


def _plan(topology: str, **fields) -> Plan:
    return Plan(model=TWO_LAYERS, topology=topology, seq_len=32768, global_batch=1,
                mesh=make_mesh(context_ulysses=4, tensor=2), cp_strategy="ulysses", remat="save_qkv_proj",
                block_q=512, block_kv=512, loss_chunk_tokens=8192, **fields)


def test_bytes_per_head_weight():
    # head 4 + mu 4 + nu 4 moved, gradient terms 4 + 4 in place of the 4 counted in grads
    assert optimizer_update_bytes_per_head_weight(param_bytes=4, mu_bytes=4, relayout_off_core=False) == 16
    # and the three results in new buffers
    assert optimizer_update_bytes_per_head_weight(param_bytes=4, mu_bytes=4, relayout_off_core=True) == 28
    # a bf16 first moment moves and is rewritten in 2 bytes
    assert optimizer_update_bytes_per_head_weight(param_bytes=4, mu_bytes=2, relayout_off_core=True) == 24


def test_tpu7x_peaks_in_the_head_update():
    e = estimate(_plan("tpu7x:2x2x1"))
    b = e.hbm_bytes
    assert HEAD_SHARD * 4 / MiB == pytest.approx(250.5)
    assert b["optimizer_update"] == HEAD_SHARD * 28  # 7 head shards beyond the gradient in grads
    update = b["params"] + b["grads"] + b["update_gradients"] + b["optimizer"] + b["optimizer_update"]
    static = b["params"] + b["grads"] + b["optimizer"] + b["activations"] + b["weight_casts"]
    layer = max(b["attention_working_set"] + b["attention_buffers"] + b["collective_buffers"], b["mlp_working_set"])
    backward = static + max(layer, b["logits"] + b["head_buffers"])
    assert update > backward  # the step's end holds the most
    assert e.hbm_bytes_per_device == update
    # the compiler: arguments 2.08 GiB + temporaries 2.53 GiB + code 0.02 GiB = 4.63 GiB
    assert e.hbm_bytes_per_device / 2 ** 30 == pytest.approx(4.48, abs=0.01)


def test_v5p_updates_in_place():
    v5p, tpu7x = estimate(_plan("v5p:2x2x2")), estimate(_plan("tpu7x:2x2x1"))
    assert v5p.hbm_bytes["optimizer_update"] == HEAD_SHARD * 16
    assert tpu7x.hbm_bytes["optimizer_update"] - v5p.hbm_bytes["optimizer_update"] == HEAD_SHARD * 12
    bf16_mu = estimate(_plan("tpu7x:2x2x1", mu_dtype="bfloat16"))
    assert bf16_mu.hbm_bytes["optimizer_update"] == HEAD_SHARD * 24


def _all_gather_plan(topology: str, remat: str, *, seq_len: int = 32768) -> Plan:
    # bench_memory's row "tpu7x all_gather4 fsdp2 minimal": 8192 tokens per device, two MLP chunks
    return Plan(model=TWO_LAYERS, topology=topology, seq_len=seq_len, global_batch=2,
                mesh=make_mesh(context=4, fsdp=2), cp_strategy="all_gather", load_balance="zigzag", remat=remat,
                block_q=512, block_kv=512, loss_chunk_tokens=8192)


def test_mlp_backward_copies_the_kept_values():
    tokens, chunk, hidden, inter = 8192, 4096, 4096, 14336
    kept = 2 * inter  # minimal keeps both MLP inputs (mlpwi_0, mlpwi_1); nothing reads mlpwo
    e = estimate(_all_gather_plan("v5p:2x2x2", "minimal"))
    # the MLP's input and its gradient for every token; one chunk's gate, up and input with their
    # gradients (the kept two sliced out for the chunk); the layer's kept two sliced out of the
    # stacked residuals (in the v5p compile: 448 + 224 MiB of dynamic-slice fusions); the chunk
    # loop's three gathered matrices, their gradient sums and a chunk's new sum
    chunk_values = chunk * 2 * (2 * inter + hidden)
    loop = 7 * hidden * inter
    assert e.hbm_bytes["mlp_working_set"] == (2 * tokens * hidden + chunk_values + tokens * kept + loop) * 2
    assert tokens * kept * 2 / MiB == 448
    # one chunk per device: the chunk's slice is the layer's, one copy; no gradient sum carried
    one = estimate(_all_gather_plan("v5p:2x2x2", "minimal", seq_len=16384))
    assert one.hbm_bytes["mlp_working_set"] == (2 * chunk * hidden + chunk_values + 6 * hidden * inter) * 2


def test_tpu7x_runs_the_attention_before_the_mlp_backward():
    tpu7x = estimate(_all_gather_plan("tpu7x:2x2x1", "minimal"))
    v5p = estimate(_all_gather_plan("v5p:2x2x2", "minimal"))
    # the kernel's q (8192 local queries × 32 heads), its output and the output's gradient, and the
    # K/V gathered to the whole 32768 tokens (8 heads): 64 + 64 + 64 + 128 MiB in the tpu7x compile
    early = 128 * 2 * (3 * 8192 * 32 + 2 * 32768 * 8)
    assert early / MiB == 320
    assert tpu7x.hbm_bytes["mlp_working_set"] - v5p.hbm_bytes["mlp_working_set"] == early
    # the compiler: 6.42 GiB (6.38 recompiled on 2026-12-01); before these terms cpplan said 5.30 GiB
    assert tpu7x.hbm_bytes_per_device / 2 ** 30 == pytest.approx(5.96, abs=0.01)
    # a kept attention output is not run again; without out_proj kept the MLP waits for the attention anyway
    for remat in ("minimal_with_context", "full", "save_qkv_proj"):
        assert (estimate(_all_gather_plan("tpu7x:2x2x1", remat)).hbm_bytes["mlp_working_set"]
                == estimate(_all_gather_plan("v5p:2x2x2", remat)).hbm_bytes["mlp_working_set"])
    # a ring's hops stay after the MLP's loop (the tpu7x compile of ring 4 × fsdp 2, minimal)
    ring = {topology: estimate(dataclasses.replace(_all_gather_plan(topology, "minimal"), cp_strategy="ring"))
            for topology in ("tpu7x:2x2x1", "v5p:2x2x2")}
    assert ring["tpu7x:2x2x1"].hbm_bytes["mlp_working_set"] == ring["v5p:2x2x2"].hbm_bytes["mlp_working_set"]


def test_hosts_price_no_layout_moves():
    # read from TPU compiles only: a host's update holds the weights, gradients and moments
    host = estimate(_plan("cpu:8"))
    assert host.hbm_bytes["optimizer_update"] == 0
