"""Compile our own plans deviceless on v5p and tpu7x and print cpplan's predicted HBM per device
next to the XLA TPU compiler's, with the fit verdict of each.

    python benchmarks/bench_memory.py                 # every row (minutes a row)
    python benchmarks/bench_memory.py --only offload  # rows whose label contains the text
    python benchmarks/bench_memory.py --only offload --reuse  # those compiled, the rest re-priced on the
                                                               # compiler figures stored in the results
    python benchmarks/bench_memory.py --only offload --reuse --least-hbm  # also the least HBM each needs
    python benchmarks/bench_memory.py --only offload --keep-dumps DUMPS  # and keep each row's dump

The rows cover tensor parallelism with sequence parallelism, offload to host memory, bf16 first
moments, every context-parallel strategy and several remat policies, and at least one plan that
does not fit. Llama 3.1 8B's shapes (Gemma 3 12B's in three rows) with few layers (memory per layer is
uniform; a row that must not fit keeps all 32; the offload rows also at 3, 8 and 16 layers, where the compiler keeps the
layer loops it peels and inlines at 2, and at 1; steps of one layer have no layer loop), short
sequences so each compile takes seconds to a few minutes. Targets:
the prediction within 10% of the compiler on every row, and the same fit verdict on every row.

Each row compiles as cpplan's runs do (`runtime.compile.merged_compiler_args`: the packed buffer
placement the price assumes, `PACKED_PLACEMENT_FLAG`; rows compiled before it was asked for left up to
15.5% of the heap between buffers). The unconstrained figure is what the compiler holds when it has the
chip's whole HBM, and with HBM to spare its scheduler uses some (host writes left late, values fetched
early). The planner's
"fits" asks whether the step compiles under the chip's HBM, so `--least-hbm` also finds, by
bisection on the compiler's HBM cap (`xla_tpu_max_hbm_size_mib`, passed as a compile option), the
least cap under which the step still compiles, to `LEAST_HBM_RESOLUTION`, and stores it beside the
unconstrained figure (`least_hbm` in the results: the cap, the largest cap that failed, every
probe). The unconstrained figure stays the one the errors are measured on.

Each row that fits is compiled with its module dumped into a temporary directory, and the dump's
buffer assignment read (`validation.peak_buffers.read_heap`): the temporary allocation, its live peak
and so the heap's gaps (allocated but holding no live value at the peak) are stored beside the
figure (`heap` in the results).
"""

import argparse
import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from validation.least_hbm import LEAST_HBM_RESOLUTION, least_hbm  # noqa: E402
from validation.peak_buffers import read_heap  # noqa: E402

K = 1024
TARGET_ERROR = 0.10
RESULTS = Path(__file__).resolve().parent / "results" / "bench_memory.json"
OFFLOAD_SOME = {
    "query_proj": "offload",
    "key_proj": "device",
    "value_proj": "device",
    "context": "device",
    "mlpwi_0": "offload",
    "mlpwi_1": "offload",
}
OFFLOAD_SOME_IN_HBM = {name: "device" for name in OFFLOAD_SOME}
# the attention output on the host, q/k/v kept: a placement none of the compiles the fetched-ahead rule was
# read from has (cost_models.remat.READ_BY_ATTENTION_BACKWARD), compiled to check it
CONTEXT_OFFLOADED = {"query_proj": "device", "key_proj": "device", "value_proj": "device", "context": "offload"}
LAYER_INPUT_AND_QKV = {
    "decoder_layer_input": "offload",
    "query_proj": "offload",
    "key_proj": "offload",
    "value_proj": "offload",
}

