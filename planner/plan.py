"""The contract between planner and runtime: a frozen, JSON round-trippable `Plan`."""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, dataclass, field, fields, replace

import numpy as np

from cost_models.case import Case, batch_split_violation
from cost_models.compute import DQ_REDUCTION_STEPS, scoped_vmem_limit_kib, splash_vmem_problem
from cost_models.errors import CpplanError
from cost_models.experts import expert_axis_problem
from cost_models.masks import AttentionMask
from cost_models.models import ModelSpec
from cost_models.placement import axis_segments, positions_along
from cost_models.pricing.offload import (
    host_bytes_needed,
    host_capacity_bytes,
    host_copy_bytes,
    host_copy_violation,
    state_bytes,
)
from cost_models.remat import CHECKPOINT_NAMES, custom_placements, offloaded_names, remat_label
from cost_models.strategies import STRATEGIES, Shape, StrategySpec
from cost_models.strategies.base import (
    all_fused,
    block_check,
    full_mask_balance_problem,
    layer_strategy,
    local_strategy_problem,
)
from cost_models.targets import Target
from cost_models.topology import DCN, DCN_DIM, Segment, Topology, get_topology
from cost_models.units import GiB, counted
from cost_models.vocabulary import AXES, DTYPE_BYTES, CPStrategy, HostState, LoadBalance, Quantization, RematPolicy

DEFAULT_BLOCK = 512
# splash attention tiles its blocks over the 128 vector lanes: a block must be a multiple of them
# (jax.experimental.pallas.ops.tpu.splash_attention, NUM_LANES = 128)
SPLASH_BLOCK_MULTIPLE = 128


