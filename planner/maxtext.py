"""Plans as MaxText flags and back, so a user can run a plan or price the config they run today.

Mapping (MaxText's base.yml names): `ici_{data,fsdp,tensor}_parallelism`; the ring (or
all-gather) degree is `ici_context_parallelism`; plain Ulysses also uses
`ici_context_parallelism` for its degree; USP puts the Ulysses degree in
`ici_context_usp_ulysses_parallelism` and the ring degree in `ici_context_parallelism`.
MaxText picks the device order itself, so a plan's placement does not travel: a plan read back
gets the topology's natural order. Over several slices the `ici_*` degrees are one slice's;
`dcn_data_parallelism` and `dcn_fsdp_parallelism` say how many slices data and fsdp span (the
plan's mesh sizes are their products), and `compile_topology_num_slices` (or `num_slices`) how
many slices there are; MaxText's other `dcn_*` axes must be 1, as the planner keeps context and
tensor inside a slice.
"""
from __future__ import annotations

import math
import shlex

from cost_models.errors import CpplanError
from cost_models.models import MODELS, ModelSpec, get_model
from cost_models.strategies import STRATEGIES
from cost_models.topology import get_topology
from cost_models.vocabulary import CPStrategy, LoadBalance, RematPolicy
from planner.plan import Plan, make_mesh

SPLASH_BLOCK_FLAGS = ("sa_block_q", "sa_block_kv", "sa_block_kv_compute", "sa_block_q_dkv", "sa_block_kv_dkv",
                      "sa_block_kv_dkv_compute", "sa_block_q_dq", "sa_block_kv_dq")
MAXTEXT_DTYPES = {"float32": "float32", "bfloat16": "bfloat16"}


def _slice_name(topology: str) -> str | None:
    """`v5p:2x2x2` (or one slice of `2xv5p:2x2x2`) → `v5p-16`, MaxText's compile_topology (names count TensorCores)."""
    topo = get_topology(topology)
    if not topo.chip.kind.has_torus:
        return None
    name = f"{topo.chip.name}-{topo.chips_per_slice * topo.chip.tensorcores_per_chip}"
    return name if get_topology(name).chip_dims == topo.chip_dims else None


# MaxText builds splash's metadata from a dense mask, per head: data_next and mask_next (int32)
# and block_mask (int8) for every (q block × kv block). This matches docs/measurements.md: Ulysses 8 at
# 128K overflows the 1 MiB SMEM with blocks of 512 (4 heads: 2.4 MB) and fits with 1024.
MAXTEXT_SMEM_BYTES_PER_BLOCK_PAIR = 4 + 4 + 1


def maxtext_problems(plan: Plan) -> list[str]:
    """MaxText's own rules for the plan's strategy (its spec's `maxtext_problems`, from MaxText's
    types.py), each with the fix."""
    return plan.strategy_spec.maxtext_problems(plan.shape)


def maxtext_block(plan: Plan) -> int:
    """The smallest splash block (from the plan's) whose per-head metadata fits SMEM in MaxText,
    for the kernel shape the plan's strategy spec lays out (MaxText lays its kernels out alike)."""
    layout = plan.strategy_spec.layout(plan.shape)
    q_len, kv_len, heads = float(layout.q_len), float(layout.kv_len), float(layout.q_heads)
    smem = get_topology(plan.topology).chip.smem_bytes
    block = plan.block_q
    while smem and block < min(q_len, kv_len) and \
            heads * math.ceil(q_len / block) * math.ceil(kv_len / block) * MAXTEXT_SMEM_BYTES_PER_BLOCK_PAIR > smem:
        block *= 2
    return block


def plan_to_maxtext(plan: Plan) -> dict[str, object]:
    """MaxText flags for `plan`; splash blocks grow where MaxText's per-head metadata needs it.

    Raises:
        CpplanError: the plan breaks a MaxText rule (`maxtext_problems`), each named with its fix.
    """
    problems = maxtext_problems(plan)
    if problems:
        raise CpplanError("MaxText cannot run this plan: " + "; ".join(problems) + ".")
    mesh = plan.ici_mesh_dict
    spec = plan.strategy_spec
    context, usp_ulysses = spec.maxtext_degrees(mesh["context"], mesh["context_ulysses"])
    block = maxtext_block(plan)
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
        "num_vocab_tiling": max(1, math.ceil(tokens_per_device / plan.loss_chunk_tokens)) if plan.loss_chunk_tokens else 1,
    }
    flags.update({f: block for f in SPLASH_BLOCK_FLAGS})
    if MODELS.get(plan.model.name) == plan.model:
        flags["model_name"] = plan.model.name
    else:
        m = plan.model
        flags.update({"base_num_decoder_layers": m.num_layers, "base_emb_dim": m.hidden, "base_num_query_heads": m.num_heads,
                      "base_num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim, "base_mlp_dim": m.intermediate,
                      "vocab_size": m.vocab})
    if plan.num_slices > 1:
        flags.update({"dcn_data_parallelism": plan.dcn_data, "dcn_fsdp_parallelism": plan.dcn_fsdp,
                      "num_slices": plan.num_slices})
    slice_name = _slice_name(plan.topology)
    if slice_name:
        flags["compile_topology"] = slice_name
        flags["compile_topology_num_slices"] = plan.num_slices
    return flags


