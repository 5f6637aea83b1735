"""Plans as MaxText 0.2.5 flags and back, so a user can run a plan or price the config they run today.

Mapping (MaxText's base.yml names): `ici_{data,fsdp,tensor,expert}_parallelism`; the ring (or
all-gather) degree is `ici_context_parallelism`; plain Ulysses also uses
`ici_context_parallelism` for its degree; USP puts the Ulysses degree in
`ici_context_usp_ulysses_parallelism` and the ring degree in `ici_context_parallelism`.
MaxText picks the device order itself, so a plan's placement does not travel: a plan read back
gets the topology's natural order. Over several slices the `ici_*` degrees are one slice's;
`dcn_data_parallelism` and `dcn_fsdp_parallelism` say how many slices data and fsdp span (the
plan's mesh sizes are their products), and `num_slices` how many slices there are; MaxText's
other `dcn_*` axes must be 1, as the planner keeps context and tensor inside a slice.

Export (`export_maxtext`) describes the plan that was explained, priced for MaxText
(`cost_models.targets`): where MaxText needs other splash blocks the plan exported has them and
says so. The training flags and the ahead-of-time `compile_topology*` flags (train_compile only)
are kept apart. Masks travel where MaxText runs them (`cost_models.strategies.base.maxtext_mask_problems`
refuses the rest by name): sliding-window layers five in six through its gemma3 block
(`decoder_block=gemma3 sliding_window_size=W`), packed documents as `packing=True` under Ulysses, whose
kernel skips other documents' blocks as the price does; the documents' length is the data's, which no
flag carries. Import (`read_maxtext`) reads what changes the price, with MaxText's own defaults for what
is unset, applies MaxText's rules, and names every flag it did not read.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from dataclasses import dataclass

from cost_models.compute import DQ_REDUCTION_STEPS, scoped_vmem_flag
from cost_models.errors import CpplanError
from cost_models.experts import expert_axis_problem
from cost_models.masks import MaskKind
from cost_models.models import MAX_MLP_INPUTS, MLP_ACTIVATIONS, MODELS, SWIGLU, DecoderBlock, ModelSpec, get_model
from cost_models.pricing.memory import PACKED_PLACEMENT_FLAG
from cost_models.pricing.target import per_head_smem_bytes, vocab_tiles
from cost_models.remat import LAYER_INPUT, MAXTEXT_NAMES, custom_placements, offloaded_names
from cost_models.strategies import STRATEGIES
from cost_models.strategies.base import MAXTEXT_LOCAL_BLOCK, MAXTEXT_LOCAL_MODEL_NAME, MAXTEXT_LOCAL_PATTERN
from cost_models.targets import Target
from cost_models.topology import get_topology
from cost_models.units import counted
from cost_models.vocabulary import CPStrategy, HostState, LoadBalance, Placement, Quantization, RematPolicy
from planner.plan import Plan, make_mesh

SPLASH_BLOCK_FLAGS = (
    "sa_block_q",
    "sa_block_kv",
    "sa_block_kv_compute",
    "sa_block_q_dkv",
    "sa_block_kv_dkv",
    "sa_block_kv_dkv_compute",
    "sa_block_q_dq",
    "sa_block_kv_dq",
)
MAXTEXT_DTYPES = {"float32": "float32", "bfloat16": "bfloat16"}
# the models MaxText 0.2.5 ships (maxtext/configs/models/<name>.yml) that cpplan knows by the same
# name and shape; any other model travels as shape flags
MAXTEXT_MODEL_NAMES = (
    "llama3.1-8b",
    "llama3.1-70b",
    "llama3.1-405b",
    "llama2-7b",
    "llama2-70b",
    # mixture-of-experts, latent-attention and Gemma 4 models (docs/provenance/moe_models.md: each config
    # read in the maxtext 0.2.5 wheel)
    "deepseek3-671b",
    "qwen3-235b-a22b",
    "qwen3-30b-a3b",
    "qwen3-8b",
    "mixtral-8x7b",
    "gpt-oss-120b",
    "gpt-oss-20b",
    "gemma4-26b",
    "gemma4-31b",
    "gemma4-e2b",
    "gemma4-e4b",
    "mixtral-8x22b",
    "llama4-17b-16e",
    "llama4-17b-128e",
)
# what MaxText's shape flags cannot say of a model it does not ship, by the ModelSpec field that has it
UNEXPORTED_MODEL_FIELDS = {
    "experts": "experts",
    "latent": "latent attention",
    "global_attention": "global layers of their own head shape",
    "attention_sinks": "attention sinks",
    "qk_norm": "q/k norms",
    "shared_kv": "keys and values of one projection",
    "per_layer_inputs": "per-layer input embeddings",
    "kv_shared_layers": "layers that reuse an earlier layer's keys and values",
}
# MaxText 0.2.5 runs the layers of Gemma 4 E2B and E4B (its gemma4_small block: per-layer inputs, KV-shared
# layers) one by one only: `NNXDecoder._init_decoder_layers` raises for scan_layers=True (base.yml's default)
UNSCANNED_LAYERS_FLAG = "scan_layers"
# MaxText's base.yml model defaults, for the shape flags a config leaves unset
BASE_MODEL_DEFAULTS = {
    "base_num_decoder_layers": 16,
    "base_emb_dim": 2048,
    "base_num_query_heads": 16,
    "base_num_kv_heads": 16,
    "head_dim": 128,
    "base_mlp_dim": 7168,
    "vocab_size": 32000,
}
SHAPE_FLAGS = {
    "base_num_decoder_layers": "num_layers",
    "base_emb_dim": "hidden",
    "base_num_query_heads": "num_heads",
    "base_num_kv_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "base_mlp_dim": "intermediate",
    "vocab_size": "vocab",
}
# ModelSpec's switches and the MaxText flags that carry them (base.yml default False)
SWITCH_FLAGS = {"attention_bias": "qkv_bias", "logits_via_embedding": "tie_embeddings"}
# the MLP's activations, one per input projection (base.yml: ["silu", "linear"], cpplan's `SWIGLU`)
ACTIVATIONS_FLAG = "mlp_activations"
# the decoder block (base.yml: "llama2", cpplan's default); cpplan runs llama2 and MaxText's parallel "default",
# and prices MaxText's gemma3 block, whose layers have a sliding window of `sliding_window_size` five times in six,
# as llama2 with those layers (cost_models.strategies.base.MAXTEXT_LOCAL_BLOCK)
BLOCK_FLAG = "decoder_block"
WINDOW_FLAG = "sliding_window_size"
# base.yml: true; the data's own documents, marked by segment ids, which every kernel masks
PACKING_FLAG = "packing"
# base.yml: false; true looks the input embedding up as a one-hot matmul (`Plan.one_hot_embedding`)
ONE_HOT_EMBEDDING_FLAG = "use_iota_embed"
# a plain MLP's one input projection: MaxText's checkpoint name for cpplan's `mlpwi_0` (cost_models.remat)
PLAIN_MLP_CHECKPOINTS = {"mlpwi_0": "mlpwi"}
# model-defining flags whose value cpplan's ModelSpec does not hold (they do not change the price);
# an export of a model MaxText does not ship leaves them at MaxText's defaults and says so
UNCARRIED_MODEL_FLAGS = {"rope_max_timescale": 10_000, "normalization_layer_epsilon": 1e-5}
# MaxText's attention kernels: cpplan prices splash ("flash"; "autoselected" is flash on a TPU)
# the largest integer flag read: beyond it a float no longer holds every integer, so counts derived
# from it would be priced inexactly
MAX_FLAG_INTEGER = 2**53
SPLASH_KERNELS = ("flash", "autoselected")
# The compiler flags MaxText's own offload recipes add to LIBTPU_INIT_ARGS (`HOST_OFFLOAD_FLAGS`,
# benchmarks/xla_flags_library.py of AI-Hypercomputer/maxtext, used by its trillium model configs).
# MaxText's remat offload needs none of them: its train_compile compiles an offloading policy without
# them (bench_maxtext's offload rows, which the MaxText target is priced against). They change the
# compiler's schedule: llama3.1-8b ring 4 × 128K under minimal_offloaded on v5p-8 compiled at 88.6 GiB
# with them, 89.8 without (cpplan's own runtime went the other way, 4.93 → 6.05 GiB on a small plan,
# docs/memory_offload.md). The export leaves them out, as it is priced.
MAXTEXT_RECIPE_OFFLOAD_FLAGS = "HOST_OFFLOAD_FLAGS (maxtext benchmarks/xla_flags_library.py)"
# Flags that change neither time nor memory as cpplan prices a step, each with why (read, so not listed
# as unpriced): the layer stack's axis, the input pipeline (not in a step's device time), the ring's scan
# unrolled (the hops stay waited for, ring_hops_overlap_attention), jax's own splash (the same kernels)
NEUTRAL_FLAGS = {
    "param_scan_axis": "the axis the scanned layers are stacked on",
    "dataset_type": "the input pipeline, which runs on the host beside the step",
    "ring_scan_unroll": "the ring's hop loop unrolled; its hops are priced as waited for either way",
    "use_jax_splash": "jax's splash instead of MaxText's copy: the same kernels",
}
# XLA flags of LIBTPU_INIT_ARGS given among the flags: not MaxText's, so read as the compiler's
COMPILER_FLAG_PREFIX = "--xla"
NOT_MODELLED_COMPILER_FLAGS = {
    "--xla_tpu_dvfs_p_state": "the chip's clock (DVFS performance state) is not modelled: priced at the row's peak",
}
# MaxText's whole-state host offload (base.yml, default false): the state kept in pinned host memory between
# steps (`Plan.state_on_host`); its weights' offload asserts the layers stacked on axis 0
STATE_OFFLOAD_FLAGS = {
    "parameter_memory_host_offload": HostState.PARAMS,
    "optimizer_memory_host_offload": HostState.OPTIMIZER,
}
PARAMS_OFFLOAD_SCAN_AXIS = 0
# MaxText's mesh axes beyond cpplan's that shard weights and batch as fsdp does, and how the price treats each
FSDP_LIKE_AXES = {
    "fsdp_transpose": "a second fsdp axis (2-D FSDP: weights split over both, each gathered over its own)",
}
# models whose MaxText config's own block runs their local layers (gpt_oss: sliding and global layers in turn;
# gemma4: five sliding to one global; gemma4_small: four (E2B) or five (E4B) sliding to one global; llama4: three
# chunked to one global)
MAXTEXT_WINDOWED_MODELS = (
    "gpt-oss-120b",
    "gpt-oss-20b",
    "gemma4-26b",
    "gemma4-31b",
    "gemma4-e2b",
    "gemma4-e4b",
    "llama4-17b-16e",
    "llama4-17b-128e",
)
# MaxText model names that are another model's shape under other sharding rules
MAXTEXT_MODEL_ALIASES = {
    "deepseek3-671b-2dfsdp": (
        "deepseek3-671b",
        "model_name=deepseek3-671b-2dfsdp: deepseek3-671b's shape with MaxText's 2-D FSDP sharding rules",
    ),
}
# MaxText's mixture-of-experts flags: read, and what the price makes of each
EXPERT_FLAGS = {
    "sparse_matmul": (
        "the experts' grouped matmul (True, base.yml's) is priced, and the dense path with a capacity_factor; "
        "the dense path without one (every expert on every token) is not"
    ),
    "megablox": "the grouped-matmul kernel, priced by its tile padding whichever kernel runs",
    "use_tokamax_gmm": "the grouped-matmul kernel, priced by its tile padding whichever kernel runs",
    "use_custom_sort_vjp": "the permute's backward, priced as its forward's passes",
    "use_random_routing": "tokens spread evenly over the experts, as priced",
    "shard_exp_on_fsdp": "the experts' weights are sharded over the weight-sharding group either way",
    "fsdp_shard_on_exp": "the experts' weights are sharded over the weight-sharding group either way",
    "use_2d_fsdp_sharding": "a second fsdp axis, priced as fsdp",
    "capacity_factor": (
        "acts on the dense path only (sparse_matmul=False), in MaxText 0.2.5 as priced; with the grouped matmul "
        "every routed copy is computed, none dropped"
    ),
}


def _slice_name(topology: str) -> str | None:
    """`v5p:2x2x2` (or one slice of `2xv5p:2x2x2`) → `v5p-16`, MaxText's compile_topology (names count TensorCores)."""
    topo = get_topology(topology)
    if not topo.chip.kind.has_torus:
        return None
    name = f"{topo.chip.name}-{topo.chips_per_slice * topo.chip.tensorcores_per_chip}"
    return name if get_topology(name).chip_dims == topo.chip_dims else None


