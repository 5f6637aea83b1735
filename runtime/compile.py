"""Deviceless TPU compilation: a plan's training step compiled by libtpu for abstract TPU devices.

Nothing is allocated; `memory_analysis()` gives per-device bytes, and a `CompileTimeHbmOom` becomes a
report with `fits=False` and the compiler's figures. `compile_step` also keeps the scheduled HLO.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass

from cost_models.chips import ChipKind
from cost_models.compute import scoped_vmem_flag
from cost_models.errors import CpplanError
from cost_models.pricing.memory import PACKED_PLACEMENT_FLAG
from cost_models.units import GiB
from planner.plan import Plan

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
LIBTPU_HINT = "install it with `pip install libtpu==0.0.52` (or `pip install 'cpplan[runtime]'`)"

# The TPU compiler flags that shape the schedule of cpplan's runs and compiles, per chip row (others:
# libtpu's defaults); regenerate/fit_overlap.py compiles with the same, so the overlap the price reads
# is what runs. Every TPU compile also asks for PACKED_PLACEMENT_FLAG, which places the buffers of the
# schedule made and leaves the schedule as it is (the same live peak at every position).
# v5e: MaxText's asynchronous-collective set; v5p: none (libtpu 0.0.52 refuses that set's fusion).
# evidence: docs/provenance/runtime.md#compiler-flags
TPU_COMPILER_FLAGS: dict[str, str] = {
    "v5e": (
        "--xla_tpu_enable_data_parallel_all_reduce_opt=true --xla_tpu_data_parallel_opt_different_sized_ops=true "
        "--xla_tpu_enable_async_collective_fusion=true --xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
        "--xla_tpu_enable_async_collective_fusion_multiple_steps=true --xla_tpu_overlap_compute_collective_tc=true "
        "--xla_enable_async_all_gather=true"
    ),
}


def _flag_name(arg: str) -> str:
    """The name of a libtpu flag argument, `--name=value` or `--name`."""
    return arg.split("=", 1)[0].lstrip("-")


def merged_compiler_args(user_args: str, chip_name: str, extra: str = "") -> str:
    """LIBTPU_INIT_ARGS: `user_args` as given, then each of cpplan's flags for `chip_name`, the packed
    placement every TPU compile asks for, and `extra`, that the user did not set, so the user's value
    wins whatever order libtpu reads them in."""
    user = user_args.split()
    named = {_flag_name(arg) for arg in user}
    flags = f"{TPU_COMPILER_FLAGS.get(chip_name, '')} {PACKED_PLACEMENT_FLAG} {extra}"
    ours = [arg for arg in flags.split() if _flag_name(arg) not in named]
    return " ".join(user + ours)


def with_compiler_flags(env: dict, chip_name: str, extra: str = "") -> dict:
    """A copy of `env` with `merged_compiler_args` in LIBTPU_INIT_ARGS (read once, when the TPU backend
    starts)."""
    merged = merged_compiler_args(env.get("LIBTPU_INIT_ARGS", ""), chip_name, extra)
    return {**env, "LIBTPU_INIT_ARGS": merged} if merged else dict(env)


def use_compiler_flags(chip_name: str, extra: str = "") -> None:
    """Sets this process's LIBTPU_INIT_ARGS to `with_compiler_flags` of it. Call it before jax starts
    the TPU backend (`jax.devices()`, `jax.distributed`): a started backend keeps its flags."""
    flagged = with_compiler_flags(dict(os.environ), chip_name, extra)
    if "LIBTPU_INIT_ARGS" in flagged:
        os.environ["LIBTPU_INIT_ARGS"] = flagged["LIBTPU_INIT_ARGS"]


@dataclass(frozen=True, kw_only=True)
class CompiledMemory:
    """Per-device bytes of a compiled program, as XLA's `memory_analysis()` reports them."""

    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0
    temp_bytes: int = 0
    code_bytes: int = 0  # generated_code_size_in_bytes

    @classmethod
    def of(cls, compiled) -> "CompiledMemory | None":
        """The figures of a `jax.stages.Compiled`, or None where the backend reports none."""
        mem = compiled.memory_analysis()
        if mem is None:
            return None
        return cls(
            argument_bytes=mem.argument_size_in_bytes,
            output_bytes=mem.output_size_in_bytes,
            alias_bytes=mem.alias_size_in_bytes,
            temp_bytes=mem.temp_size_in_bytes,
            code_bytes=mem.generated_code_size_in_bytes,
        )

    @property
    def hbm_bytes_per_device(self) -> int:
        """Arguments + outputs − aliased + temporaries + code (the executable lives in HBM too): the one
        definition of "HBM from the compiler" that runs and deviceless compiles share."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes


@dataclass(frozen=True, kw_only=True)
class CompileReport(CompiledMemory):
    """What the XLA TPU compiler says about a plan's training step, per device."""

    plan: Plan
    fits: bool  # False when the step does not fit in HBM (the memory figures are then zero)
    compile_s: float  # lowering plus compiling
    available_bytes: int  # the compiler's figure when the step does not fit, else the chip row's
    oom_required_bytes: int | None = None  # the out-of-memory error's figure (temporaries or total)
    message: str = ""  # the compiler's error when the step does not fit

    @property
    def required_bytes(self) -> int:
        """HBM the step needs per device: `hbm_bytes_per_device`, or the compiler's out-of-memory figure."""
        return self.hbm_bytes_per_device if self.fits else self.oom_required_bytes

    @property
    def required_gib(self) -> float:
        return self.required_bytes / GiB

    def __str__(self) -> str:
        head = f"{self.plan.topology} {self.plan.strategy_label} seq {self.plan.seq_len}"
        if not self.fits:
            return (
                f"{head}: does not fit: needs {self.required_bytes / GiB:.1f} GiB > "
                f"{self.available_bytes / GiB:.1f} GiB per device (compiled in {self.compile_s:.0f} s)"
            )
        return (
            f"{head}: {self.required_gib:.2f} GiB per device (arguments {self.argument_bytes / GiB:.2f}, "
            f"temporaries {self.temp_bytes / GiB:.2f}, outputs {self.output_bytes / GiB:.2f}, aliased "
            f"{self.alias_bytes / GiB:.2f}, code {self.code_bytes / GiB:.2f}) of {self.available_bytes / GiB:.1f} "
            f"GiB; compiled in {self.compile_s:.1f} s"
        )


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit.upper()])