@dataclass(frozen=True)
class Plan:
    """One way to lay a training step out on a slice.

    Attributes:
        model: the model's full shape.
        topology: canonical topology name, e.g. ``v5p:4x4x8``.
        seq_len: tokens per sequence.
        global_batch: sequences per step.
        mesh: ``(axis, size)`` for every axis in `AXES`, in that order. ``expert`` (MaxText's
            ici_expert_parallelism) splits a model's experts between its devices and, for everything
            else, acts as fsdp: it splits the batch and shards the weights; plan JSON written before
            the axis existed reads as ``expert=1``.
        axis_order: the logical axes from outermost to innermost as laid on the devices (JSON without
            ``expert`` reads with it outermost: an axis of one device takes no part of any dimension).
        physical_order: the topology's physical dimension names from outermost to innermost.
        cp_strategy: how attention spans the sequence shards.
        local_strategy: for a model mixing masks, the strategy of the layers whose mask is not the
            global one (sliding-window or chunked layers), on the same mesh; None: `cp_strategy` for
            every layer.
        load_balance: causal load balancing over the context axes (none for a model with a full mask,
            whose ranks all do the same work).
        remat: what the forward pass keeps for the backward pass (MaxText's policy names).
        remat_custom: under ``remat=custom``, where each checkpoint goes: ``((name, Placement),
            ...)`` for the names kept on device or offloaded to host memory (the rest are
            recomputed); a dict ``{name: "device" | "offload" | "remat"}`` is accepted. Empty for
            every other policy.
        block_q, block_kv: splash attention block sizes.
        loss_chunk_tokens: tokens per cross-entropy chunk; 0 means full logits at once.
        param_dtype: weights and gradients.
        mu_dtype: AdamW's first moment (MaxText's `mu_dtype`, optax's; bfloat16 as some recipes run
            it); the second moment is kept in `param_dtype`, as in both.
        compute_dtype: activations and matmul inputs.
        fused_attention_backward: splash's backward runs as its one fused kernel (dq formed as
            partials, one per key block, summed after the kernel) rather than a dq and a dK/dV
            kernel: faster, and the partials take memory. cpplan's runtime runs it in every layer
            whose mask is not local (a local mask's shrunk tables it cannot walk); MaxText runs it
            with its jax splash as `sa_use_fused_bwd_kernel=true`, and its tokamax splash (ring,
            USP, Ulysses) always does.
        dq_reduction_steps: MaxText's `dq_reduction_steps`: tokamax's fused backward keeps dq as this
            many rolled partials in the compute dtype rather than one fp32 partial per key block (0:
            none; 3 is the one count it accepts). What bounds MaxText's longest ring context; cpplan's
            runtime (jax's splash) has no such option, and is priced without it.
        dcn_data, dcn_fsdp: over several slices, how many slices the data and the fsdp axis span
            (MaxText's `dcn_*_parallelism`; their product is the number of slices). The mesh sizes
            are totals: each slice holds data/dcn_data × fsdp/dcn_fsdp × the other axes.
        state_on_host: the training state kept in pinned host memory between steps (MaxText's
            `parameter_memory_host_offload`, `optimizer_memory_host_offload`), in `HostState` order;
            names are accepted. cpplan's runtime keeps all of it in HBM.
        quantization: the matmuls' precision (`Quantization`).
        grad_dtype: the weight gradients' dtype where they are cast from the parameters' (MaxText's
            `grad_dtype`, e.g. bfloat16); "" for the parameters' own, the only one cpplan's runtime runs.
        expert_capacity: a mixture of experts' routing: 0, dropless (every routed copy through a grouped
            matmul: MaxText's `sparse_matmul`, cpplan's runtime); or MaxText's dense path's capacity factor
            (`sparse_matmul=False`, `capacity_factor`): each expert takes ceil(S·k/E)·factor slots per
            sequence, filled by dispatch and combine einsums over one-hot masks (cost_models/pricing/capacity.py).
        one_hot_embedding: the input embedding looked up as a matmul of the tokens' one-hot rows with the
            table (MaxText's `use_iota_embed=True`) rather than a gather of its rows: the matmul, forward and
            for the table's gradient, and the one-hot mask each writes and reads are priced
            (`cost_models.pricing.head`). cpplan's runtime gathers.
    """

    model: ModelSpec
    topology: str
    seq_len: int
    global_batch: int
    mesh: tuple[tuple[str, int], ...]
    axis_order: tuple[str, ...] = AXES
    physical_order: tuple[str, ...] = ()
    cp_strategy: CPStrategy = CPStrategy.NONE
    local_strategy: CPStrategy | None = None
    load_balance: LoadBalance = LoadBalance.NONE
    remat: RematPolicy = RematPolicy.FULL
    remat_custom: tuple = ()
    block_q: int = DEFAULT_BLOCK
    block_kv: int = DEFAULT_BLOCK
    loss_chunk_tokens: int = 0
    param_dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    mu_dtype: str = "float32"
    grad_dtype: str = ""
    dcn_data: int = 1
    dcn_fsdp: int = 1
    fused_attention_backward: bool = False
    dq_reduction_steps: int = 0
    state_on_host: tuple = ()
    quantization: Quantization = Quantization.NONE
    expert_capacity: float = 0.0
    one_hot_embedding: bool = False
    _segments: dict = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        for name in ("seq_len", "global_batch", "block_q", "block_kv", "dcn_data", "dcn_fsdp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CpplanError(f"plan {name}={value!r} must be a positive integer.")
        for name in ("block_q", "block_kv"):
            if getattr(self, name) % SPLASH_BLOCK_MULTIPLE:
                raise CpplanError(
                    f"plan {name}={getattr(self, name)} is not a multiple of {SPLASH_BLOCK_MULTIPLE}, "
                    f"as splash attention's blocks must be; use 512 (or 128, 256, 1024, 2048)."
                )
        if not isinstance(self.model, ModelSpec):
            raise CpplanError(f"plan model={self.model!r:.80} must be a ModelSpec (see cost_models.models.get_model).")
        if not isinstance(self.topology, str):
            raise CpplanError(f"plan topology={self.topology!r} must be a topology name, e.g. v5p:4x4x8 or cpu:8.")
        if not isinstance(self.mesh, tuple) or not all(
            isinstance(pair, tuple)
            and len(pair) == 2
            and isinstance(pair[1], int)
            and not isinstance(pair[1], bool)
            and pair[1] >= 1
            for pair in self.mesh
        ):
            raise CpplanError(f"plan mesh={self.mesh!r} must be (axis, positive size) pairs for {AXES}.")
        for name in ("fused_attention_backward", "one_hot_embedding"):
            if not isinstance(getattr(self, name), bool):
                raise CpplanError(f"plan {name}={getattr(self, name)!r} must be true or false.")
        steps = self.dq_reduction_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps not in (0, DQ_REDUCTION_STEPS):
            raise CpplanError(
                f"plan dq_reduction_steps={self.dq_reduction_steps!r} must be 0 (one dq partial per key block) or "
                f"{DQ_REDUCTION_STEPS}, the one count tokamax's fused backward accepts."
            )
        if (
            isinstance(self.loss_chunk_tokens, bool)
            or not isinstance(self.loss_chunk_tokens, int)
            or self.loss_chunk_tokens < 0
        ):
            raise CpplanError(f"plan loss_chunk_tokens={self.loss_chunk_tokens!r} must be 0 (full logits) or positive.")
        object.__setattr__(self, "quantization", Quantization.parse(self.quantization))
        capacity = self.expert_capacity
        if isinstance(capacity, bool) or not isinstance(capacity, (int, float)) or not 0 <= capacity < math.inf:
            raise CpplanError(
                f"plan expert_capacity={capacity!r} must be 0 (dropless: every routed copy computed) or a positive "
                f"capacity factor (MaxText's capacity_factor on its dense path, e.g. 1.25)."
            )
        if capacity and not self.model.experts:
            raise CpplanError(
                f"plan expert_capacity={capacity!r} is for a mixture of experts, and {self.model.name} has none; "
                f"leave it 0."
            )
        object.__setattr__(self, "expert_capacity", float(capacity))
        if self.grad_dtype == self.param_dtype:
            object.__setattr__(self, "grad_dtype", "")  # one spelling of "the parameters' dtype"
        for name in ("param_dtype", "compute_dtype", "mu_dtype", *(("grad_dtype",) if self.grad_dtype else ())):
            if getattr(self, name) not in DTYPE_BYTES:
                raise CpplanError(f"plan {name}={getattr(self, name)!r} is not one of {sorted(DTYPE_BYTES)}.")
        names = tuple(a for a, _ in self.mesh)
        if names == AXES[:-1] and AXES[-1] == "expert":  # a mesh written before the expert axis: one device
            object.__setattr__(self, "mesh", (*self.mesh, ("expert", 1)))
            names = AXES
        if "expert" not in self.axis_order and sorted(self.axis_order) == sorted(a for a in AXES if a != "expert"):
            # an order written before the expert axis existed: it has one device, outermost
            object.__setattr__(self, "axis_order", ("expert", *self.axis_order))
        if names != AXES:
            raise CpplanError(f"plan mesh axes {names} must be exactly {AXES}, in that order.")
        if sorted(self.axis_order) != sorted(AXES):
            raise CpplanError(f"axis_order {self.axis_order} must be a permutation of {AXES}.")
        topo = get_topology(self.topology)
        if math.prod(self.mesh_sizes) != topo.num_devices:
            raise CpplanError(
                f"mesh {self.mesh_dict} has {math.prod(self.mesh_sizes)} devices but "
                f"{topo.name} has {topo.num_devices}."
            )
        self._check_slices(topo)
        dims = tuple(d.name for d in topo.physical_dims)
        if not self.physical_order:
            object.__setattr__(self, "physical_order", dims)
        if sorted(self.physical_order) != sorted(dims):
            raise CpplanError(f"physical_order {self.physical_order} must be a permutation of {dims}.")
        object.__setattr__(self, "topology", topo.name)
        object.__setattr__(self, "cp_strategy", CPStrategy.parse(self.cp_strategy))
        if self.local_strategy is not None:
            object.__setattr__(self, "local_strategy", CPStrategy.parse(self.local_strategy))
        problem = local_strategy_problem(self.model, self.cp_strategy, self.local_strategy)
        if problem:
            raise CpplanError(f"plan {problem}.")
        object.__setattr__(self, "load_balance", LoadBalance.parse(self.load_balance))
        problem = full_mask_balance_problem(self.model, self.load_balance is LoadBalance.ZIGZAG)
        if problem:
            raise CpplanError(f"plan {problem}; plan with load_balance='none'.")
        object.__setattr__(self, "remat", RematPolicy.parse(self.remat))
        if not isinstance(self.remat_custom, (tuple, list, dict)):
            raise CpplanError(
                f"plan remat_custom={self.remat_custom!r} must map checkpoint names "
                f"({', '.join(CHECKPOINT_NAMES)}) to device, offload or remat."
            )
        object.__setattr__(self, "remat_custom", custom_placements(self.remat_custom))
        if isinstance(self.state_on_host, str) or not isinstance(self.state_on_host, (tuple, list)):
            raise CpplanError(
                f"plan state_on_host={self.state_on_host!r} must be a list of "
                f"{', '.join(h.value for h in HostState)} (or empty)."
            )
        on_host = {HostState.parse(h) for h in self.state_on_host}
        object.__setattr__(self, "state_on_host", tuple(h for h in HostState if h in on_host))
        if self.remat_custom and self.remat is not RematPolicy.CUSTOM:
            raise CpplanError(
                f"plan remat_custom places {', '.join(n for n, _ in self.remat_custom)} but remat="
                f"{self.remat.value}; per-name placements need remat=custom (or drop remat_custom)."
            )

    def _check_slices(self, topo: Topology) -> None:
        """Only data and fsdp span slices, and together they span every slice."""
        if self.dcn_data * self.dcn_fsdp != topo.num_slices:
            raise CpplanError(
                f"plan dcn_data={self.dcn_data} × dcn_fsdp={self.dcn_fsdp} must equal the "
                f"{counted(topo.num_slices, 'slice')} of {topo.name}: only the "
                f"data and fsdp axes span slices."
            )
        for axis, slices in (("data", self.dcn_data), ("fsdp", self.dcn_fsdp)):
            if self.mesh_dict[axis] % slices:
                raise CpplanError(
                    f"plan {axis}={self.mesh_dict[axis]} cannot span dcn_{axis}={slices} slices: "
                    f"make {axis} a multiple of {slices}."
                )

    @property
    def num_slices(self) -> int:
        """Slices the plan runs on (joined over DCN)."""
        return self.dcn_data * self.dcn_fsdp

    @property
    def ici_mesh_dict(self) -> dict[str, int]:
        """The mesh within one slice: data and fsdp divided by the slices they span."""
        return {
            **self.mesh_dict,
            "data": self.mesh_dict["data"] // self.dcn_data,
            "fsdp": self.mesh_dict["fsdp"] // self.dcn_fsdp,
        }

    # -- mesh --------------------------------------------------------------------------
    @property
    def mesh_dict(self) -> dict[str, int]:
        return dict(self.mesh)

    @property
    def mesh_sizes(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.mesh)

    def axis_size(self, axis: str) -> int:
        return self.mesh_dict[axis]

    @property
    def cp_degree(self) -> int:
        """Devices one sequence is split over: ring degree × Ulysses degree."""
        return self.axis_size("context") * self.axis_size("context_ulysses")

    @property
    def batch_shards(self) -> int:
        """Shards the batch's sequences are split into: data × fsdp × expert."""
        return self.axis_size("data") * self.axis_size("fsdp") * self.axis_size("expert")

    @property
    def tokens_per_device(self) -> int:
        """Tokens each device holds outside attention: its shard's sequences split over the context axes."""
        return self.global_batch * self.seq_len // (self.batch_shards * self.cp_degree)

    @property
    def scoped_vmem_limit_kib(self) -> int | None:
        """The `--xla_tpu_scoped_vmem_limit_kib` the TPU compiler needs for this plan's splash
        blocks (None: its default suffices); the runtime sets it and the MaxText export writes it."""
        return scoped_vmem_limit_kib(
            self.block_q,
            self.block_kv,
            head_dim=self.model.head_dim,
            act_bytes=DTYPE_BYTES[self.compute_dtype],
            chip=self.topology_spec.chip,
        )

    @property
    def shape(self) -> Shape:
        """What the strategy specs judge and lay out: the plan's attention case, scalars only."""
        return Shape.on_mesh(
            self.model,
            self.seq_len,
            self.mesh_dict,
            self.load_balance is LoadBalance.ZIGZAG,
            self.topology_spec.chip.kind.shares_cores,
            self.fused_attention_backward,
        )

    @property
    def strategy_spec(self) -> StrategySpec:
        """The spec of the plan's context-parallel strategy."""
        return STRATEGIES[self.cp_strategy]

    def runs_fused_backward(self, mask: AttentionMask | None = None, *, target: Target = Target.CPPLAN) -> bool:
        """Whether the splash calls of the layers with `mask` (None: the global layers') run the fused backward
        on `target`: as the strategy spec's calls for that runtime say, which the price reads too."""
        spec, shape = (
            self.strategy_spec,
            replace(self.shape, mask=mask, model=self.model.layer_model(mask or self.model.global_mask)),
        )
        kernel_calls = spec.kernel_calls if target is Target.CPPLAN else spec.maxtext_kernel_calls
        return bool(all_fused(kernel_calls(shape, spec.layout(shape))))

    @property
    def strategy_label(self) -> str:
        """The strategy's name, and the local layers' own where set: "all_gather", "all_gather+ring(local)"."""
        local = f"+{self.local_strategy.value}(local)" if self.local_strategy is not None else ""
        return self.cp_strategy.value + local

    def strategy_for(self, mask: AttentionMask) -> CPStrategy:
        """The strategy of the model's layers with `mask` (`local_strategy` for the local ones where set)."""
        return layer_strategy(self.model, mask, self.cp_strategy, self.local_strategy)

    def check(self) -> None:
        """Raises `CpplanError` when the plan cannot run: its strategy's spec refuses the case (the
        rule and its numbers), or its batch does not split over data × fsdp. The price and the
        runtime both ask this before anything else."""
        violation = self.strategy_spec.check(self.shape)
        if violation:
            raise CpplanError(f"{self.cp_strategy.value} cannot run this plan: {violation.reason}.")
        if self.local_strategy is not None:
            violation = STRATEGIES[self.local_strategy].check(self.shape)
            if violation:
                raise CpplanError(
                    f"local_strategy={self.local_strategy.value} cannot run this plan's local layers: "
                    f"{violation.reason}; the local layers share the plan's mesh."
                )
        problem = expert_axis_problem(self.model, self.axis_size("expert"))
        if problem:
            raise CpplanError(f"plan {problem}.")
        shards = self.batch_shards
        violation = batch_split_violation(self.global_batch, shards, with_expert=self.model.experts is not None)
        if violation:
            raise CpplanError(f"{violation.reason}; use a multiple of {shards}.")
        self._check_host_memory()
        problem = splash_vmem_problem(
            self.block_q,
            self.block_kv,
            head_dim=self.model.head_dim,
            act_bytes=DTYPE_BYTES[self.compute_dtype],
            chip=self.topology_spec.chip,
        )
        if problem:
            raise CpplanError(f"{problem}; use smaller block_q/block_kv.")
        for mask, _ in self.model.layer_masks:
            strategy = self.strategy_for(mask)
            problem = block_check(
                STRATEGIES[strategy],
                replace(self.shape, mask=mask, model=self.model.layer_model(mask)),
                self.block_q,
                self.block_kv,
            )
            if problem:
                raise CpplanError(f"{strategy.value}'s splash calls on this plan: {problem}.")

    def _check_host_memory(self) -> None:
        """The activations the remat policy offloads and the state kept on the host fit in the host memory
        of a device, and the TPU compiler makes the layer loop's copies of them."""
        if not self.offloaded and not self.state_on_host:
            return
        topo = self.topology_spec
        tokens = self.global_batch * self.seq_len / (self.batch_shards * self.cp_degree)
        tensor, act_bytes = self.axis_size("tensor"), DTYPE_BYTES[self.compute_dtype]
        activations = host_bytes_needed(
            self.model, self.remat, self.remat_custom, tokens_per_device=tokens, tensor=tensor, act_bytes=act_bytes
        )
        sizes = state_bytes(
            self.model,
            weight_shards=math.prod(self.mesh_sizes) / self.axis_size("data"),
            param_bytes=DTYPE_BYTES[self.param_dtype],
            mu_bytes=DTYPE_BYTES[self.mu_dtype],
        )
        held = {f"remat {self.remat.value} offloads {', '.join(self.offloaded)}": activations} if self.offloaded else {}
        held |= {f"the {h.value} on the host": sizes[h] for h in self.state_on_host}
        need, have = sum(held.values()), host_capacity_bytes(topo)
        if need > have:
            parts = "; ".join(f"{what}: {size / GiB:.1f} GiB" for what, size in held.items())
            raise CpplanError(
                f"{parts}: {need / GiB:.1f} GiB of host memory per device > the {have / GiB:.1f} GiB a "
                f"{topo.chip.name} host has per device; offload less, or split the tokens and the state over "
                f"more devices."
            )
        copy = host_copy_bytes(
            self.model,
            self.remat,
            self.remat_custom,
            chip=topo.chip,
            tokens_per_device=tokens,
            tensor=tensor,
            act_bytes=act_bytes,
        )
        violation = host_copy_violation(copy)
        if violation:
            raise CpplanError(f"remat {self.remat_label} {violation}.")

    @property
    def remat_label(self) -> str:
        """The remat policy's name; a custom one's with its placements."""
        return remat_label(self.remat, self.remat_custom)

    @property
    def offloaded(self) -> tuple[str, ...]:
        """The checkpoint names the plan's remat policy offloads to host memory."""
        return offloaded_names(self.remat, self.remat_custom)

    @property
    def topology_spec(self) -> Topology:
        return get_topology(self.topology)

    @property
    def case(self) -> Case:
        """The model, topology, sequence length and batch the plan trains."""
        return Case(self.model, self.topology_spec, self.seq_len, self.global_batch)

    def segments(self) -> dict[str, tuple[Segment, ...]]:
        """Which physical dimensions each logical axis spans (indices into the topology's dims)."""
        if self._segments is None:
            topo = self.topology_spec
            names = [d.name for d in topo.physical_dims]
            order = [names.index(n) for n in self.physical_order]
            sizes = self.ici_mesh_dict
            segs = axis_segments(
                tuple(sizes[a] for a in self.axis_order), tuple(topo.physical_dims[i].size for i in order)
            )
            if segs is None:
                raise CpplanError(
                    f"axis sizes {[sizes[a] for a in self.axis_order]} (order {self.axis_order}) "
                    f"do not tile the dimensions {self.physical_order} of {topo.name}."
                )
            # segment dims index the physical order; map them back to the topology's own indices
            mapped = {
                axis: tuple(Segment(order[s.dim], s.size, s.stride) for s in axis_segs)
                for axis, axis_segs in zip(self.axis_order, segs)
            }
            # data and fsdp span slices outermost, across DCN
            for axis, slices in (("data", self.dcn_data), ("fsdp", self.dcn_fsdp)):
                if slices > 1:
                    mapped[axis] += (Segment(DCN_DIM, slices, 1),)
            object.__setattr__(self, "_segments", mapped)
        return self._segments

    def axis_dims(self) -> dict[str, str]:
        """Human form of the placement, e.g. ``{'context': 'z(8)·y(2)'}``, innermost first."""
        names = {DCN_DIM: DCN, **{i: d.name for i, d in enumerate(self.topology_spec.physical_dims)}}
        return {
            axis: "·".join(f"{names[s.dim]}({s.size}{'' if s.stride == 1 else f'/{s.stride}'})" for s in segs)
            for axis, segs in self.segments().items()
            if segs
        }

    def device_positions(self) -> np.ndarray:
        """Each device's index along every axis of `AXES`, by where the device lies: an array of shape
        (slices, *physical dimension sizes, len(AXES)), read off `segments`. Slice s is data's DCN
        index s // dcn_fsdp and fsdp's s % dcn_fsdp, the order in which the runtime's mesh stacks slices."""
        where = np.indices([self.num_slices, *(d.size for d in self.topology_spec.physical_dims)])
        dcn = {"data": where[0] // self.dcn_fsdp, "fsdp": where[0] % self.dcn_fsdp}
        return np.stack(
            [
                positions_along(self.segments()[axis], np.stack([*where[1:], dcn.get(axis, 0 * where[0])], axis=-1))
                for axis in AXES
            ],
            axis=-1,
        )

    # -- JSON --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return (
            {
                "model": self.model.to_dict(),
                "topology": self.topology,
                "seq_len": self.seq_len,
                "global_batch": self.global_batch,
                "mesh": dict(self.mesh),
                "axis_order": list(self.axis_order),
                "physical_order": list(self.physical_order),
                "cp_strategy": self.cp_strategy.value,
                "load_balance": self.load_balance.value,
                "remat": self.remat.value,
                "block_q": self.block_q,
                "block_kv": self.block_kv,
                "loss_chunk_tokens": self.loss_chunk_tokens,
                "param_dtype": self.param_dtype,
                "compute_dtype": self.compute_dtype,
                "mu_dtype": self.mu_dtype,
            }
            | ({"remat_custom": {n: p.value for n, p in self.remat_custom}} if self.remat is RematPolicy.CUSTOM else {})
            | ({"dcn_data": self.dcn_data, "dcn_fsdp": self.dcn_fsdp} if self.num_slices > 1 else {})
            | ({"fused_attention_backward": True} if self.fused_attention_backward else {})
            | ({"dq_reduction_steps": self.dq_reduction_steps} if self.dq_reduction_steps else {})
            | ({"local_strategy": self.local_strategy.value} if self.local_strategy is not None else {})
            | ({"state_on_host": [h.value for h in self.state_on_host]} if self.state_on_host else {})
            | ({"quantization": self.quantization.value} if self.quantization is not Quantization.NONE else {})
            | ({"expert_capacity": self.expert_capacity} if self.expert_capacity else {})
            | ({"grad_dtype": self.grad_dtype} if self.grad_dtype else {})
            | ({"one_hot_embedding": True} if self.one_hot_embedding else {})
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, row: dict) -> "Plan":
        """A plan from its JSON form (`to_dict`).

        Raises:
            CpplanError: not an object, a missing or unknown key, or a value of the wrong type or range.
        """
        if not isinstance(row, dict):
            raise CpplanError(
                f"a plan is a JSON object (as `cpplan export --format json` writes), not {type(row).__name__}."
            )
        keys = [f.name for f in fields(cls) if f.init]
        required = [f.name for f in fields(cls) if f.init and f.default is MISSING]
        missing, extra = [k for k in required if k not in row], sorted(set(row) - set(keys))
        if missing or extra:
            raise CpplanError(f"plan keys: missing {missing}, unknown {extra}; a plan has {', '.join(keys)}.")
        row = dict(row)
        row["model"] = ModelSpec.from_dict(row["model"])
        mesh = row["mesh"]
        if not isinstance(mesh, dict) or set(mesh) - set(AXES):
            raise CpplanError(f"plan mesh={mesh!r} must be an object of axis sizes with axes among {AXES}.")
        row["mesh"] = tuple((a, mesh.get(a, 1)) for a in AXES)
        for name in ("axis_order", "physical_order"):
            if name in row:
                if not isinstance(row[name], list) or not all(isinstance(a, str) for a in row[name]):
                    raise CpplanError(f"plan {name}={row[name]!r} must be a list of axis names.")
                row[name] = tuple(row[name])
        return cls(**row)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        """A plan from JSON text (`to_json`).

        Raises:
            CpplanError: text that is not JSON, or not a plan (see `from_dict`).
        """
        if not isinstance(text, (str, bytes, bytearray)):
            raise CpplanError(
                f"Plan.from_json takes JSON text, not {type(text).__name__}; a dict goes to Plan.from_dict."
            )
        try:
            row = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as err:
            raise CpplanError(f"a plan must be JSON as `cpplan export --format json` writes it: {err}.") from None
        return cls.from_dict(row)

    # -- MaxText -----------------------------------------------------------------------
    def to_maxtext(self) -> dict[str, object]:
        """The MaxText flags that run this plan (see `planner.maxtext`)."""
        from planner.maxtext import plan_to_maxtext

        return plan_to_maxtext(self)

    @classmethod
    def from_maxtext(cls, flags: "dict | str", **kwargs) -> "Plan":
        """A plan from MaxText flags (a dict or `key=value` text); see `planner.maxtext`."""
        from planner.maxtext import plan_from_maxtext

        return plan_from_maxtext(flags, **kwargs)


def make_mesh(**sizes: int) -> tuple[tuple[str, int], ...]:
    """A plan mesh from axis sizes by name; missing axes are 1."""
    unknown = set(sizes) - set(AXES)
    if unknown:
        raise CpplanError(f"unknown mesh axes {sorted(unknown)}; the axes are {AXES}.")
    return tuple((a, int(sizes.get(a, 1))) for a in AXES)