def maxtext_problems(plan: Plan) -> list[str]:
    """MaxText's own rules for the plan's model (its attention mask) and strategy (its spec's
    `maxtext_problems`, from MaxText's configs/types.py), each with the fix."""
    problems = plan.strategy_spec.maxtext_rules(plan.shape)
    problem = expert_axis_problem(plan.model, plan.axis_size("expert"))
    if problem:
        problems.append(problem)
    if plan.local_strategy is not None:
        problems.append(
            f"the plan runs its local layers under {plan.local_strategy.value} and its global layers under "
            f"{plan.cp_strategy.value}, and MaxText 0.2.5 runs one context_parallel_strategy for every layer; "
            f"export the plan with local_strategy unset (every layer under {plan.cp_strategy.value}), or "
            f"search with --target maxtext"
        )
    return problems


def maxtext_block(plan: Plan) -> int:
    """The splash block MaxText runs the plan with: under its per-head metadata (Ulysses), the
    smallest from the plan's up that fits SMEM for the kernel shape the plan's strategy lays out;
    under its ring kernel, the plan's, at most the largest that kernel compiles with; else the plan's."""
    if plan.strategy_spec.maxtext_ring_kernel:
        return min(plan.block_q, Target.MAXTEXT.traits.ring_kernel_max_block)
    if not plan.strategy_spec.maxtext_per_head_metadata:
        return plan.block_q
    layout = plan.strategy_spec.layout(plan.shape)
    q_len, kv_len = float(layout.q_len), float(layout.kv_len)
    smem = get_topology(plan.topology).chip.smem_bytes
    traits = Target.MAXTEXT.traits
    block = plan.block_q
    while (
        smem
        and block < min(q_len, kv_len)
        and float(per_head_smem_bytes(layout.q_heads, q_len, kv_len, block_q=block, block_kv=block, traits=traits))
        > smem
    ):
        block *= 2
    return block