def parse_hbm_oom(message: str) -> tuple[int, int] | None:
    """`(required, available)` bytes from a `CompileTimeHbmOom` error, or None if it is not one. Reads
    "required ... (X) exceeds available HBM (Y)", "requires X, which exceeds available HBM (Y)" and
    "memory space hbm. Used X of Y hbm" (docs/provenance/runtime.md#compile-time-hbm-oom)."""
    if "CompileTimeHbmOom" not in message and "RESOURCE_EXHAUSTED" not in message:
        return None
    size = r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)i?B?"
    space = re.search(r"memory space hbm\. Used\s+" + size + r"\s+of\s+" + size + r"\s+hbm", message)
    if space:
        return _bytes(*space.groups()[:2]), _bytes(*space.groups()[2:])
    need = re.search(r"required[^(]*\(\s*" + size + r"\s*\)", message) or re.search(
        r"(?:requires|[Uu]sed)\s+" + size, message
    )
    have = re.search(r"available HBM\s*\(\s*" + size + r"\s*\)", message)
    if not need or not have:
        return None
    return _bytes(*need.groups()), _bytes(*have.groups())


def tpu_devices(plan: Plan):
    """Abstract TPU devices of the plan's slice (of each of its slices).

    Raises:
        CpplanError: the plan is not for a TPU, or libtpu is missing.
    """
    topo = plan.topology_spec
    if topo.chip.kind is not ChipKind.TPU:
        raise CpplanError(
            f"compile_for compiles for TPU slices; {plan.topology} is not one. Use runtime.run for cpu:N plans."
        )
    # abstract devices use no TPU: let several processes (e.g. parallel test runs) load libtpu at once
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    # the chip's flags and the scoped VMEM the plan's splash blocks need (a loaded libtpu keeps its own)
    use_compiler_flags(topo.chip.name, scoped_vmem_flag(plan.scoped_vmem_limit_kib))
    try:
        import libtpu  # noqa: F401  (the TPU compiler; get_topology_desc needs it)
    except ImportError:
        raise CpplanError(f"deviceless TPU compilation needs libtpu, which is not installed; {LIBTPU_HINT}.") from None
    from jax.experimental import topologies

    try:
        topo = plan.topology_spec
        one_slice = dataclasses.replace(topo, num_slices=1).name
        return topologies.get_topology_desc(topology_name=one_slice, platform="tpu", num_slices=topo.num_slices).devices
    except Exception as err:  # libtpu present but unusable: say so with the cause
        raise CpplanError(
            f"libtpu could not describe {plan.topology}: {err}. Check the libtpu install; {LIBTPU_HINT}."
        ) from None


@dataclass(frozen=True, kw_only=True)
class CompiledStep:
    """A plan's training step as the XLA TPU compiler scheduled it (one device's program)."""

    plan: Plan
    hlo_text: str  # the scheduled module
    cost_flops: float  # cost_analysis()["flops"]: a while body counted once, Mosaic kernels left out
    compile_s: float  # lowering plus compiling
    memory: CompiledMemory


