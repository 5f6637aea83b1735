"""The price of one training step (forward, backward, AdamW) under a plan.

One vectorised implementation serves both the search (thousands of candidates as numpy
columns) and a single plan (`estimate(plan)`, one row). Terms follow the scaling book:
T_math (MXU work, tile padding and splash block waste included), T_hbm (elementwise work and
the optimizer, bandwidth bound), T_comms per collective; overlap is explicit: ring hops hide
behind the attention of the block in hand, FSDP gathers behind the previous layer, both within
one budget (the layer's compute, counted once); the rest is exposed. `Estimate` carries the lower bound (max of the three) and upper bound (their sum) too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from cost_models.collectives import Collectives
from cost_models.compute import (SPLASH_BACKWARD_OVER_FORWARD, causal_attention_extent, splash_smem_bytes,
                                 splash_step_costs, tile_efficiency)
from cost_models.flops import head_forward_flops, layer_forward_flops, model_flops_per_step
from cost_models.models import ModelSpec
from cost_models.remat import remat_code, remat_table
from cost_models.errors import CpplanError
from cost_models.strategies import STRATEGIES, Shape
from cost_models.units import mfu
from cost_models.topology import AxisLinks, Topology, get_topology
from cost_models.vocabulary import DTYPE_BYTES, CPStrategy, LoadBalance
from cost_models.work_layout import MLP_CHUNK_TOKENS, WEIGHT_ARRAYS_PER_LAYER, vocab_pieces

ADAMW_BYTES_PER_PARAM = 7 * 4 + 6  # read p, g, m, v and write p, m, v in fp32; a bf16 copy of p
ELEMENTWISE_PASSES_BACKWARD = 2.0  # backward of an elementwise op reads the input and the output grad, writes one grad
CE_BYTES_PER_LOGIT = 4 * 4  # fp32 logits: written, read for the log-sum-exp, gradient written and read

# HBM is held in phases: what lives all step, then the larger of a layer's backward and the loss.
STATIC_MEMORY = ("params", "grads", "optimizer", "activations")
LAYER_MEMORY = ("layer_working_set", "attention_buffers", "collective_buffers")
LOSS_MEMORY = ("logits", "head_buffers")


def peak_bytes(memory: dict):
    """Peak HBM per device: the static part plus the larger of the two phases (arrays or floats)."""
    static = sum(memory[k] for k in STATIC_MEMORY)
    return static + np.maximum(sum(memory[k] for k in LAYER_MEMORY), sum(memory[k] for k in LOSS_MEMORY))


class LinkColumns(NamedTuple):
    """The links a collective group gets, one entry per candidate."""

    bw: np.ndarray  # bytes/s
    latency: np.ndarray  # s


@dataclass(frozen=True)
class Candidates:
    """Candidates as columns: one strategy, any number of meshes × placements × remat × balancing.

    Mesh sizes, blocks and link figures are float arrays (one entry per candidate); lists are
    accepted and converted.
    """

    model: ModelSpec
    topology: Topology
    seq_len: int
    global_batch: int
    strategy: CPStrategy
    data: np.ndarray
    fsdp: np.ndarray
    ring: np.ndarray  # size of the `context` axis
    ulysses: np.ndarray  # size of the `context_ulysses` axis
    tensor: np.ndarray
    remat: np.ndarray  # codes into cost_models.remat.POLICIES
    zigzag: np.ndarray
    block_q: np.ndarray  # splash query block
    block_kv: np.ndarray  # splash key/value block
    links: dict[str, LinkColumns]  # collective group (data, weights, tensor, context, ulysses) → links
    ring_link: LinkColumns  # one ppermute step along `context`
    loss_chunk_tokens: int = 0
    act_bytes: int = 2
    param_bytes: int = 4

    def __post_init__(self):
        # a frozen dataclass converts its own declared fields through object.__setattr__
        for name in ("data", "fsdp", "ring", "ulysses", "tensor", "block_q", "block_kv"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=float))
        object.__setattr__(self, "zigzag", np.asarray(self.zigzag, dtype=bool))
        object.__setattr__(self, "remat", np.asarray(self.remat, dtype=int))
        object.__setattr__(self, "links", {name: LinkColumns(*(np.asarray(c, dtype=float) for c in link))
                                           for name, link in self.links.items()})
        object.__setattr__(self, "ring_link", LinkColumns(*(np.asarray(c, dtype=float) for c in self.ring_link)))

    @property
    def sequences_per_device(self) -> np.ndarray:
        """Sequences each batch shard (data × fsdp) holds."""
        return self.global_batch / (self.data * self.fsdp)

    @property
    def tokens_per_device(self) -> np.ndarray:
        """Tokens each device holds outside attention: its sequences split over both context axes."""
        return self.sequences_per_device * self.seq_len / (self.ring * self.ulysses)

    @property
    def shared_cores(self) -> bool:
        """Whether the devices share a host's cores (work then moves to whichever device is busy)."""
        return self.topology.chip.kind.shares_cores

    @property
    def comm(self) -> Collectives:
        """The collective formulas of this chip row."""
        return Collectives(self.topology.chip.host_collectives)

    @property
    def context_link(self) -> LinkColumns:
        """Links of a collective over the `context` axis."""
        return self.links["context"]

    @property
    def ulysses_link(self) -> LinkColumns:
        """Links of a collective over the `context_ulysses` axis."""
        return self.links["ulysses"]