@dataclass(frozen=True)
class MaxTextExport:
    """A plan as MaxText runs it.

    Attributes:
        plan: the plan MaxText runs (the one asked for, with the splash blocks MaxText needs).
        flags: the training flags.
        compile_flags: the ahead-of-time flags of `train_compile` (`compile_topology*`), apart.
        notes: what changed from the plan asked for, and what the flags leave at MaxText's defaults.
        libtpu_init_args: the TPU compiler flags MaxText's process needs in LIBTPU_INIT_ARGS: the packed
            placement the memory price assumes, and the scoped VMEM the splash blocks need.
    """

    plan: Plan
    flags: dict[str, object]
    compile_flags: dict[str, object]
    notes: tuple[str, ...]
    libtpu_init_args: str


def export_maxtext(plan: Plan) -> MaxTextExport:
    """MaxText flags for `plan`; splash blocks grow where MaxText's per-head metadata needs it.

    Raises:
        CpplanError: the plan breaks one of cpplan's rules (`Plan.check`) or a MaxText rule
            (`maxtext_problems`), each named with its fix.
    """
    plan.check()
    problems = maxtext_problems(plan)
    if problems:
        raise CpplanError("MaxText cannot run this plan: " + "; ".join(problems) + ".")
    notes = []
    block = maxtext_block(plan)
    if (block, block) != (plan.block_q, plan.block_kv):
        why = (
            "its ring kernel's dK/dV accumulators fit scoped VMEM only up to this block"
            if plan.strategy_spec.maxtext_ring_kernel
            else "MaxText keeps splash metadata per head and needs the larger block to fit SMEM"
        )
        notes.append(f"splash blocks {plan.block_q}×{plan.block_kv} → {block}×{block}: {why} (priced as changed)")
        plan = dataclasses.replace(plan, block_q=block, block_kv=block)
    mesh = plan.ici_mesh_dict
    spec = plan.strategy_spec
    context, usp_ulysses = spec.maxtext_degrees(mesh["context"], mesh["context_ulysses"])
    devices = math.prod(plan.mesh_sizes)
    tokens_per_device = plan.seq_len * plan.global_batch / devices * plan.axis_size("tensor")
    flags: dict[str, object] = {
        "ici_data_parallelism": mesh["data"],
        "ici_fsdp_parallelism": mesh["fsdp"],
        "ici_tensor_parallelism": mesh["tensor"],
        "ici_context_parallelism": context,
        "ici_context_usp_ulysses_parallelism": usp_ulysses,
        "context_parallel_strategy": spec.maxtext_name,
        "context_parallel_load_balance": plan.load_balance is LoadBalance.ZIGZAG,
        "remat_policy": plan.remat.value,
        "max_target_length": plan.seq_len,
        "per_device_batch_size": plan.global_batch / devices,
        "attention": "flash",
        "use_tokamax_splash": spec.maxtext_tokamax_splash,
        "weight_dtype": MAXTEXT_DTYPES[plan.param_dtype],
        "dtype": MAXTEXT_DTYPES[plan.compute_dtype],
        "num_vocab_tiling": vocab_tiles(tokens_per_device, plan.loss_chunk_tokens),
    }
    if plan.fused_attention_backward and not spec.maxtext_tokamax_splash:
        flags["sa_use_fused_bwd_kernel"] = True
    if plan.dq_reduction_steps:
        flags["dq_reduction_steps"] = plan.dq_reduction_steps
    flags.update({flag: True for flag, state in STATE_OFFLOAD_FLAGS.items() if state in plan.state_on_host})
    if HostState.PARAMS in plan.state_on_host:
        flags["param_scan_axis"] = PARAMS_OFFLOAD_SCAN_AXIS
    if plan.mu_dtype != plan.param_dtype:  # MaxText's mu_dtype="" (its default) inherits weight_dtype
        flags["mu_dtype"] = MAXTEXT_DTYPES[plan.mu_dtype]
    if plan.grad_dtype:  # MaxText's grad_dtype (base.yml: float32) casts the gradients
        flags["grad_dtype"] = MAXTEXT_DTYPES[plan.grad_dtype]
    if plan.quantization is not Quantization.NONE:
        flags["quantization"] = plan.quantization.value
    if plan.one_hot_embedding:
        flags[ONE_HOT_EMBEDDING_FLAG] = True
    if unscanned_layers(plan.model):
        flags[UNSCANNED_LAYERS_FLAG] = False
    if plan.model.experts and plan.expert_capacity:  # the dense path with its capacity, as priced
        flags.update(sparse_matmul=False, megablox=False, capacity_factor=plan.expert_capacity)
    elif plan.model.experts:  # MaxText's dropless grouped matmul, as priced (base.yml's, written to be sure)
        flags.update(sparse_matmul=True, megablox=True, capacity_factor=-1)
        # the expert axis (a dense model's is always 1, MaxText's default, and not written)
        flags["ici_expert_parallelism"] = mesh["expert"]
    if offloaded_names(plan.remat, plan.remat_custom):
        notes.append(
            f"remat_policy={plan.remat.value} offloads to pinned host memory, which MaxText runs without "
            f"compiler flags; priced as compiled without the {MAXTEXT_RECIPE_OFFLOAD_FLAGS} its recipes "
            f"put in LIBTPU_INIT_ARGS (they change the compiler's schedule, and with it the HBM it holds)"
        )
    if plan.remat is RematPolicy.CUSTOM:
        # MaxText's per-name flags (base.yml: every name remat but the layer input): ours are its names,
        # but a plain MLP's one input, whose name differs, and whose `mlpwi_1` does not exist
        renamed = {} if plan.model.gated else PLAIN_MLP_CHECKPOINTS
        flags.update(
            {
                renamed.get(name, name): where.value
                for name, where in plan.remat_custom
                if plan.model.gated or name != "mlpwi_1"
            }
        )
    flags.update({f: block for f in SPLASH_BLOCK_FLAGS})
    model_flags, model_notes = _model_flags(plan.model)
    flags.update(model_flags)
    notes += model_notes
    if plan.num_slices > 1:
        flags.update(
            {
                "dcn_data_parallelism": plan.dcn_data,
                "dcn_fsdp_parallelism": plan.dcn_fsdp,
                "num_slices": plan.num_slices,
            }
        )
    vmem = scoped_vmem_flag(plan.scoped_vmem_limit_kib)
    if vmem:
        notes.append(
            f"splash blocks {plan.block_q}×{plan.block_kv} need more scoped VMEM than the compiler's "
            f"default: run with {vmem} in LIBTPU_INIT_ARGS"
        )
    libtpu_init_args = f"{vmem} {PACKED_PLACEMENT_FLAG}".strip()
    compile_flags: dict[str, object] = {}
    slice_name = _slice_name(plan.topology)
    if slice_name:
        compile_flags = {"compile_topology": slice_name, "compile_topology_num_slices": plan.num_slices}
    return MaxTextExport(plan, flags, compile_flags, tuple(notes), libtpu_init_args)