HLO_DUMP_ARGS = "--xla_jf_dump_to={dir} --xla_jf_dump_hlo_text=true --xla_jf_dump_llo_text=false"


def with_hlo_dump(env: dict, directory: str) -> dict:
    """A copy of `env` whose TPU compiler writes its scheduled modules to `directory` (for a child
    process: libtpu reads its flags once, when it loads)."""
    args = f"{env.get('LIBTPU_INIT_ARGS', '')} {HLO_DUMP_ARGS.format(dir=directory)}".strip()
    return {**env, "LIBTPU_INIT_ARGS": args}


def _dumped_module(*, since: float) -> str | None:
    """The scheduled module the TPU compiler wrote under `--xla_jf_dump_to` (its `*-TLP-hlo.txt`)
    after `since` (a `time.perf_counter()` reading), or None when it dumps nowhere."""
    match = re.search(r"--xla_jf_dump_to=(\S+)", os.environ.get("LIBTPU_INIT_ARGS", ""))
    if not match or not os.path.isdir(match.group(1)):
        return None
    started = time.time() - (time.perf_counter() - since)
    paths = [os.path.join(match.group(1), name) for name in os.listdir(match.group(1)) if name.endswith("-TLP-hlo.txt")]
    paths = [p for p in paths if os.path.getmtime(p) >= started - 1]
    if not paths:
        return None
    with open(max(paths, key=os.path.getmtime)) as f:
        return f.read()


def lowered_step(plan: Plan):
    """The plan's training step lowered for its slice's abstract TPU devices, ready to compile."""
    from runtime.mesh import build_mesh
    from runtime.train import Trainer

    trainer = Trainer(plan, build_mesh(plan, tpu_devices(plan)))
    return trainer.train_step.lower(*trainer.abstract_state())


def compile_step(plan: Plan) -> CompiledStep:
    """Compiles the plan's training step deviceless, keeping its scheduled HLO and cost analysis.

    Raises:
        CpplanError: the plan cannot run as laid out, the topology is not a TPU, libtpu is
            missing, the step does not fit in HBM, or the compiler cannot print the module.
    """
    import jax

    start = time.perf_counter()
    try:
        compiled = lowered_step(plan).compile()
    except jax.errors.JaxRuntimeError as err:
        if parse_hbm_oom(str(err)) is None:
            raise
        raise CpplanError(
            f"{plan.topology} {plan.strategy_label} seq {plan.seq_len} does not fit in HBM, so it "
            f"has no compiled program to read: {str(err).splitlines()[0]}. Use a smaller plan."
        ) from None
    elapsed = time.perf_counter() - start
    try:
        text = compiled.as_text()
    except Exception as err:  # libtpu 0.0.52 cannot print modules with async updates (tpu7x steps)
        text = _dumped_module(since=start)
        if text is None:
            raise CpplanError(
                f"the TPU compiler could not print the scheduled module of {plan.topology} "
                f"{plan.strategy_label} ({str(err).splitlines()[0]}); start the process with "
                f"{HLO_DUMP_ARGS.format(dir='DIR')} in LIBTPU_INIT_ARGS (before jax loads libtpu) "
                f"and compile_step reads the module the compiler writes there."
            ) from None
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    return CompiledStep(
        plan=plan,
        hlo_text=text,
        cost_flops=float(analysis.get("flops", 0.0)),
        compile_s=elapsed,
        memory=CompiledMemory.of(compiled),
    )


def compile_for(plan: Plan, *, compiler_options: dict | None = None) -> CompileReport:
    """Compiles the plan's full training step for its TPU topology, deviceless; HBM overflow gives a
    `CompileReport` with `fits=False`, not an exception. `compiler_options`: XLA debug options for this
    compile alone (e.g. `xla_dump_to`).

    Raises:
        CpplanError: the plan cannot run as laid out, the topology is not a TPU, or libtpu is missing.
    """
    import jax

    available = plan.topology_spec.hbm_bytes_per_device
    start = time.perf_counter()
    try:
        compiled = lowered_step(plan).compile(compiler_options=compiler_options)
    except jax.errors.JaxRuntimeError as err:
        parsed = parse_hbm_oom(str(err))
        if parsed is None:
            raise
        need, have = parsed
        return CompileReport(
            plan=plan,
            fits=False,
            compile_s=time.perf_counter() - start,
            available_bytes=have,
            oom_required_bytes=need,
            message=str(err).strip(),
        )
    elapsed = time.perf_counter() - start
    return CompileReport(
        plan=plan,
        fits=True,
        compile_s=elapsed,
        available_bytes=available,
        **dataclasses.asdict(CompiledMemory.of(compiled)),
    )