def format_flags(flags: dict[str, object]) -> str:
    """`key=value` words for a MaxText command line."""
    return " ".join(f"{k}={shlex.quote(str(v))}" for k, v in flags.items())


def _parse_text(text: str) -> dict[str, str]:
    """`key=value` words of a MaxText command line; a key given twice is refused (which would win?)."""
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise CpplanError(f"cannot split the MaxText flags into words ({err}); close every quote.") from None
    flags: dict[str, str] = {}
    for key, _, value in (w.partition("=") for w in words if "=" in w):
        if key in flags:
            raise CpplanError(f"MaxText flag {key} is given twice ({flags[key]!r} and {value!r}); give it once.")
        flags[key] = value
    return flags


def _int(flags: dict, key: str, default: int) -> int:
    value = flags.get(key, default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CpplanError(f"MaxText flag {key}={value!r} is not a number.") from None
    if not math.isfinite(number) or number != int(number) or number < 0:
        raise CpplanError(f"MaxText flag {key}={value!r} must be a whole number.")
    return int(number)


def _bool(value) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def plan_from_maxtext(flags: "dict | str", *, model: "str | ModelSpec | None" = None,
                      topology: str | None = None) -> Plan:
    """Reads MaxText flags (a dict, or command-line text with ``key=value`` words) into a Plan.

    Args:
        flags: the flags; `model_name` (or base_* shape flags) and `compile_topology` are used
            when `model` / `topology` are not given. Unset flags take MaxText's defaults.
        model: overrides the model.
        topology: overrides the topology (needed when the flags have no compile_topology).
    Raises:
        CpplanError: a missing model or topology, a flag that is not a number, a mesh that
            does not cover the topology, or a strategy name MaxText does not have.
    """
    flags = _parse_text(flags) if isinstance(flags, str) else dict(flags)
    if model is None:
        if "model_name" in flags:
            model = get_model(str(flags["model_name"]))
        elif "base_emb_dim" in flags:
            model = ModelSpec("maxtext-custom", _int(flags, "base_num_decoder_layers", 0), _int(flags, "base_emb_dim", 0),
                              _int(flags, "base_num_query_heads", 0), _int(flags, "base_num_kv_heads", 0),
                              _int(flags, "head_dim", 0), _int(flags, "base_mlp_dim", 0), _int(flags, "vocab_size", 0))
        else:
            raise CpplanError("the MaxText flags name no model: give model_name=... or pass model=.")
    model = get_model(model)
    topology = topology or flags.get("compile_topology")
    if not topology:
        raise CpplanError("the MaxText flags name no topology: give compile_topology=... or pass topology=.")
    topo = get_topology(str(topology), _slices(flags))
    try:
        strategy = CPStrategy.parse(flags.get("context_parallel_strategy", "all_gather"))
    except CpplanError as err:
        raise CpplanError(f"context_parallel_strategy: {err}") from None
    spec = STRATEGIES[strategy]
    # MaxText's -1 means "the rest of the devices" (its default for fsdp); the ring (or plain
    # Ulysses) degree is ici_context_parallelism, USP's Ulysses degree its own flag
    defaults = {"data": 1, "fsdp": -1, "tensor": 1, "context": 1}
    open_axes = [a for a in defaults if str(flags.get(f"ici_{a}_parallelism", defaults[a])).strip() == "-1"]
    if len(open_axes) > 1:
        raise CpplanError(f"only one MaxText ici_*_parallelism may be -1, got {open_axes}; give the others sizes.")
    given = {a: 1 if a in open_axes else _int(flags, f"ici_{a}_parallelism", 1) for a in defaults}
    usp_u = _int(flags, "ici_context_usp_ulysses_parallelism", 1) if strategy is CPStrategy.USP else 1
    if open_axes:
        given[open_axes[0]] = topo.devices_per_slice // (math.prod(given.values()) * usp_u)
    ring, uly = spec.from_maxtext_degrees(given.pop("context"), usp_u)
    if ring == 1 and uly == 1:
        strategy, spec = CPStrategy.NONE, STRATEGIES[CPStrategy.NONE]
    sizes = {**given, "context": ring, "context_ulysses": uly}
    if math.prod(sizes.values()) != topo.devices_per_slice:
        raise CpplanError(f"the MaxText mesh {sizes} covers {math.prod(sizes.values())} devices; "
                          f"{'one slice of ' if topo.num_slices > 1 else ''}{topo.name} has {topo.devices_per_slice}.")
    dcn_data, dcn_fsdp = _dcn_degrees(flags, topo.num_slices)
    sizes["data"] *= dcn_data
    sizes["fsdp"] *= dcn_fsdp
    balanced = _bool(flags.get("context_parallel_load_balance", True))  # MaxText's default: balanced
    if balanced and spec.maxtext_refuses_load_balance:
        raise CpplanError(f"MaxText refuses context_parallel_strategy={strategy.value} with "
                          "context_parallel_load_balance=True (its default); set it to False.")
    load_balance = LoadBalance.ZIGZAG if balanced and spec.balances_load else LoadBalance.NONE
    seq_len = _int(flags, "max_target_length", 2048)
    try:
        per_device = float(flags.get("per_device_batch_size", 12.0))
    except (TypeError, ValueError):
        raise CpplanError(f"MaxText flag per_device_batch_size={flags['per_device_batch_size']!r} is not a number.") from None
    if not math.isfinite(per_device) or per_device <= 0:
        raise CpplanError(f"MaxText flag per_device_batch_size={per_device!r} must be a positive, finite number.")
    global_batch = per_device * topo.num_devices
    if global_batch != int(global_batch) or global_batch < 1:
        raise CpplanError(f"per_device_batch_size={per_device} × {topo.num_devices} devices is not a whole number of sequences.")
    tiling = _int(flags, "num_vocab_tiling", 1)
    tokens_per_device = seq_len * global_batch / topo.num_devices * sizes["tensor"]
    return Plan(
        model=model, topology=topo.name, seq_len=seq_len, global_batch=int(global_batch),
        mesh=make_mesh(**sizes), cp_strategy=strategy, load_balance=load_balance,
        remat=RematPolicy.parse(flags.get("remat_policy", "full")),
        block_q=_int(flags, "sa_block_q", 512), block_kv=_int(flags, "sa_block_kv", 512),
        loss_chunk_tokens=math.ceil(tokens_per_device / tiling) if tiling > 1 else 0,
        param_dtype=str(flags.get("weight_dtype", "float32")), compute_dtype=str(flags.get("dtype", "bfloat16")),
        dcn_data=dcn_data, dcn_fsdp=dcn_fsdp,
    )


def _slices(flags: dict) -> int:
    """The slices the flags run on: `compile_topology_num_slices`, else `num_slices` (MaxText's -1,
    or neither given, is one slice)."""
    for key in ("compile_topology_num_slices", "num_slices"):
        if str(flags.get(key, "-1")).strip() != "-1":
            count = _int(flags, key, 1)
            if count < 1:
                raise CpplanError(f"MaxText flag {key}={flags[key]!r} must be at least 1 slice.")
            return count
    return 1


def _dcn_degrees(flags: dict, slices: int) -> tuple[int, int]:
    """(dcn_data, dcn_fsdp) from MaxText's `dcn_*_parallelism` flags over `slices` slices.

    MaxText's defaults are dcn_data_parallelism=-1 (the slices the other dcn axes leave) and every
    other dcn axis 1.

    Raises:
        CpplanError: a dcn axis other than data and fsdp spans slices, or the degrees do not
            multiply to the slice count.
    """
    crossing = sorted(key for key in flags if key.startswith("dcn_") and key.endswith("_parallelism")
                      and key not in ("dcn_data_parallelism", "dcn_fsdp_parallelism")
                      and str(flags[key]).strip() != "1")
    if crossing:
        raise CpplanError(f"the planner keeps every axis but data and fsdp inside a slice; set "
                          f"{', '.join(f'{k}=1' for k in crossing)} (got {', '.join(str(flags[k]) for k in crossing)}).")
    dcn_fsdp = slices if str(flags.get("dcn_fsdp_parallelism", "1")).strip() == "-1" else \
        _int(flags, "dcn_fsdp_parallelism", 1)
    open_data = str(flags.get("dcn_data_parallelism", "-1")).strip() == "-1"
    if open_data and dcn_fsdp and slices % dcn_fsdp == 0:
        return slices // dcn_fsdp, dcn_fsdp
    dcn_data = slices if open_data else _int(flags, "dcn_data_parallelism", 1)
    if dcn_data * dcn_fsdp != slices:
        raise CpplanError(f"dcn_data_parallelism={dcn_data} × dcn_fsdp_parallelism={dcn_fsdp} must equal the "
                          f"{slices} slice{'s' if slices > 1 else ''} (compile_topology_num_slices).")
    return dcn_data, dcn_fsdp