@dataclass
class Priced:
    """Per-candidate columns of times (s) and bytes; see `Estimate` for their meaning."""

    step_time_s: np.ndarray
    compute_s: dict[str, np.ndarray]
    hbm_s: dict[str, np.ndarray]
    comm_s: dict[str, np.ndarray]
    exposed_s: dict[str, np.ndarray]
    memory: dict[str, np.ndarray]
    smem_bytes: np.ndarray
    model_flops: float
    executed_flops: np.ndarray  # per device, remat recomputation and splash's whole blocks included

    @property
    def hbm_total(self) -> np.ndarray:
        return peak_bytes(self.memory)


def price(x: Candidates) -> Priced:
    """Prices every candidate in `x` (all of one strategy)."""
    m, topo = x.model, x.topology
    chip = topo.chip
    peak = topo.peak_flops_per_device
    hbm_bw = topo.hbm_bw_per_device
    tile = chip.mxu_tile
    a, pb = x.act_bytes, x.param_bytes
    L = m.num_layers
    remat = remat_table(m)
    strategy = STRATEGIES[x.strategy]

    # -- matmuls (per layer, per device) --------------------------------------------
    layer = layer_forward_flops(m, x.seq_len, x.tokens_per_device)
    eff = chip.matmul_efficiency
    qkv_eff = tile_efficiency(m.hidden, tile) * tile_efficiency((m.num_heads + 2 * m.num_kv_heads) * m.head_dim / x.tensor, tile)
    out_eff = tile_efficiency(m.num_heads * m.head_dim / x.tensor, tile) * tile_efficiency(m.hidden, tile)
    mlp_eff = tile_efficiency(m.hidden, tile) * tile_efficiency(m.intermediate / x.tensor, tile)
    qkv_out_s = (layer.qkv / qkv_eff + layer.out_proj / out_eff) / x.tensor / (peak * eff)
    mlp_s = layer.mlp / mlp_eff / x.tensor / (peak * eff)
    weights_bytes = m.params_per_layer * a / x.tensor
    mm_fwd = np.maximum(qkv_out_s + mlp_s, weights_bytes / hbm_bw)
    # backward: dX and dW matmuls (twice the forward), reading weights twice, writing fp32 grads
    mm_bwd = np.maximum(2 * (qkv_out_s + mlp_s), (2 * weights_bytes + m.params_per_layer * pb / x.tensor) / hbm_bw)
    mm_recompute = remat.recompute_qkv_out[x.remat] * qkv_out_s + remat.recompute_mlp[x.remat] * mlp_s

    # -- attention ------------------------------------------------------------------
    lay = strategy.layout(x)
    # the virtual devices of a host share its cores: an idle rank's share goes to the busy ones,
    # so the step costs the average rank's work (the balanced extent), not the busiest rank's
    extent = causal_attention_extent(x.seq_len, lay.ring, x.zigzag | x.shared_cores, x.block_q)
    attn_eff = chip.attention_efficiency * tile_efficiency(m.head_dim, tile)
    attn_exec_fwd = 4.0 * x.sequences_per_device * lay.q_heads * m.head_dim * extent
    attn_math_fwd = attn_exec_fwd / (peak * attn_eff)
    # the kernels' grids visit every (q block × kv block) of every call, computed or skipped
    grid_fwd = grid_bwd = 0.0
    for call in strategy.kernel_calls(x, lay):
        fwd, bwd = splash_step_costs(x.sequences_per_device * lay.q_heads, x.sequences_per_device * lay.kv_heads, call.q_len, call.kv_len,
                                     m.head_dim, a, np.minimum(x.block_q, call.q_block_cap), x.block_q,
                                     chip.attention_block_overhead_s, chip.attention_step_s_per_operand_byte,
                                     chip.attention_masked_element_s, call.causal)
        grid_fwd = grid_fwd + call.count * fwd
        grid_bwd = grid_bwd + call.count * bwd
    attn_fwd = attn_math_fwd + grid_fwd
    attn_bwd = SPLASH_BACKWARD_OVER_FORWARD * attn_math_fwd + grid_bwd
    attn_recompute = remat.recompute_attention[x.remat] * attn_fwd

    # -- elementwise (HBM bound) ----------------------------------------------------
    # norms and residual adds on full-width activations (every tensor shard holds them whole, as
    # the runtime keeps them); RoPE and SwiGLU on tensor-split heads and columns
    ew_fwd = x.tokens_per_device * (10 * m.hidden + (2 * (m.num_heads + m.num_kv_heads) * m.head_dim + 3 * m.intermediate) / x.tensor) \
        * a / hbm_bw
    ew_bwd = ELEMENTWISE_PASSES_BACKWARD * ew_fwd
    ew_recompute = np.where(remat.recompute_qkv_out[x.remat] > 0, ew_fwd,
                            remat.recompute_mlp[x.remat] * x.tokens_per_device * 3 * m.intermediate * a / x.tensor / hbm_bw)

    fwd_layer = mm_fwd + attn_fwd + ew_fwd
    bwd_layer = mm_bwd + attn_bwd + ew_bwd + mm_recompute + attn_recompute + ew_recompute

    # -- output head and loss -------------------------------------------------------
    head_passes = 3 + (1 if x.loss_chunk_tokens else 0)  # chunked loss recomputes each chunk's logits
    head_eff = tile_efficiency(m.hidden, tile) * tile_efficiency(m.vocab / x.tensor, tile)
    head_s = head_passes * head_forward_flops(m, x.tokens_per_device) / x.tensor / head_eff / (peak * eff)
    ce_s = x.tokens_per_device * m.vocab / x.tensor * CE_BYTES_PER_LOGIT / hbm_bw

    # -- memory (bytes per device) --------------------------------------------------
    g = x.fsdp * x.ring * x.ulysses  # weight-sharding group
    shard = g * x.tensor
    saved = (remat.saved_full_width[x.remat] + remat.saved_split[x.remat] / x.tensor) * a
    # one layer's backward: its attention-side activations for every token, the MLP's for one
    # chunk of tokens unless the policy keeps MLP outputs; each with its gradient
    attention_side = (3 * m.hidden + (2 * m.num_heads + 2 * m.num_kv_heads) * m.head_dim / x.tensor) * a
    mlp_side = (2 * m.intermediate / x.tensor + m.hidden) * a
    mlp_tokens = np.where(remat.recompute_mlp[x.remat] > 0, np.minimum(MLP_CHUNK_TOKENS, x.tokens_per_device), x.tokens_per_device)
    loss_tokens = np.minimum(x.loss_chunk_tokens or np.inf, x.tokens_per_device)
    head_piece = np.vectorize(lambda t: (m.vocab // int(t)) / vocab_pieces(m.vocab // int(t)), otypes=[float])(x.tensor)
    embed = m.vocab * m.hidden  # the input embedding: rows over the weight-sharding group only
    largest_matrix = m.hidden * max(m.intermediate, m.num_heads * m.head_dim) / x.tensor
    memory = {
        "params": ((m.num_params - embed) / shard + embed / g) * pb,
        "grads": ((m.num_params - embed) / shard + embed / g) * pb,
        "optimizer": ((m.num_params - embed) / shard + embed / g) * 2 * 4,
        "activations": L * x.tokens_per_device * saved,  # what each layer keeps for its backward
        "layer_working_set": 2 * (x.tokens_per_device * attention_side + mlp_tokens * mlp_side),
        "attention_buffers": None,
        # weights are gathered matrix by matrix: the one in use, the next one arriving, and the
        # unreduced fp32 gradient of one matrix on its way to the reduce-scatter
        "collective_buffers": largest_matrix * (2 * a + pb),
        # fp32 logits of one chunk of tokens against one piece of the vocabulary (the gradient
        # formed in place, fused with the softmax)
        "logits": loss_tokens * head_piece * 4,
        "head_buffers": m.hidden * head_piece * (pb + 4),  # the gathered head piece and its fp32 gradient
    }

    # -- communication --------------------------------------------------------------
    wbw, wlat = x.links["weights"]
    # one collective per weight array: the bytes of the whole layer, the latency of each array
    per_array = WEIGHT_ARRAYS_PER_LAYER
    gather = per_array * x.comm.all_gather(weights_bytes / per_array, g, wbw, wlat)
    scatter = per_array * x.comm.reduce_scatter(m.params_per_layer * pb / x.tensor / per_array, g, wbw, wlat)
    embed_bytes = m.embedding_params * a / x.tensor
    embed_comm = 2 * x.comm.all_gather(embed_bytes, g, wbw, wlat) + x.comm.reduce_scatter(
        m.embedding_params * pb / x.tensor, g, wbw, wlat)

    tbw, tlat = x.links["tensor"]
    tp_one = x.comm.all_gather(x.tokens_per_device * m.hidden * a, x.tensor, tbw, tlat)
    tp = L * tp_one * (8 + remat.recompute_tensor_collectives[x.remat])

    dbw, dlat = x.links["data"]
    dp = x.comm.all_reduce(m.num_params * pb / shard, x.data, dbw, dlat)

    cp = strategy.cost(x, lay, attn_fwd)
    recompute_attn = remat.recompute_attention[x.remat]
    overlaps = chip.comm_overlaps_compute
    cp_fwd = cp.forward_s
    cp_fwd_exposed = cp.exposed_forward_s if overlaps else cp_fwd
    cp_bwd = cp.backward_s + recompute_attn * (cp.forward_s - cp.recompute_reuses_s)
    cp_bwd_exposed = (cp.exposed_backward_s + recompute_attn * (cp.exposed_forward_s - cp.recompute_reuses_s)
                      if overlaps else cp_bwd)
    cp_total = L * (cp_fwd + cp_bwd)
    cp_exposed = L * (cp_fwd_exposed + cp_bwd_exposed)
    # FSDP traffic and the strategy's hidden traffic share one window: the layer's compute.
    # What does not fit in it is exposed (charged to FSDP, which the strategy's hiding left no room for).
    window_fwd, window_bwd = (fwd_layer, bwd_layer) if overlaps else (0.0, 0.0)
    fsdp_exposed = L * (np.maximum(0.0, gather + (cp_fwd - cp_fwd_exposed) - window_fwd)
                        + np.maximum(0.0, gather + scatter + (cp_bwd - cp_bwd_exposed) - window_bwd))
    memory["attention_buffers"] = cp.buffer_bytes + x.sequences_per_device * lay.q_len * lay.q_heads * 4

    compute = {
        "matmul": L * (qkv_out_s * (1 + 2 + remat.recompute_qkv_out[x.remat]) +
                       mlp_s * (1 + 2 + remat.recompute_mlp[x.remat])) + head_s,
        "attention": L * (attn_fwd + attn_bwd + attn_recompute),
    }
    matmul_hbm_extra = L * (mm_fwd + mm_bwd - 3 * (qkv_out_s + mlp_s))  # where weight reads outlast the math
    hbm = {
        "elementwise": L * (ew_fwd + ew_bwd + ew_recompute) + ce_s,
        "matmul_weight_reads": matmul_hbm_extra,
        "optimizer": m.num_params / shard * ADAMW_BYTES_PER_PARAM / hbm_bw,
    }
    comm = {
        "fsdp_all_gather": L * 2 * gather + embed_comm * 2 / 3,
        "fsdp_reduce_scatter": L * scatter + embed_comm / 3,
        "tensor": tp,
        "data_all_reduce": dp,
        "context": cp_total,
    }
    exposed = {
        "fsdp": fsdp_exposed + embed_comm,
        "tensor": tp,
        "data_all_reduce": dp,
        "context": cp_exposed,
    }
    step = (L * (fwd_layer + bwd_layer) + head_s + ce_s + hbm["optimizer"] + sum(exposed.values()))
    executed = (L * ((layer.qkv + layer.out_proj) / x.tensor * (3 + remat.recompute_qkv_out[x.remat])
                     + layer.mlp / x.tensor * (3 + remat.recompute_mlp[x.remat])
                     + attn_exec_fwd * (1 + SPLASH_BACKWARD_OVER_FORWARD + remat.recompute_attention[x.remat]))
                + head_passes * head_forward_flops(m, x.tokens_per_device) / x.tensor)
    smem = splash_smem_bytes(lay.q_len, lay.kv_len, x.block_q)
    return Priced(step, compute, hbm, comm, exposed, memory, smem,
                  model_flops_per_step(m, x.seq_len, x.global_batch), executed)


@dataclass(frozen=True)
class Estimate:
    """The named price of one plan.

    Times are seconds per step; bytes are per device. `exposed_s` is the communication the
    step waits for (not hidden behind compute); `step_time_s` = compute + HBM-bound work +
    exposed communication.
    """

    step_time_s: float
    compute_s: dict[str, float]
    hbm_s: dict[str, float]
    comm_s: dict[str, float]
    exposed_s: dict[str, float]
    hbm_bytes: dict[str, float]
    hbm_capacity_bytes: int
    smem_bytes: float
    smem_capacity_bytes: int
    model_flops: float
    executed_flops_per_device: float
    tokens_per_step: int
    num_devices: int
    num_chips: int
    peak_flops_per_device: float
    cp_collective: str
    notes: tuple[str, ...] = field(default=())

    @property
    def hbm_bytes_per_device(self) -> float:
        """Peak: static state plus the larger of a layer's backward and the loss (`peak_bytes`)."""
        return float(peak_bytes(self.hbm_bytes))

    @property
    def headroom_bytes(self) -> float:
        return self.hbm_capacity_bytes - self.hbm_bytes_per_device

    @property
    def fits(self) -> bool:
        smem_ok = self.smem_capacity_bytes == 0 or self.smem_bytes <= self.smem_capacity_bytes
        return self.hbm_bytes_per_device <= self.hbm_capacity_bytes and smem_ok

    @property
    def mfu(self) -> float:
        return mfu(self.model_flops, self.step_time_s, self.num_devices, self.peak_flops_per_device)

    @property
    def tokens_per_s_per_chip(self) -> float:
        return self.tokens_per_step / self.step_time_s / self.num_chips

    @property
    def t_math_s(self) -> float:
        return float(sum(self.compute_s.values()))

    @property
    def t_hbm_s(self) -> float:
        return float(sum(self.hbm_s.values()))

    @property
    def t_comms_s(self) -> float:
        return float(sum(self.comm_s.values()))

    @property
    def lower_bound_s(self) -> float:
        """Perfect overlap: the largest of T_math, T_hbm and the busiest collective family
        (families run on different axes at once, so their sum is no bound)."""
        return max(self.t_math_s, self.t_hbm_s, max(self.comm_s.values()))

    @property
    def upper_bound_s(self) -> float:
        """No overlap at all."""
        return self.t_math_s + self.t_hbm_s + self.t_comms_s

    @property
    def bottleneck(self) -> str:
        """The largest single term of the step: a compute kind, HBM-bound work, or exposed traffic."""
        terms = {f"compute ({k})": v for k, v in self.compute_s.items()}
        terms["HBM-bound work"] = self.t_hbm_s
        terms.update({f"exposed {k} communication": v for k, v in self.exposed_s.items()})
        return max(terms, key=terms.get)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_time_s": self.step_time_s, "mfu": self.mfu, "tokens_per_s_per_chip": self.tokens_per_s_per_chip,
            "fits": self.fits, "bottleneck": self.bottleneck,
            "compute_s": self.compute_s, "hbm_s": self.hbm_s, "comm_s": self.comm_s, "exposed_s": self.exposed_s,
            "lower_bound_s": self.lower_bound_s, "upper_bound_s": self.upper_bound_s,
            "hbm_bytes": self.hbm_bytes, "hbm_bytes_per_device": self.hbm_bytes_per_device,
            "hbm_capacity_bytes": self.hbm_capacity_bytes, "smem_bytes": self.smem_bytes,
            "smem_capacity_bytes": self.smem_capacity_bytes, "model_flops": self.model_flops,
            "executed_flops_per_device": self.executed_flops_per_device,
            "tokens_per_step": self.tokens_per_step, "cp_collective": self.cp_collective, "notes": list(self.notes),
        }


def estimate_row(priced: Priced, i: int, x: Candidates) -> Estimate:
    """The `Estimate` of row `i` of a priced batch."""
    topo = x.topology

    def pick(d):
        return {k: float(np.broadcast_to(v, priced.step_time_s.shape)[i]) for k, v in d.items()}

    return Estimate(
        step_time_s=float(priced.step_time_s[i]), compute_s=pick(priced.compute_s), hbm_s=pick(priced.hbm_s),
        comm_s=pick(priced.comm_s), exposed_s=pick(priced.exposed_s), hbm_bytes=pick(priced.memory),
        hbm_capacity_bytes=topo.hbm_bytes_per_device, smem_bytes=float(priced.smem_bytes[i]),
        smem_capacity_bytes=topo.chip.smem_bytes, model_flops=priced.model_flops,
        executed_flops_per_device=float(priced.executed_flops[i]),
        tokens_per_step=x.seq_len * x.global_batch, num_devices=topo.num_devices, num_chips=topo.num_chips,
        peak_flops_per_device=topo.peak_flops_per_device, cp_collective=STRATEGIES[x.strategy].collective,
    )


def link_columns(links: dict[str, list[AxisLinks]]) -> tuple[dict[str, LinkColumns], LinkColumns]:
    """Columns of bandwidth and latency from per-candidate `AxisLinks`, and the ring links of `context`."""
    cols = {name: LinkColumns(np.array([l.collective_bw_bytes_per_s for l in ls]),
                              np.array([l.collective_latency_s for l in ls]))
            for name, ls in links.items()}
    ctx = links["context"]
    return cols, LinkColumns(np.array([l.ring_bw_bytes_per_s for l in ctx]), np.array([l.ring_latency_s for l in ctx]))


def group_links(links_of, segs: dict) -> dict[str, AxisLinks]:
    """The links each collective group gets from the axes' segments (`links_of` prices segments)."""
    return {
        "data": links_of(segs["data"]),
        "weights": links_of(segs["fsdp"] + segs["context"] + segs["context_ulysses"]),
        "tensor": links_of(segs["tensor"]),
        "context": links_of(segs["context"]),
        "ulysses": links_of(segs["context_ulysses"]),
    }


def plan_links(plan) -> dict[str, AxisLinks]:
    """The links each collective group of a plan gets from its placement."""
    return group_links(get_topology(plan.topology).links, plan.segments())


def estimate(plan) -> Estimate:
    """Prices one plan (a `planner.Plan` or anything with its attributes).

    Raises:
        CpplanError: the plan's mesh does not tile its topology, or its strategy cannot run it
            (the rule and its numbers).
    """
    topo = get_topology(plan.topology)
    mesh = dict(plan.mesh)
    shape = Shape(plan.model, plan.seq_len, mesh["context"], mesh["context_ulysses"], mesh["tensor"],
                  plan.load_balance is LoadBalance.ZIGZAG)
    violation = STRATEGIES[plan.cp_strategy].check(shape)
    if violation:
        raise CpplanError(f"{plan.cp_strategy.value} cannot run this plan: {violation.reason}.")
    if plan.global_batch % (mesh["data"] * mesh["fsdp"]):
        raise CpplanError(f"global_batch={plan.global_batch} sequences not divisible by "
                          f"data×fsdp={mesh['data'] * mesh['fsdp']}.")
    links, ring_link = link_columns({k: [v] for k, v in plan_links(plan).items()})
    x = Candidates(
        model=plan.model, topology=topo, seq_len=plan.seq_len, global_batch=plan.global_batch,
        strategy=plan.cp_strategy, data=[mesh["data"]], fsdp=[mesh["fsdp"]], ring=[mesh["context"]],
        ulysses=[mesh["context_ulysses"]], tensor=[mesh["tensor"]], remat=[remat_code(plan.remat)],
        zigzag=[plan.load_balance is LoadBalance.ZIGZAG], block_q=[plan.block_q], block_kv=[plan.block_q],
        links=links, ring_link=ring_link, loss_chunk_tokens=plan.loss_chunk_tokens,
        act_bytes=DTYPE_BYTES[plan.compute_dtype], param_bytes=DTYPE_BYTES[plan.param_dtype],
    )
    return estimate_row(price(x), 0, x)