# label, topology, mesh, strategy, seq_len, sequences, layers, plan fields
ROWS = [
    ("v5p tensor2 sp full", "v5p:2x2x2", dict(fsdp=4, tensor=2), "none", 8 * K, 8, 2, dict(remat="full")),
    (
        "v5p tensor4 sp save_qkv_proj",
        "v5p:2x2x2",
        dict(fsdp=2, tensor=4),
        "none",
        8 * K,
        4,
        2,
        dict(remat="save_qkv_proj"),
    ),
    (
        "v5p ring4 tensor2 minimal",
        "v5p:2x2x2",
        dict(context=4, tensor=2),
        "ring",
        32 * K,
        1,
        2,
        dict(remat="minimal", load_balance="zigzag"),
    ),
    (
        "v5p all_gather8 save_dot_except_mlp",
        "v5p:2x2x2",
        dict(context=8),
        "all_gather",
        64 * K,
        1,
        2,
        dict(remat="save_dot_except_mlp", load_balance="zigzag"),
    ),
    (
        "v5p ulysses8 minimal_with_context",
        "v5p:2x2x2",
        dict(context_ulysses=8),
        "ulysses",
        32 * K,
        1,
        2,
        dict(remat="minimal_with_context"),
    ),
    (
        "v5p usp 2x2 tensor2 save_out_proj",
        "v5p:2x2x2",
        dict(context=2, context_ulysses=2, tensor=2),
        "usp",
        32 * K,
        1,
        2,
        dict(remat="save_out_proj"),
    ),
    (
        "v5p fsdp8 offload qkv_proj_offloaded",
        "v5p:2x2x2",
        dict(fsdp=8),
        "none",
        8 * K,
        8,
        2,
        dict(remat="qkv_proj_offloaded"),
    ),
    # qkv_proj_offloaded spelled as custom, with each layer's input offloaded too (tpu-recipes' v6e Llama 3.1
    # runs): the row above with the layer inputs (2 × 8192 tokens × 4096 × 2 bytes) out of HBM
    (
        "v5p fsdp8 offload custom layer input and qkv",
        "v5p:2x2x2",
        dict(fsdp=8),
        "none",
        8 * K,
        8,
        2,
        dict(remat="custom", remat_custom=LAYER_INPUT_AND_QKV),
    ),
    (
        "v5p fsdp4 tensor2 offload minimal_offloaded",
        "v5p:2x2x2",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        2,
        dict(remat="minimal_offloaded"),
    ),
    (
        "v5p fsdp8 bf16 mu save_dot_except_mlpwi",
        "v5p:2x2x2",
        dict(fsdp=8),
        "none",
        8 * K,
        8,
        2,
        dict(remat="save_dot_except_mlpwi", mu_dtype="bfloat16"),
    ),
    (
        "v5p ring8 minimal_with_context 32 layers: does not fit",
        "v5p:2x2x2",
        dict(context=8),
        "ring",
        256 * K,
        1,
        32,
        dict(remat="minimal_with_context", load_balance="zigzag"),
    ),
    (
        "tpu7x tensor2 sp full bf16 mu",
        "tpu7x:2x2x1",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        2,
        dict(remat="full", mu_dtype="bfloat16"),
    ),
    (
        "tpu7x ring4 tensor2 save_dot_except_mlp",
        "tpu7x:2x2x1",
        dict(context=4, tensor=2),
        "ring",
        32 * K,
        1,
        2,
        dict(remat="save_dot_except_mlp", load_balance="zigzag"),
    ),
    (
        "tpu7x all_gather4 fsdp2 minimal",
        "tpu7x:2x2x1",
        dict(context=4, fsdp=2),
        "all_gather",
        32 * K,
        2,
        2,
        dict(remat="minimal", load_balance="zigzag"),
    ),
    (
        "tpu7x ulysses4 tensor2 save_qkv_proj",
        "tpu7x:2x2x1",
        dict(context_ulysses=4, tensor=2),
        "ulysses",
        32 * K,
        1,
        2,
        dict(remat="save_qkv_proj"),
    ),
    (
        "tpu7x usp 2x4 full",
        "tpu7x:2x2x1",
        dict(context=2, context_ulysses=4),
        "usp",
        64 * K,
        1,
        2,
        dict(remat="full", load_balance="zigzag"),
    ),
    (
        "tpu7x fsdp4 tensor2 offload custom",
        "tpu7x:2x2x1",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        2,
        dict(remat="custom", remat_custom=OFFLOAD_SOME),
    ),
    (
        "tpu7x ulysses8 minimal_with_context 32 layers: does not fit",
        "tpu7x:2x2x1",
        dict(context_ulysses=8),
        "ulysses",
        256 * K,
        1,
        32,
        dict(remat="minimal_with_context"),
    ),
    # The offload rows at a depth users run: at 2 layers the compiler peels one iteration off each
    # layer loop of an offloading step and inlines the one-trip loops left, so the program is flat;
    # at 8 the loops stay (docs/memory_offload.md). With in-HBM twins: the same plan with the
    # offloaded names kept on device.
    (
        "v5p fsdp8 offload qkv_proj_offloaded 8 layers",
        "v5p:2x2x2",
        dict(fsdp=8),
        "none",
        8 * K,
        8,
        8,
        dict(remat="qkv_proj_offloaded"),
    ),
    (
        "v5p fsdp8 save_qkv_proj 8 layers: the offload row's q/k/v in HBM",
        "v5p:2x2x2",
        dict(fsdp=8),
        "none",
        8 * K,
        8,
        8,
        dict(remat="save_qkv_proj"),
    ),
    (
        "v5p fsdp8 offload custom layer input and qkv 8 layers",
        "v5p:2x2x2",
        dict(fsdp=8),
        "none",
        8 * K,
        8,
        8,
        dict(remat="custom", remat_custom=LAYER_INPUT_AND_QKV),
    ),
    (
        "v5p fsdp4 tensor2 offload minimal_offloaded 8 layers",
        "v5p:2x2x2",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        8,
        dict(remat="minimal_offloaded"),
    ),
    (
        "v5p fsdp4 tensor2 minimal 8 layers: minimal_offloaded's values in HBM",
        "v5p:2x2x2",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        8,
        dict(remat="minimal"),
    ),
    (
        "tpu7x fsdp4 tensor2 offload custom 8 layers",
        "tpu7x:2x2x1",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        8,
        dict(remat="custom", remat_custom=OFFLOAD_SOME),
    ),
    (
        "tpu7x fsdp4 tensor2 custom 8 layers: the offload row's values in HBM",
        "tpu7x:2x2x1",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        8,
        dict(remat="custom", remat_custom=OFFLOAD_SOME_IN_HBM),
    ),
    (
        "v5p fsdp4 tensor2 minimal 2 layers: minimal_offloaded's values in HBM",
        "v5p:2x2x2",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        2,
        dict(remat="minimal"),
    ),
    (
        "v5p fsdp4 tensor2 offload minimal_offloaded 16 layers",
        "v5p:2x2x2",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        16,
        dict(remat="minimal_offloaded"),
    ),
    (
        "tpu7x fsdp4 tensor2 offload custom 16 layers",
        "tpu7x:2x2x1",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        16,
        dict(remat="custom", remat_custom=OFFLOAD_SOME),
    ),
    (
        "v5p fsdp8 offload custom context 8 layers",
        "v5p:2x2x2",
        dict(fsdp=8),
        "none",
        8 * K,
        8,
        8,
        dict(remat="custom", remat_custom=CONTEXT_OFFLOADED),
    ),
    # added before they were compiled, to check the flat 2-layer program's price (offloads held through
    # the forward and the loss, gone by the backward; tpu7x's lane-wide log-sum-exp per layer) on other meshes
    (
        "v5p fsdp8 offload minimal_offloaded 2 layers 16K",
        "v5p:2x2x2",
        dict(fsdp=8),
        "none",
        16 * K,
        8,
        2,
        dict(remat="minimal_offloaded"),
    ),
    (
        "tpu7x fsdp8 offload custom 2 layers 16K",
        "tpu7x:2x2x1",
        dict(fsdp=8),
        "none",
        16 * K,
        8,
        2,
        dict(remat="custom", remat_custom=OFFLOAD_SOME),
    ),
    # added before they were compiled, to check the flat program's loss priced by what it holds (offloaded
    # attention values, two MLP chunks, recomputed residual values, gathered weights) on other policies and
    # meshes, and the loss's own phase (its input, no layer gradient yet) on loops that peak there
    (
        "tpu7x fsdp8 offload minimal_offloaded 2 layers 16K",
        "tpu7x:2x2x1",
        dict(fsdp=8),
        "none",
        16 * K,
        8,
        2,
        dict(remat="minimal_offloaded"),
    ),
    (
        "v5p fsdp8 offload custom 2 layers 16K",
        "v5p:2x2x2",
        dict(fsdp=8),
        "none",
        16 * K,
        8,
        2,
        dict(remat="custom", remat_custom=OFFLOAD_SOME),
    ),
    (
        "tpu7x fsdp4 tensor2 offload minimal_offloaded 2 layers",
        "tpu7x:2x2x1",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        2,
        dict(remat="minimal_offloaded"),
    ),
    (
        "v5p tensor8 sp full 2 layers 16K",
        "v5p:2x2x2",
        dict(tensor=8),
        "none",
        16 * K,
        1,
        2,
        dict(remat="full"),
    ),
    (
        "tpu7x tensor8 sp full 2 layers 16K",
        "tpu7x:2x2x1",
        dict(tensor=8),
        "none",
        16 * K,
        1,
        2,
        dict(remat="full"),
    ),
    # Held out: tensor 8 where a layer's backward, not the loss, decides the price (deeper, longer)
    (
        "v5p tensor8 sp full 8 layers 16K",
        "v5p:2x2x2",
        dict(tensor=8),
        "none",
        16 * K,
        1,
        8,
        dict(remat="full"),
    ),
    (
        "v5p tensor8 sp full 2 layers 64K",
        "v5p:2x2x2",
        dict(tensor=8),
        "none",
        64 * K,
        1,
        2,
        dict(remat="full"),
    ),
    (
        "tpu7x tensor8 sp full 8 layers 16K",
        "tpu7x:2x2x1",
        dict(tensor=8),
        "none",
        16 * K,
        1,
        8,
        dict(remat="full"),
    ),
    (
        "tpu7x tensor8 sp full 2 layers 64K",
        "tpu7x:2x2x1",
        dict(tensor=8),
        "none",
        64 * K,
        1,
        2,
        dict(remat="full"),
    ),
    # Other tensor degrees at the longer sequence, to tell what the tensor-parallel backward holds per degree
    (
        "tpu7x tensor4 sp full 2 layers 64K",
        "tpu7x:2x2x1",
        dict(fsdp=2, tensor=4),
        "none",
        64 * K,
        2,
        2,
        dict(remat="full"),
    ),
    (
        "tpu7x tensor2 sp full 2 layers 64K",
        "tpu7x:2x2x1",
        dict(fsdp=4, tensor=2),
        "none",
        64 * K,
        4,
        2,
        dict(remat="full"),
    ),
    (
        "tpu7x data2 tensor4 sp full 2 layers 64K",
        "tpu7x:2x2x1",
        dict(data=2, tensor=4),
        "none",
        64 * K,
        2,
        2,
        dict(remat="full"),
    ),
    # Tensor 8 beside FSDP on 16 devices: whether the attention's backward holds its gathered input twice
    (
        "tpu7x fsdp2 tensor8 sp full 2 layers 64K",
        "tpu7x:2x2x2",
        dict(fsdp=2, tensor=8),
        "none",
        64 * K,
        2,
        2,
        dict(remat="full"),
    ),
    # Held out from the reduce-scatter's scratch: tensor 4 beside a context strategy, other policies
    (
        "tpu7x ring2 tensor4 minimal_with_context 4 layers 32K",
        "tpu7x:2x2x1",
        dict(context=2, tensor=4),
        "ring",
        32 * K,
        1,
        4,
        dict(remat="minimal_with_context"),
    ),
    (
        "tpu7x ulysses2 tensor4 save_dot_except_mlp 4 layers 32K",
        "tpu7x:2x2x1",
        dict(context_ulysses=2, tensor=4),
        "ulysses",
        32 * K,
        1,
        4,
        dict(remat="save_dot_except_mlp"),
    ),
    # Held out: context strategies beside tensor on both chips, added before they were compiled
    (
        "v5p ring4 tensor2 save_dot_except_mlp 4 layers 32K",
        "v5p:2x2x2",
        dict(context=4, tensor=2),
        "ring",
        32 * K,
        1,
        4,
        dict(remat="save_dot_except_mlp"),
    ),
    (
        "tpu7x usp 2x2 tensor2 minimal_with_context 4 layers 64K",
        "tpu7x:2x2x1",
        dict(context=2, context_ulysses=2, tensor=2),
        "usp",
        64 * K,
        1,
        4,
        dict(remat="minimal_with_context"),
    ),
    (
        "v5p ulysses2 tensor4 full 4 layers 32K",
        "v5p:2x2x2",
        dict(context_ulysses=2, tensor=4),
        "ulysses",
        32 * K,
        1,
        4,
        dict(remat="full"),
    ),
    (
        "tpu7x all_gather2 tensor4 save_qkv_proj 4 layers 32K",
        "tpu7x:2x2x1",
        dict(context=2, tensor=4),
        "all_gather",
        32 * K,
        1,
        4,
        dict(remat="save_qkv_proj"),
    ),
    # v6e and v5e run their reduce-scatters on the TensorCore (`reduce_scatter_scratch`), as v5p does
    (
        "v5e tensor4 sp full 2 layers 16K",
        "v5e:2x2",
        dict(tensor=4),
        "none",
        16 * K,
        1,
        2,
        dict(remat="full"),
    ),
    (
        "v6e tensor4 sp full 2 layers 16K",
        "v6e:2x2",
        dict(tensor=4),
        "none",
        16 * K,
        1,
        2,
        dict(remat="full"),
    ),
    (
        "v5p tensor4 sp full 2 layers 64K",
        "v5p:2x2x2",
        dict(fsdp=2, tensor=4),
        "none",
        64 * K,
        2,
        2,
        dict(remat="full"),
    ),
    # Either side of the depth at which the layer loops of an offloading step survive the compiler's
    # peel (cost_models.remat.FLAT_OFFLOAD_MAX_LAYERS): at 3 they do, at 1 there is no loop
    (
        "v5p fsdp4 tensor2 offload minimal_offloaded 3 layers",
        "v5p:2x2x2",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        3,
        dict(remat="minimal_offloaded"),
    ),
    (
        "v5p fsdp4 tensor2 offload minimal_offloaded 1 layer",
        "v5p:2x2x2",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        1,
        dict(remat="minimal_offloaded"),
    ),
    (
        "tpu7x fsdp4 tensor2 offload custom 1 layer",
        "tpu7x:2x2x1",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        1,
        dict(remat="custom", remat_custom=OFFLOAD_SOME),
    ),
    (
        "tpu7x fsdp4 tensor2 custom 1 layer: the offload row's values in HBM",
        "tpu7x:2x2x1",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        1,
        dict(remat="custom", remat_custom=OFFLOAD_SOME_IN_HBM),
    ),
    # More steps of one layer, which XLA compiles without a layer loop (runtime/layer_gradients.py)
    (
        "v5p fsdp4 tensor2 custom 1 layer: the tpu7x offload row's values in HBM",
        "v5p:2x2x2",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        1,
        dict(remat="custom", remat_custom=OFFLOAD_SOME_IN_HBM),
    ),
    (
        "tpu7x fsdp4 tensor2 full 1 layer",
        "tpu7x:2x2x1",
        dict(fsdp=4, tensor=2),
        "none",
        8 * K,
        8,
        1,
        dict(remat="full"),
    ),
    (
        "tpu7x fsdp8 save_dot_except_mlp 1 layer",
        "tpu7x:2x2x1",
        dict(fsdp=8),
        "none",
        8 * K,
        8,
        1,
        dict(remat="save_dot_except_mlp"),
    ),
    (
        "tpu7x ring4 tensor2 save_dot_except_mlp 1 layer",
        "tpu7x:2x2x1",
        dict(context=4, tensor=2),
        "ring",
        32 * K,
        1,
        1,
        dict(remat="save_dot_except_mlp", load_balance="zigzag"),
    ),
    # the batch `explain` chooses by default (4M tokens a step aimed at; as many sequences as it prices to fit),
    # Llama 3.1 8B cut to 4 and 8 layers: each device holds many sequences
    (
        "v5p default batch all_gather fsdp4context2 128K x32 full 4l",
        "v5p:2x2x2",
        dict(fsdp=4, context=2),
        "all_gather",
        128 * K,
        32,
        4,
        dict(remat="full", load_balance="zigzag"),
    ),
    (
        "v5p default batch ring context8 128K x11 minimal_with_context 4l",
        "v5p:2x2x2",
        dict(context=8),
        "ring",
        128 * K,
        11,
        4,
        dict(remat="minimal_with_context", load_balance="zigzag"),
    ),
    (
        "v5p default batch ulysses context_ulysses8 64K x53 save_dot_except_mlp 4l",
        "v5p:2x2x2",
        dict(context_ulysses=8),
        "ulysses",
        64 * K,
        53,
        4,
        dict(remat="save_dot_except_mlp"),
    ),
    (
        "v5p default batch usp context2context_ulysses4 64K x45 full 4l",
        "v5p:2x2x2",
        dict(context=2, context_ulysses=4),
        "usp",
        64 * K,
        45,
        4,
        dict(remat="full", load_balance="zigzag"),
    ),
    (
        "tpu7x default batch all_gather fsdp4context2 64K x56 save_dot_except_mlp 4l",
        "tpu7x:2x2x1",
        dict(fsdp=4, context=2),
        "all_gather",
        64 * K,
        56,
        4,
        dict(remat="save_dot_except_mlp", load_balance="zigzag"),
    ),
    (
        "tpu7x default batch ring context8 64K x53 full 4l",
        "tpu7x:2x2x1",
        dict(context=8),
        "ring",
        64 * K,
        53,
        4,
        dict(remat="full", load_balance="zigzag"),
    ),
    (
        "tpu7x default batch ulysses fsdp4context_ulysses2 64K x64 full 4l",
        "tpu7x:2x2x1",
        dict(fsdp=4, context_ulysses=2),
        "ulysses",
        64 * K,
        64,
        4,
        dict(remat="full"),
    ),
    (
        "tpu7x default batch usp fsdp2context2context_ulysses2 128K x10 minimal_with_context 4l",
        "tpu7x:2x2x1",
        dict(fsdp=2, context=2, context_ulysses=2),
        "usp",
        128 * K,
        10,
        4,
        dict(remat="minimal_with_context", load_balance="zigzag"),
    ),
    (
        "v5p default batch all_gather fsdp4context2 64K x64 full 8l",
        "v5p:2x2x2",
        dict(fsdp=4, context=2),
        "all_gather",
        64 * K,
        64,
        8,
        dict(remat="full", load_balance="zigzag"),
    ),
    (
        "v5p default batch ring context8 128K x23 full 8l",
        "v5p:2x2x2",
        dict(context=8),
        "ring",
        128 * K,
        23,
        8,
        dict(remat="full", load_balance="zigzag"),
    ),
    (
        "v5p default batch ulysses context_ulysses8 128K x17 save_dot_except_mlp 8l",
        "v5p:2x2x2",
        dict(context_ulysses=8),
        "ulysses",
        128 * K,
        17,
        8,
        dict(remat="save_dot_except_mlp"),
    ),
    (
        "v5p default batch usp fsdp2context2context_ulysses2 128K x6 minimal_with_context 8l",
        "v5p:2x2x2",
        dict(fsdp=2, context=2, context_ulysses=2),
        "usp",
        128 * K,
        6,
        8,
        dict(remat="minimal_with_context", load_balance="zigzag"),
    ),
    (
        "tpu7x default batch all_gather fsdp4context2 128K x16 save_dot_except_mlp 8l",
        "tpu7x:2x2x1",
        dict(fsdp=4, context=2),
        "all_gather",
        128 * K,
        16,
        8,
        dict(remat="save_dot_except_mlp", load_balance="zigzag"),
    ),
    (
        "tpu7x default batch ring context8 64K x29 save_dot_except_mlp 8l",
        "tpu7x:2x2x1",
        dict(context=8),
        "ring",
        64 * K,
        29,
        8,
        dict(remat="save_dot_except_mlp", load_balance="zigzag"),
    ),
    (
        "tpu7x default batch ulysses context_ulysses8 64K x13 minimal_with_context 8l",
        "tpu7x:2x2x1",
        dict(context_ulysses=8),
        "ulysses",
        64 * K,
        13,
        8,
        dict(remat="minimal_with_context"),
    ),
    (
        "tpu7x default batch usp context2context_ulysses4 64K x39 full 8l",
        "tpu7x:2x2x1",
        dict(context=2, context_ulysses=4),
        "usp",
        64 * K,
        39,
        8,
        dict(remat="full", load_balance="zigzag"),
    ),
    # added before they were compiled, as a held-out check of a layer's forward priced as its own phase:
    # the price puts their peak in the forward, its kept values formed beside the stacks
    (
        "tpu7x default batch ring context8 128K x10 minimal_with_context 4l",
        "tpu7x:2x2x1",
        dict(context=8),
        "ring",
        128 * K,
        10,
        4,
        dict(remat="minimal_with_context", load_balance="zigzag"),
    ),
    (
        "v5p default batch ulysses context_ulysses8 64K x20 minimal_with_context 4l",
        "v5p:2x2x2",
        dict(context_ulysses=8),
        "ulysses",
        64 * K,
        20,
        4,
        dict(remat="minimal_with_context", load_balance="none"),
    ),
    # added before it was compiled, as a held-out check of the larger of a layer's forward and backward:
    # all-gather keeping many values a layer, priced a little larger in its backward
    (
        "v5p default batch all_gather context8 64K x22 minimal_with_context 4l",
        "v5p:2x2x2",
        dict(context=8),
        "all_gather",
        64 * K,
        22,
        4,
        dict(remat="minimal_with_context", load_balance="zigzag"),
    ),
    # added before it was compiled, as a held-out check of the output that a tpu7x USP lays out anew for
    # the out projection's weight gradient, held through the backward's hops
    (
        "tpu7x default batch usp context4context_ulysses2 128K x24 full 4l",
        "tpu7x:2x2x1",
        dict(context=4, context_ulysses=2),
        "usp",
        128 * K,
        24,
        4,
        dict(remat="full", load_balance="zigzag"),
    ),
    # and after both USP corrections, before it was compiled: the output recomputed under another policy
    (
        "tpu7x default batch usp context4context_ulysses2 128K x22 save_dot_except_mlp 4l",
        "tpu7x:2x2x1",
        dict(context=4, context_ulysses=2),
        "usp",
        128 * K,
        22,
        4,
        dict(remat="save_dot_except_mlp", load_balance="zigzag"),
    ),
    # a ring of two (one hop), whose zigzag hop holds half a dq beside its dK/dV where a later hop would form
    # its fp32 sums (read from this plan's dump at splash blocks of 2048 and from two with heads of 64)
    (
        "tpu7x default batch ring context2 fsdp4 64K x64 full 4l",
        "tpu7x:2x2x1",
        dict(fsdp=4, context=2),
        "ring",
        64 * K,
        64,
        4,
        dict(remat="full", load_balance="zigzag"),
    ),
    # added before they were compiled, as a held-out check of that hop: v5p, and another policy
    (
        "v5p default batch ring context2 fsdp2 64K x38 full 4l",
        "v5p:2x2x1",
        dict(fsdp=2, context=2),
        "ring",
        64 * K,
        38,
        4,
        dict(remat="full", load_balance="zigzag"),
    ),
    (
        "tpu7x default batch ring context2 fsdp4 64K x52 save_dot_except_mlp 4l",
        "tpu7x:2x2x1",
        dict(fsdp=4, context=2),
        "ring",
        64 * K,
        52,
        4,
        dict(remat="save_dot_except_mlp", load_balance="zigzag"),
    ),
    # local layers (Llama 3.1 8B's shapes with a window, chunks or packed documents; `model` holds the
    # ModelSpec fields, and `base` another model to start from): the ring's one hop, a layer switch between
    # a local and a global mask
    (
        "v5p local ring context8 128K x4 window4096 full 4l",
        "v5p:2x2x2",
        dict(context=8),
        "ring",
        128 * K,
        4,
        4,
        dict(remat="full", model=dict(window=4 * K)),
    ),
    (
        "tpu7x local ulysses context_ulysses8 128K x4 window1024 LG save_dot_except_mlp 4l",
        "tpu7x:2x2x1",
        dict(context_ulysses=8),
        "ulysses",
        128 * K,
        4,
        4,
        dict(remat="save_dot_except_mlp", model=dict(window=K, layer_pattern="LG")),
    ),
    (
        "v5p local usp context2context_ulysses4 64K x8 documents8K full 4l",
        "v5p:2x2x2",
        dict(context=2, context_ulysses=4),
        "usp",
        64 * K,
        8,
        4,
        dict(remat="full", model=dict(documents=8 * K)),
    ),
    # added before they were compiled, as a held-out check of the local-layer price: all-gather's
    # layer switch, a ring over 32K chunks (one hop), USP's ring under an 8K window (one hop)
    (
        "tpu7x local all_gather context8 128K x4 window4096 LG minimal_with_context 4l",
        "tpu7x:2x2x1",
        dict(context=8),
        "all_gather",
        128 * K,
        4,
        4,
        dict(remat="minimal_with_context", model=dict(window=4 * K, layer_pattern="LG")),
    ),
    # added before they were compiled, to check the layer switch's rerun attention held through the MLP's
    # backward: the same all-gather plan on v5p (which showed the chip places it), Ulysses keeping the output
    (
        "v5p local all_gather context8 128K x4 window4096 LG minimal_with_context 4l",
        "v5p:2x2x2",
        dict(context=8),
        "all_gather",
        128 * K,
        4,
        4,
        dict(remat="minimal_with_context", model=dict(window=4 * K, layer_pattern="LG")),
    ),
    (
        "tpu7x local ulysses context_ulysses8 128K x4 window1024 LG minimal_with_context 4l",
        "tpu7x:2x2x1",
        dict(context_ulysses=8),
        "ulysses",
        128 * K,
        4,
        4,
        dict(remat="minimal_with_context", model=dict(window=K, layer_pattern="LG")),
    ),
    (
        "v5p local ring context8 128K x8 chunks32K save_dot_except_mlp 4l",
        "v5p:2x2x2",
        dict(context=8),
        "ring",
        128 * K,
        8,
        4,
        dict(remat="save_dot_except_mlp", model=dict(window=32 * K, local_kind="chunked")),
    ),
    (
        "tpu7x local usp context4context_ulysses2 128K x8 window8192 minimal_with_context 4l",
        "tpu7x:2x2x1",
        dict(context=4, context_ulysses=2),
        "usp",
        128 * K,
        8,
        4,
        dict(remat="minimal_with_context", model=dict(window=8 * K)),
    ),
    # Gemma 3's block (local and global layers, four norms a layer, a 262K vocabulary) on v6e: its first six
    # layers, the compiles the memory check of its MLP's output was read from
    *[
        (
            f"v6e gemma3 fsdp4 {remat} 6 layers 8K",
            "v6e:2x2",
            dict(fsdp=4),
            "none",
            8 * K,
            4,
            6,
            dict(remat=remat, model=dict(base="gemma3-12b")),
        )
        for remat in ("minimal", "full")
    ],
    # their embedding slice of 960 columns, off the TPU's 128 lanes, untied (copied at the update alone), and
    # Llama's block at Gemma 3's width
    (
        "v6e gemma3 untied fsdp4 full 2 layers 8K",
        "v6e:2x2",
        dict(fsdp=4),
        "none",
        8 * K,
        4,
        2,
        dict(remat="full", model=dict(base="gemma3-12b", tie_embeddings=False)),
    ),
    (
        "v6e llama at gemma3's hidden 3840 fsdp4 full 2 layers 8K",
        "v6e:2x2",
        dict(fsdp=4),
        "none",
        8 * K,
        4,
        2,
        dict(remat="full", model=dict(hidden=3840)),
    ),
    # Held out: parameters in bf16 under FSDP, whose weight gradients are scattered in the compute dtype
    # (with fp32 parameters the price's fp32 unreduced gradient covers a bf16 one and tpu7x's scratch)
    *[
        (
            f"{chip} fsdp8 bf16 params full 2 layers 16K",
            topology,
            dict(fsdp=8),
            "none",
            16 * K,
            8,
            2,
            dict(remat="full", param_dtype="bfloat16", mu_dtype="bfloat16"),
        )
        for chip, topology in (("tpu7x", "tpu7x:2x2x1"), ("v5p", "v5p:2x2x2"))
    ],
]