def _model_flags(model: ModelSpec) -> tuple[dict[str, object], list[str]]:
    """The flags that define `model` in MaxText, and what they leave at MaxText's defaults (the plan
    has passed `maxtext_problems`, so MaxText runs its masks)."""
    notes = []
    shipped = _shipped_name(model)
    if shipped:
        flags: dict[str, object] = {"model_name": shipped}
        if shipped != model.name:
            notes.append(f"model {model.name} has the shape of MaxText's {shipped}: exported by that name")
    elif model.window:
        # the gemma3 block comes with its model name (MaxText reads the block's query scale by it), whose
        # config the shape flags then override
        flags = {
            "model_name": MAXTEXT_LOCAL_MODEL_NAME,
            "override_model_config": True,
            **_shape_flags(model),
            BLOCK_FLAG: MAXTEXT_LOCAL_BLOCK,
            WINDOW_FLAG: model.window,
        }
        notes.append(
            f"model {model.name}'s layers with a {model.local_mask.describe()}, five of every six, run in "
            f"MaxText's {MAXTEXT_LOCAL_BLOCK} block, chosen by model_name={MAXTEXT_LOCAL_MODEL_NAME} with its "
            f"shape given by flags (override_model_config=True); the block adds what cpplan does not price "
            f"(norms after attention and after the MLP, query and key norms, the embedding's scaling), and its "
            f"RoPE bases and norm epsilon are {MAXTEXT_LOCAL_MODEL_NAME}.yml's"
        )
    else:
        unexported = [what for field, what in UNEXPORTED_MODEL_FIELDS.items() if getattr(model, field)]
        if unexported:
            raise CpplanError(
                f"model {model.name!r} has {', '.join(unexported)}, which MaxText's shape flags do not carry for a "
                f"model it does not ship; export a model of MaxText's own by its name "
                f"({', '.join(MAXTEXT_MODEL_NAMES[5:])}) or give MaxText a config of the model "
                f"(configs/models/<name>.yml) and pass model_name yourself."
            )
        flags = _shape_flags(model)
        notes.append(
            f"model {model.name} is not one MaxText ships: its shape travels as flags; "
            + ", ".join(f"{k}={v:g}" for k, v in UNCARRIED_MODEL_FLAGS.items())
            + " are MaxText's defaults (cpplan's model holds no RoPE base or norm epsilon, which do not change "
            "the price): set them to the model's"
        )
    if model.documents:
        flags[PACKING_FLAG] = True
        where = (
            f"documents of {model.documents} tokens each, starting every {model.documents} tokens of a row"
            if model.fixed_documents
            else f"{model.describe_documents()}, packed back to back with rows cut anywhere among them"
        )
        notes.append(
            f"{PACKING_FLAG}=True packs the data's own documents, marked by segment ids (MaxText has no flag "
            f"for their length): the price holds for {where}"
        )
    return flags, notes


def _shipped_name(model: ModelSpec) -> str | None:
    """The name of the model MaxText ships (`MAXTEXT_MODEL_NAMES`) that has `model`'s shape, its layers'
    masks alike however their pattern is written, packed documents aside; None where none has."""

    def shape(m: ModelSpec) -> dict:
        row = m.to_dict()
        for key in ("name", "layer_pattern", "documents"):
            row.pop(key, None)
        return row

    unpacked = dataclasses.replace(model, documents=0)
    for name in MAXTEXT_MODEL_NAMES:
        known = MODELS[name]
        if shape(model) == shape(known) and unpacked.layer_masks == known.layer_masks:
            return name
    return None


def _shape_flags(model: ModelSpec) -> dict[str, object]:
    """The shape, switch, activation and block flags of `model`."""
    flags: dict[str, object] = {flag: getattr(model, field) for flag, field in SHAPE_FLAGS.items()}
    flags.update({flag: getattr(model, field) for flag, field in SWITCH_FLAGS.items()})
    # a list in MaxText's command-line form (OmegaConf reads `[relu]` as ["relu"])
    flags[ACTIVATIONS_FLAG] = "[" + ",".join(model.mlp_activations) + "]"
    flags[BLOCK_FLAG] = model.decoder_block.value
    return flags


def plan_to_maxtext(plan: Plan) -> dict[str, object]:
    """The flags of `export_maxtext(plan)` as one `train_compile` command line: the training
    flags, then the `compile_topology*` flags.

    Raises:
        CpplanError: the plan breaks a MaxText rule.
    """
    exported = export_maxtext(plan)
    return {**exported.flags, **exported.compile_flags}


def format_flags(flags: dict[str, object]) -> str:
    """`key=value` words for a MaxText command line."""
    return " ".join(f"{k}={shlex.quote(str(v))}" for k, v in flags.items())


def parse_flags(text: str) -> dict[str, str]:
    """`key=value` words of a MaxText command line (`split_flags` without the other words)."""
    return split_flags(text)[0]


def split_flags(text: str) -> tuple[dict[str, str], list[str]]:
    """The `key=value` words of a MaxText command line, and its other words (the program, its config
    file, and anything else) in order; a key given twice is refused (which would win?).

    Raises:
        CpplanError: an unclosed quote, or a key given twice.
    """
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise CpplanError(f"cannot split the MaxText flags into words ({err}); close every quote.") from None
    flags: dict[str, str] = {}
    others = []
    for word in words:
        if "=" not in word:
            others.append(word)
            continue
        key, _, value = word.partition("=")
        if key.startswith(COMPILER_FLAG_PREFIX):  # LIBTPU_INIT_ARGS pasted beside the flags
            others.append(word)
            continue
        if key.startswith("-"):
            raise CpplanError(
                f"MaxText flag {word!r}: MaxText reads its flags as key=value, without dashes; write "
                f"{key.lstrip('-')}={value}."
            )
        if key in flags:
            raise CpplanError(f"MaxText flag {key} is given twice ({flags[key]!r} and {value!r}); give it once.")
        flags[key] = value
    return flags, others


class _Flags:
    """MaxText flags that remember which were read, so the rest can be named."""

    def __init__(self, flags: dict, others: list[str] = ()):
        self._flags = dict(flags)
        self.others = list(others)  # words that are not key=value: never read, always listed
        self.read: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._flags

    def get(self, key: str, default=None):
        self.read.add(key)
        return self._flags.get(key, default)

    def text(self, key: str, default: str) -> str:
        return str(self.get(key, default)).strip()

    def int(self, key: str, default: int) -> int:
        value = self.get(key, default)
        text = str(value).strip()
        try:  # an integer's digits exactly; a float only where it is a whole number (1e6)
            number = int(text) if text.lstrip("+-").isdigit() else float(text)
        except (TypeError, ValueError):
            raise CpplanError(f"MaxText flag {key}={value!r} is not a number.") from None
        if not math.isfinite(number) or number != int(number):
            raise CpplanError(f"MaxText flag {key}={value!r} must be a whole number.")
        if number < 0:
            raise CpplanError(f"MaxText flag {key}={value!r} must be 0 or more.")
        if int(number) > MAX_FLAG_INTEGER:
            raise CpplanError(
                f"MaxText flag {key}={value!r} is beyond 2**53 ({MAX_FLAG_INTEGER}), past which a "
                f"count is not priced exactly; give a realistic value."
            )
        return int(number)

    def bool(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        text = str(value).strip().lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise CpplanError(f"MaxText flag {key}={value!r} must be true or false.")

    def unread(self) -> tuple[str, ...]:
        return tuple(k for k in self._flags if k not in self.read) + tuple(self.others)

    def check_words(self) -> None:
        """Refuses a flag cpplan reads written without `=` (`ici_fsdp_parallelism 2`): its value
        would be silently lost."""
        misplaced = [w for w in self.others if w in self.read]
        if misplaced:
            raise CpplanError(
                f"MaxText flag {misplaced[0]} is written without '=': MaxText reads key=value words; "
                f"write {misplaced[0]}=VALUE."
            )


@dataclass(frozen=True)
class MaxTextImport:
    """MaxText flags read into a plan.

    Attributes:
        plan: the plan the flags describe.
        unread: every flag not read, by name (in the order given): cpplan does not price it.
        notes: flags read that cpplan prices differently from how they were given.
    """

    plan: Plan
    unread: tuple[str, ...]
    notes: tuple[str, ...]


def plan_from_maxtext(
    flags: "dict | str", *, model: "str | ModelSpec | None" = None, topology: str | None = None
) -> Plan:
    """The plan of MaxText flags (`read_maxtext(...).plan`); words that are neither key=value flags nor
    the command that runs them are refused, since nothing else would say they went unread.

    Raises:
        CpplanError: as `read_maxtext`, or a stray word (`...`), named."""
    found = read_maxtext(flags, model=model, topology=topology)
    words = split_flags(flags)[1] if isinstance(flags, str) else []
    stray = [w for w in words if "=" not in w and not _command_word(w)]
    if stray:
        raise CpplanError(
            f"the MaxText flags hold words that are neither key=value flags nor the command that runs them: "
            f"{', '.join(map(repr, stray))}; give only key=value flags (planner.maxtext.read_maxtext lists what it "
            f"does not price)."
        )
    return found.plan


def _command_word(word: str) -> bool:
    """A word of the command line that runs MaxText: the interpreter, `-m`, a module, script or config file."""
    return (
        word.startswith("python")
        or word.startswith("-")
        or word.endswith((".py", ".yml", ".yaml"))
        or (word.replace(".", "").replace("_", "").isalnum() and "." in word)
    )


def read_maxtext(
    flags: "dict | str", *, model: "str | ModelSpec | None" = None, topology: str | None = None
) -> MaxTextImport:
    """Reads MaxText flags (a dict, or command-line text with ``key=value`` words).

    Args:
        flags: the flags; `model_name` (with any shape flags overriding it) and
            `compile_topology` are used when `model` / `topology` are not given. Unset flags
            take MaxText 0.2.5's defaults (base.yml).
        model: overrides the model.
        topology: overrides the topology (needed when the flags have no compile_topology).
    Returns:
        A `MaxTextImport`: the plan, the flags not read, notes.
    Raises:
        CpplanError: a missing model or topology, a flag that is not a number, a mesh that
            does not cover the topology, a strategy or remat policy MaxText does not have, an
            attention kernel cpplan does not price, or a rule MaxText 0.2.5 enforces (named).
    """
    if not isinstance(flags, (str, dict)):
        raise CpplanError(f"MaxText flags are key=value text or a dict, not {type(flags).__name__}.")
    f = _Flags(*split_flags(flags)) if isinstance(flags, str) else _Flags(flags)
    notes: list[str] = []
    model = get_model(model) if model is not None else _read_model(f, notes)
    if unscanned_layers(model) and f.bool(UNSCANNED_LAYERS_FLAG, True):
        raise CpplanError(
            f"model {model.name!r} runs in MaxText 0.2.5's gemma4_small block, which refuses scanned layers "
            f"(layers/nnx_decoders.py: its layers differ one by one); add {UNSCANNED_LAYERS_FLAG}=False."
        )
    if model.documents and not f.bool(PACKING_FLAG, True):
        raise CpplanError(
            f"MaxText flag {PACKING_FLAG}=False attends across each whole row, but model {model.name!r} packs "
            f"{model.describe_documents()}; set {PACKING_FLAG}=True, or pass the unpacked model."
        )
    named = f.get("compile_topology")
    if topology and named and get_topology(str(topology)).name != get_topology(str(named)).name:
        raise CpplanError(
            f"the topology given, {topology}, is not the flags' compile_topology={named}; give one of them "
            f"(`cpplan import --topology` is for flags without compile_topology)."
        )
    topology = topology or named
    if not topology:
        raise CpplanError(
            "the MaxText flags name no topology: give compile_topology=... (or the topology: "
            "`cpplan import --topology`, read_maxtext(topology=...))."
        )
    topo = get_topology(str(topology), _slices(f))
    try:
        strategy = CPStrategy.parse(f.text("context_parallel_strategy", "all_gather"))
    except CpplanError as err:
        raise CpplanError(f"context_parallel_strategy: {err}") from None
    kernel = f.text("attention", "autoselected")
    if kernel not in SPLASH_KERNELS:
        raise CpplanError(
            f"attention={kernel}: cpplan prices the splash kernel only (attention=flash); "
            f"{kernel} materialises other buffers. Use attention=flash."
        )
    tokamax_splash = f.bool("use_tokamax_splash", False)
    if STRATEGIES[strategy].maxtext_tokamax_splash and not tokamax_splash:
        notes.append(
            f"MaxText 0.2.5 runs context_parallel_strategy={strategy.value} on a TPU only with "
            f"use_tokamax_splash=True (configs/types.py): priced as it runs with it; set it"
        )
    spec = STRATEGIES[strategy]
    # tokamax's splash has only the fused backward (layers/attention_op.py), jax's runs it on request;
    # the strategies MaxText runs on tokamax's splash imply it
    fused_backward = (f.bool("sa_use_fused_bwd_kernel", False) or tokamax_splash) and not spec.maxtext_tokamax_splash
    # MaxText's -1 means "the rest of the devices" (its default for fsdp); the ring (or plain
    # Ulysses) degree is ici_context_parallelism, USP's Ulysses degree its own flag
    defaults = {"data": 1, "fsdp": -1, "tensor": 1, "context": 1, "expert": 1}
    open_axes = [a for a in defaults if f.text(f"ici_{a}_parallelism", str(defaults[a])) == "-1"]
    if len(open_axes) > 1:
        raise CpplanError(f"only one MaxText ici_*_parallelism may be -1, got {open_axes}; give the others sizes.")
    given = {a: 1 if a in open_axes else f.int(f"ici_{a}_parallelism", 1) for a in defaults}
    fsdp_like, fsdp_like_open = _weight_sharding_axes(f, notes)
    if fsdp_like_open and open_axes:
        raise CpplanError(f"only one MaxText ici_*_parallelism may be -1, got {[*open_axes, fsdp_like_open]}.")
    usp_u = f.int("ici_context_usp_ulysses_parallelism", 1)
    if not spec.maxtext_takes_ulysses_degree and usp_u != 1:
        raise CpplanError(
            f"ici_context_usp_ulysses_parallelism={usp_u} is for context_parallel_strategy=usp only "
            f"(MaxText refuses it with {strategy.value}); set it to 1."
        )
    if fsdp_like_open:  # the rest of the devices, on an axis priced as fsdp
        fsdp_like = topo.devices_per_slice // (math.prod(given.values()) * usp_u)
    if open_axes:
        given[open_axes[0]] = topo.devices_per_slice // (math.prod(given.values()) * usp_u * fsdp_like)
    given["fsdp"] *= fsdp_like
    if given["expert"] > 1 and not model.experts:
        # MaxText's logical rules put the batch and every weight's embed dimension over `expert` as over fsdp
        # (configs/base.yml: activation_batch, embed): a dense model's expert axis is another fsdp
        notes.append(
            f"ici_expert_parallelism={given['expert']} on model {model.name!r}, which has no experts: MaxText "
            f"splits its batch and weights over the axis as over fsdp, and cpplan plans it as fsdp"
        )
        given["fsdp"] *= given["expert"]
        given["expert"] = 1
    ring, uly = spec.from_maxtext_degrees(given.pop("context"), usp_u)
    if ring == 1 and uly == 1:
        strategy, spec = CPStrategy.NONE, STRATEGIES[CPStrategy.NONE]
    sizes = {**given, "context": ring, "context_ulysses": uly}
    if math.prod(sizes.values()) != topo.devices_per_slice:
        raise CpplanError(
            f"the MaxText mesh {sizes} covers {math.prod(sizes.values())} devices; "
            f"{'one slice of ' if topo.num_slices > 1 else ''}{topo.name} has {topo.devices_per_slice}."
        )
    dcn_data, dcn_fsdp = _dcn_degrees(f, topo.num_slices)
    sizes["data"] *= dcn_data
    sizes["fsdp"] *= dcn_fsdp
    balanced = f.bool("context_parallel_load_balance", True)  # MaxText's default: balanced
    if balanced and spec.maxtext_refuses_load_balance:
        raise CpplanError(
            f"MaxText refuses context_parallel_strategy={strategy.value} with "
            "context_parallel_load_balance=True (its default); set it to False."
        )
    load_balance = LoadBalance.ZIGZAG if balanced and spec.balances_load else LoadBalance.NONE
    seq_len = f.int("max_target_length", 2048)
    per_device_text = f.get("per_device_batch_size", 12.0)
    try:
        per_device = float(per_device_text)
    except (TypeError, ValueError):
        raise CpplanError(f"MaxText flag per_device_batch_size={per_device_text!r} is not a number.") from None
    if not math.isfinite(per_device) or per_device <= 0:
        raise CpplanError(f"MaxText flag per_device_batch_size={per_device!r} must be a positive, finite number.")
    global_batch = per_device * topo.num_devices
    if global_batch != int(global_batch) or global_batch < 1:
        raise CpplanError(
            f"per_device_batch_size={per_device} × {topo.num_devices} devices is not a whole number of sequences."
        )
    if seq_len * global_batch > MAX_FLAG_INTEGER:
        raise CpplanError(
            f"max_target_length={seq_len} × {global_batch:.6g} sequences is {seq_len * global_batch:.3g} tokens a "
            f"step, beyond 2**53, past which the price is not exact; give a realistic length and batch."
        )
    tiling = f.int("num_vocab_tiling", 1)
    tokens_per_device = seq_len * global_batch / topo.num_devices * sizes["tensor"]
    block_q, block_kv = _blocks(f, notes)
    remat = _remat(f)
    param_dtype = f.text("weight_dtype", "float32")
    state_on_host = tuple(state for flag, state in STATE_OFFLOAD_FLAGS.items() if f.bool(flag, False))
    scan_axis = f.int("param_scan_axis", 1)
    if HostState.PARAMS in state_on_host and scan_axis != PARAMS_OFFLOAD_SCAN_AXIS:
        raise CpplanError(
            f"MaxText flag parameter_memory_host_offload=True with param_scan_axis={scan_axis}: MaxText 0.2.5 "
            f"asserts the scanned layers stacked on axis {PARAMS_OFFLOAD_SCAN_AXIS} to offload the weights; "
            f"add param_scan_axis={PARAMS_OFFLOAD_SCAN_AXIS}."
        )
    dq_steps = _dq_reduction_steps(f)
    for flag in NEUTRAL_FLAGS:
        f.get(flag)  # read: it changes nothing cpplan prices
    for word in f.others:
        flag = word.partition("=")[0]
        if flag in NOT_MODELLED_COMPILER_FLAGS:
            notes.append(f"{word}: {NOT_MODELLED_COMPILER_FLAGS[flag]}")
    plan = Plan(
        model=model,
        topology=topo.name,
        seq_len=seq_len,
        global_batch=int(global_batch),
        mesh=make_mesh(**sizes),
        cp_strategy=strategy,
        load_balance=load_balance,
        remat=remat,
        remat_custom=_custom(f) if remat is RematPolicy.CUSTOM else (),
        block_q=block_q,
        block_kv=block_kv,
        loss_chunk_tokens=math.ceil(tokens_per_device / tiling) if tiling > 1 else 0,
        param_dtype=param_dtype,
        compute_dtype=f.text("dtype", "bfloat16"),
        mu_dtype=f.text("mu_dtype", "") or param_dtype,  # MaxText's "" inherits weight_dtype
        grad_dtype=_grad_dtype(f, param_dtype),
        dcn_data=dcn_data,
        dcn_fsdp=dcn_fsdp,
        fused_attention_backward=fused_backward,
        dq_reduction_steps=dq_steps,
        state_on_host=state_on_host,
        quantization=_quantization(f),
        expert_capacity=_expert_capacity(f) if model.experts else 0.0,
        one_hot_embedding=f.bool(ONE_HOT_EMBEDDING_FLAG, False),
    )
    if model.experts:
        _expert_notes(f, notes, plan.expert_capacity)
    f.check_words()
    problems = maxtext_problems(plan)
    if problems:
        raise CpplanError("MaxText 0.2.5 refuses these flags: " + "; ".join(problems) + ".")
    return MaxTextImport(plan, f.unread(), tuple(notes))


def unscanned_layers(model: ModelSpec) -> bool:
    """Whether MaxText 0.2.5 runs `model`'s layers only unscanned (`UNSCANNED_LAYERS_FLAG`): per-layer inputs or
    KV-shared layers, its gemma4_small block's."""
    return model.per_layer_inputs is not None or model.kv_shared_layers > 0


def _weight_sharding_axes(f: _Flags, notes: list[str]) -> tuple[int, str | None]:
    """The devices of MaxText's other axes that shard the weights and the batch as fsdp does, which cpplan
    prices as fsdp (`FSDP_LIKE_AXES`), each named in a note where it is not one; and the flag of the one
    that takes the rest of the devices (-1), if any (its size then left out of the devices)."""
    devices, rest = 1, None
    for axis, how in FSDP_LIKE_AXES.items():
        flag = f"ici_{axis}_parallelism"
        if f.text(flag, "1") == "-1":
            if rest:
                raise CpplanError(f"only one MaxText ici_*_parallelism may be -1, got {rest} and {flag}.")
            rest = flag
            notes.append(f"{flag}=-1 (the rest of the devices) priced as fsdp: {how}")
            continue
        size = f.int(flag, 1)
        if size < 1:
            raise CpplanError(f"MaxText flag {flag}={size}: give a positive size, or -1 for the rest of the devices.")
        if size > 1:
            notes.append(f"{flag}={size} priced as fsdp: {how}")
        devices *= size
    return devices, rest


def _quantization(f: _Flags) -> Quantization:
    """The matmuls' precision: MaxText's `quantization` (base.yml: "", bf16); fp8_full is priced at the chip's
    fp8 peak, whichever library quantizes (`use_qwix_quantization`, read: the same fp8 matmuls)."""
    f.bool("use_qwix_quantization", False)
    value = f.text("quantization", "").strip("'\"")
    try:
        return Quantization.parse(value)
    except CpplanError:
        raise CpplanError(
            f"MaxText flag quantization={value!r}: cpplan prices bf16 matmuls (quantization unset) and fp8 ones "
            f"(quantization=fp8_full); {value} is not priced."
        ) from None


def _read_model(f: _Flags, notes: list[str]) -> ModelSpec:
    """The model of the flags: `model_name` (a model cpplan knows), with any shape flags given
    overriding it, or the shape flags over MaxText's base.yml defaults; its layers local as MaxText's
    block makes them (`_layers`). MaxText has no flag for a document's length, so its rows are whole
    documents; `packing=True`, where given, is named as not priced."""
    name = f.text("model_name", "default")
    if name in MAXTEXT_MODEL_ALIASES:
        name, why = MAXTEXT_MODEL_ALIASES[name]
        notes.append(why)
    overrides = {field: f.int(flag, 0) for flag, field in SHAPE_FLAGS.items() if flag in f}
    overrides.update({field: f.bool(flag, False) for flag, field in SWITCH_FLAGS.items() if flag in f})
    if ACTIVATIONS_FLAG in f:
        overrides["mlp_activations"] = parse_activations(f.get(ACTIVATIONS_FLAG))
    f.bool("override_model_config", False)  # read: it lets the shape flags above win over the model's config
    # MaxText's block: the flag, else the model config's (gemma3's for its gemma3 names)
    local_block = f.text(BLOCK_FLAG, MAXTEXT_LOCAL_BLOCK if name == MAXTEXT_LOCAL_MODEL_NAME else "")
    local_block = local_block.strip("'\"") == MAXTEXT_LOCAL_BLOCK
    if BLOCK_FLAG in f and not local_block:
        overrides["decoder_block"] = parse_decoder_block(f.get(BLOCK_FLAG))
        overrides["qk_norm"] = False  # MaxText's llama2 and parallel blocks norm neither q nor k (models/llama2.py)
    if name != "default":
        base = get_model(name)
        model = dataclasses.replace(base, **overrides) if overrides else base
        _packing_note(f, notes)
        return _layers(f, model, local_block, notes)
    if not overrides and not local_block:
        raise CpplanError(
            "the MaxText flags name no model: give model_name=... or the base_* shape flags (or, from Python, "
            "read_maxtext(model=...))."
        )
    shape = {field: f.int(flag, BASE_MODEL_DEFAULTS[flag]) for flag, field in SHAPE_FLAGS.items()}
    shape.update({field: f.bool(flag, False) for flag, field in SWITCH_FLAGS.items()})
    shape["mlp_activations"] = overrides.get("mlp_activations", SWIGLU)
    shape["decoder_block"] = overrides.get("decoder_block", DecoderBlock.LLAMA2)
    _packing_note(f, notes)
    model = _layers(f, ModelSpec("maxtext-custom", **shape), local_block, notes)
    known = next((m for m in MODELS.values() if dataclasses.replace(m, name=model.name) == model), None)
    return known or model


def _layers(f: _Flags, model: ModelSpec, local_block: bool, notes: list[str]) -> ModelSpec:
    """`model` with the layers MaxText's block gives it: under gemma3, a sliding window of
    `sliding_window_size` (its model config's where unset) on five layers of every six, in Gemma 3's block;
    under any other, global layers, whatever the window flag says.

    Raises:
        CpplanError: the gemma3 block without one of its model names, or without a positive window.
    """
    if not local_block and model.name in MAXTEXT_WINDOWED_MODELS and BLOCK_FLAG not in f:
        return model  # the model's own block, which runs its local layers as cpplan prices them
    if not local_block:
        window = f.int(WINDOW_FLAG, 0)
        if window or model.window:
            notes.append(
                f"MaxText's {model.decoder_block.value} block attends globally in every layer "
                f"(only its {MAXTEXT_LOCAL_BLOCK} block reads {WINDOW_FLAG}): priced with global layers"
                + (f", not model {model.name}'s {model.local_mask.describe()} ones" if model.window else "")
            )
        return model.all_global() if model.window else model
    if model.name != MAXTEXT_LOCAL_MODEL_NAME:
        raise CpplanError(
            f"MaxText flag {BLOCK_FLAG}={MAXTEXT_LOCAL_BLOCK} with model_name={f.text('model_name', 'default')}: "
            f"MaxText's {MAXTEXT_LOCAL_BLOCK} block reads its query scale by model name and knows its own only "
            f"(models/gemma3.py); give model_name={MAXTEXT_LOCAL_MODEL_NAME} (cpplan's of them) with the shape flags."
        )
    window = f.int(WINDOW_FLAG, model.window)
    if window < 1:
        raise CpplanError(
            f"MaxText flag {WINDOW_FLAG}={window}: the {MAXTEXT_LOCAL_BLOCK} block's local layers need a window "
            f"of at least one token; give the model's ({MODELS[MAXTEXT_LOCAL_MODEL_NAME].window} for "
            f"{MAXTEXT_LOCAL_MODEL_NAME})."
        )
    return dataclasses.replace(
        model,
        window=window,
        local_kind=MaskKind.SLIDING.value,
        layer_pattern=MAXTEXT_LOCAL_PATTERN,
        decoder_block=DecoderBlock.GEMMA3,  # models/gemma3.py: four norms a layer (its configs' post norms on)
        qk_norm=True,  # and q/k norms (`use_qk_norm=True`)
    )


def _packing_note(f: _Flags, notes: list[str]) -> None:
    """Names `packing=True` (base.yml's default), where given, as not priced."""
    if PACKING_FLAG in f and f.bool(PACKING_FLAG, True):
        notes.append(
            f"{PACKING_FLAG}=True packs the data's own documents, which MaxText's flags do not describe: priced "
            f"as rows of one document each (pass a model with documents= to price documents of one length)"
        )


def parse_activations(value) -> tuple[str, ...]:
    """The activations of MaxText's `mlp_activations` flag: a list (`["silu","linear"]`, `[relu]`,
    or a Python list) or, as older configs give it, a bare name or comma-separated names.

    Args:
        value: the flag's value.
    Returns:
        The activation names, one per MLP input projection.
    Raises:
        CpplanError: an activation cpplan does not run, or more input projections than it runs.
    """
    words = (
        value
        if isinstance(value, (list, tuple))
        else str(value).strip().removeprefix("[").removesuffix("]").replace(",", " ").split()
    )
    names = tuple(str(w).strip().strip("'\"") for w in words)
    refused = [n for n in names if n not in MLP_ACTIVATIONS]
    if refused or not 1 <= len(names) <= MAX_MLP_INPUTS:
        why = (
            f"{', '.join(map(repr, refused))} {'is' if len(refused) == 1 else 'are'} not among the activations "
            f"cpplan runs ({', '.join(MLP_ACTIVATIONS)})"
            if refused
            else f"cpplan runs an MLP of 1 (plain) or {MAX_MLP_INPUTS} (gated) input projections, one per activation"
        )
        raise CpplanError(f"MaxText flag {ACTIVATIONS_FLAG}={value!r}: {why}; cpplan cannot price or run this model.")
    return names


def parse_decoder_block(value) -> DecoderBlock:
    """MaxText's `decoder_block` flag: `llama2` (the sequential Llama block, base.yml's default) or
    `default` (MaxText's parallel block); its gemma3 block is read apart (`_layers`), and its others
    (mistral, gemma2, deepseek, ...) add what cpplan neither prices nor runs (soft caps, MoE) and are
    refused by name.

    Raises:
        CpplanError: a block cpplan does not run.
    """
    text = str(value).strip().strip("'\"")
    if text not in [b.value for b in DecoderBlock]:
        raise CpplanError(
            f"MaxText flag {BLOCK_FLAG}={text!r}: cpplan runs {DecoderBlock.LLAMA2.value} (the "
            f"sequential Llama block) and {DecoderBlock.DEFAULT.value} (MaxText's parallel block) "
            f"only; it cannot price or run this model."
        )
    return DecoderBlock(text)


def _remat(f: _Flags) -> RematPolicy:
    """MaxText's `remat_policy` (default full)."""
    try:
        return RematPolicy.parse(f.text("remat_policy", "full"))
    except CpplanError as err:
        raise CpplanError(f"remat_policy: {err}") from None


def _custom(f: _Flags):
    """The placements of MaxText's `remat_policy=custom`: its per-name flags (`decoder_layer_input`,
    `query_proj`, `qkv_proj`, `mlpwi`, …), each device, offload or remat; unset names are remat
    (base.yml), and a name given as remat leaves the names it shares with another to that one."""
    given = {name: Placement.parse(f.text(name, "remat")) for name in (LAYER_INPUT, *MAXTEXT_NAMES) if name in f}
    return custom_placements(
        {name: where for name, where in given.items() if where is not Placement.REMAT or name == LAYER_INPUT},
        maxtext_names=True,
    )


def _dq_reduction_steps(f: _Flags) -> int:
    """MaxText's `dq_reduction_steps` (base.yml: 0), refused where tokamax's kernel would refuse it."""
    steps = f.int("dq_reduction_steps", 0)
    if steps not in (0, DQ_REDUCTION_STEPS):
        raise CpplanError(
            f"MaxText flag dq_reduction_steps={steps}: tokamax's fused backward accepts only "
            f"{DQ_REDUCTION_STEPS} (or 0 for none); set it to one of them."
        )
    return steps


def _blocks(f: _Flags, notes: list[str]) -> tuple[int, int]:
    """(block_q, block_kv) from MaxText's eight `sa_block_*` flags (base.yml: 512 each). cpplan
    prices one query and one key block for every kernel; where the backward's blocks differ, the
    note says which were priced at the forward's."""
    sizes = {flag: f.int(flag, 512) for flag in SPLASH_BLOCK_FLAGS}
    block_q, block_kv = sizes["sa_block_q"], sizes["sa_block_kv"]
    differing = [
        f"{flag}={size}"
        for flag, size in sizes.items()
        if size != (block_q if "_q" in flag.removeprefix("sa_block") else block_kv)
    ]
    if differing:
        notes.append(
            f"{', '.join(differing)} differ from sa_block_q={block_q}/sa_block_kv={block_kv}: cpplan prices "
            f"every splash kernel at the forward's blocks"
        )
    return block_q, block_kv


def _slices(f: _Flags) -> int:
    """The slices the flags run on: `compile_topology_num_slices`, else `num_slices` (MaxText's -1,
    or neither given, is one slice)."""
    for key in ("compile_topology_num_slices", "num_slices"):
        if f.text(key, "-1") != "-1":
            count = f.int(key, 1)
            if count < 1:
                raise CpplanError(f"MaxText flag {key}={f.get(key)!r} must be at least 1 slice.")
            return count
    return 1


def _dcn_degrees(f: _Flags, slices: int) -> tuple[int, int]:
    """(dcn_data, dcn_fsdp) from MaxText's `dcn_*_parallelism` flags over `slices` slices.

    MaxText's defaults are dcn_data_parallelism=-1 (the slices the other dcn axes leave) and every
    other dcn axis 1.

    Raises:
        CpplanError: a dcn axis other than data and fsdp spans slices, or the degrees do not
            multiply to the slice count.
    """
    others = [
        key
        for key in f._flags
        if key.startswith("dcn_")
        and key.endswith("_parallelism")
        and key not in ("dcn_data_parallelism", "dcn_fsdp_parallelism")
    ]
    crossing = sorted(key for key in others if f.text(key, "1") != "1")
    if crossing:
        raise CpplanError(
            f"the planner keeps every axis but data and fsdp inside a slice; set "
            f"{', '.join(f'{k}=1' for k in crossing)} (got {', '.join(f.text(k, '1') for k in crossing)})."
        )
    dcn_fsdp = slices if f.text("dcn_fsdp_parallelism", "1") == "-1" else f.int("dcn_fsdp_parallelism", 1)
    open_data = f.text("dcn_data_parallelism", "-1") == "-1"
    if open_data and dcn_fsdp and slices % dcn_fsdp == 0:
        return slices // dcn_fsdp, dcn_fsdp
    dcn_data = slices if open_data else f.int("dcn_data_parallelism", 1)
    if dcn_data * dcn_fsdp != slices:
        raise CpplanError(
            f"dcn_data_parallelism={dcn_data} × dcn_fsdp_parallelism={dcn_fsdp} must equal the "
            f"{counted(slices, 'slice')} (compile_topology_num_slices)."
        )
    return dcn_data, dcn_fsdp


def _grad_dtype(f: _Flags, param_dtype: str) -> str:
    """MaxText's `grad_dtype` (base.yml's float32): it casts float32 gradients, so a plan of other parameters
    keeps its own; "" where the gradients stay in the parameters' dtype."""
    text = f.text("grad_dtype", "float32").strip("'\"")
    dtype = next((name for name, spelled in MAXTEXT_DTYPES.items() if spelled == text), text)
    if dtype not in MAXTEXT_DTYPES:
        raise CpplanError(f"MaxText flag grad_dtype={text!r} is not one of {sorted(MAXTEXT_DTYPES.values())}.")
    return dtype if param_dtype == "float32" and dtype != param_dtype else ""


def _expert_capacity(f: _Flags) -> float:
    """The plan's `expert_capacity`: MaxText's capacity_factor where its dense path runs (sparse_matmul=False
    and a factor above 0, MaxText 0.2.5 layers/moe.py `dense_matmul`), else 0 (dropless)."""
    text = f.text("capacity_factor", "-1")
    try:
        factor = float(text)
    except ValueError:
        raise CpplanError(f"MaxText flag capacity_factor={text!r} is not a number (-1: no capacity, or e.g. 1.25).")
    if not math.isfinite(factor):
        raise CpplanError(f"MaxText flag capacity_factor={text!r} must be a finite number (-1: no capacity).")
    return factor if factor > 0 and not f.bool("sparse_matmul", True) else 0.0


def _expert_notes(f: _Flags, notes: list[str], capacity: float) -> None:
    """Reads MaxText's mixture-of-experts flags (`EXPERT_FLAGS`), noting those set away from what is priced;
    `capacity` is the plan's `expert_capacity` read from them (`_expert_capacity`)."""
    dense_path = not f.bool("sparse_matmul", True)
    for flag, how in EXPERT_FLAGS.items():
        if flag not in f:
            continue
        value = f.text(flag, "")
        off_price = (flag == "sparse_matmul" and dense_path and not capacity) or (
            flag == "capacity_factor" and capacity <= 0 and value not in ("-1", "-1.0")
        )
        if off_price:
            notes.append(f"{flag}={value}: {how}")
    if capacity:
        notes.append(
            f"sparse_matmul=False capacity_factor={capacity:g}: MaxText's dense path priced (slots, dispatch and "
            f"combine einsums, cost_models/pricing/capacity.py); its [batch, length, experts, slots] masks' memory "
            f"is not priced"
        )