def plan_of(row):
    from cost_models.models import get_model
    from planner import Plan, make_mesh

    label, topology, mesh, strategy, seq_len, sequences, layers, fields = row
    fields = dict(fields)
    model_fields = dict(fields.pop("model", {}))
    base = get_model(model_fields.pop("base", "llama3.1-8b"))
    model = dataclasses.replace(base, name=f"{base.name}-{layers}l", num_layers=layers, **model_fields)
    return Plan(
        model=model,
        topology=topology,
        seq_len=seq_len,
        global_batch=sequences,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        block_q=512,
        block_kv=512,
        loss_chunk_tokens=8 * K,
        **fields,
    )


def gap_share(heap: dict) -> float:
    """The heap's gaps (allocated, nothing live at the peak) as a share of its temporary allocation."""
    return 1 - heap["live_peak_bytes"] / heap["temp_bytes"]


def compile_with_heap(plan, keep_dump: Path | None = None):
    """The plan's `compile_for` report and, where it fits, its temporary allocation's size and live
    peak read from the compile's own dump (None where it does not fit); the dump is written into
    `keep_dump` where given (for `python -m validation.peak_buffers`), else into a temporary directory."""
    from runtime.compile import compile_for

    with tempfile.TemporaryDirectory() as scratch:
        dump = keep_dump or Path(scratch)
        options = {"xla_dump_to": str(dump), "xla_dump_hlo_as_text": True, "xla_dump_hlo_module_re": "jit_fn.*"}
        report = compile_for(plan, compiler_options=options)
        if not report.fits:
            return report, None
        heap = read_heap(dump)
    return report, {"temp_bytes": heap.size, "live_peak_bytes": heap.live_peak_bytes}


def dump_directory(root: Path | None, label: str) -> Path | None:
    """A row's own directory under `root` (its label with spaces and separators as underscores), emptied."""
    if root is None:
        return None
    directory = root / re.sub(r"[^A-Za-z0-9.]+", "_", label)
    shutil.rmtree(directory, ignore_errors=True)
    return directory


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="rows whose label contains this text")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the stored compiler figures of the rows not compiled, re-priced with today's "
        "price, and write every row to the results; with --least-hbm, the selected rows' "
        "stored figures are kept too (not compiled again) and only bisected",
    )
    parser.add_argument(
        "--least-hbm",
        action="store_true",
        help="for each selected row that fits, find the least HBM cap under which it compiles "
        f"(bisection to {LEAST_HBM_RESOLUTION * 100:g}%% of the cap) and store it beside the unconstrained figure",
    )
    parser.add_argument(
        "--keep-dumps",
        type=Path,
        help="keep each compiled row's module dump in its own directory under this one, to read with "
        "`python -m validation.peak_buffers DIR/ROW`",
    )
    args = parser.parse_args()
    if args.least_hbm and args.only and not args.reuse:
        # without --reuse a run of some rows writes no results, and the bisection's compiles would be lost
        parser.error(
            "--least-hbm with --only needs --reuse, so that the rows it measures are written beside the "
            "stored ones: add --reuse"
        )

    from cost_models.units import GiB, MiB
    from planner.estimate import estimate

    stored = {r["label"]: r for r in json.loads(RESULTS.read_text())} if args.reuse and RESULTS.exists() else {}
    rows = [r for r in ROWS if not args.only or args.only in r[0] or r[0] in stored]
    out = []
    width = max((len(r[0]) for r in rows), default=0)
    print(f"{'plan':<{width}} {'cpplan':>8} {'XLA':>8} {'error':>7} {'gaps':>7}  fits (cpplan/XLA)  compile")
    for row in rows:
        plan = plan_of(row)
        predicted = estimate(plan)
        selected = not args.only or args.only in row[0]
        reused = row[0] in stored and (not selected or args.least_hbm)
        least = stored[row[0]].get("least_hbm") if reused else None  # a new compile makes a stored one stale (below)
        if reused:  # stored: the compiler's figures as measured then
            old = stored[row[0]]
            compiled_bytes, compiled_fits, compiled_text, seconds, heap = (
                old["compiled_bytes"],
                old["compiled_fits"],
                old["compiled"],
                old["compile_s"],
                old.get("heap"),
            )
        else:
            start = time.perf_counter()
            compiled, heap = compile_with_heap(plan, dump_directory(args.keep_dumps, row[0]))
            seconds = time.perf_counter() - start
            compiled_bytes, compiled_fits, compiled_text = compiled.required_bytes, compiled.fits, str(compiled)
            if compiled_bytes == stored.get(row[0], {}).get("compiled_bytes"):  # the same program: its cap holds
                least = stored[row[0]].get("least_hbm")
        error = predicted.hbm_bytes_per_device / compiled_bytes - 1
        agree = predicted.fits == compiled_fits
        print(
            f"{row[0]:<{width}} {predicted.hbm_bytes_per_device / GiB:>7.2f}G {compiled_bytes / GiB:>7.2f}G "
            f"{error:>+7.1%} {f'{gap_share(heap):.1%}' if heap else '':>7}  "
            f"{'fits' if predicted.fits else 'no'}/{'fits' if compiled_fits else 'no'}"
            f"{'' if agree else ' DISAGREE':<9} {seconds:>5.0f} s{' (stored)' if reused else ''}",
            flush=True,
        )
        if args.least_hbm and selected and compiled_fits:
            least = least_hbm(plan, unconstrained_bytes=compiled_bytes)
            print(
                f"    least HBM it compiles in: {least['cap_mib']} MiB ({least['cap_mib'] * MiB / GiB:.2f}G, "
                f"cpplan's price {predicted.hbm_bytes_per_device / (least['cap_mib'] * MiB) - 1:+.1%} against it"
                f"{'' if least['verified'] else '; not seen to compile: the probes ran out'})",
                flush=True,
            )
        out.append(
            {
                "label": row[0],
                "plan": plan.to_dict(),
                "predicted_bytes": predicted.hbm_bytes_per_device,
                "predicted_breakdown": predicted.hbm_bytes,
                "predicted_fits": predicted.fits,
                "compiled_bytes": compiled_bytes,
                "compiled_fits": compiled_fits,
                "compiled": compiled_text,
                "error": error,
                "compile_s": seconds,
                **({"least_hbm": least} if least else {}),
                **({"heap": heap} if heap else {}),
            }
        )
        if not args.only or args.reuse:  # row by row, so a long run interrupted keeps what it measured
            RESULTS.parent.mkdir(exist_ok=True)
            later = [stored[r[0]] for r in rows[len(out) :] if r[0] in stored]  # kept if this run is cut short
            RESULTS.write_text(json.dumps(out + later, indent=1, default=float))
    within = sum(abs(r["error"]) <= TARGET_ERROR for r in out)
    agree = sum(r["predicted_fits"] == r["compiled_fits"] for r in out)
    print(
        f"\n{within} of {len(out)} within {TARGET_ERROR:.0%}; fit verdicts agree on {agree} of {len(out)}; "
        f"largest error {max((abs(r['error']) for r in out), default=0):.1%}"
    )


if __name__ == "__main__":
    main()
