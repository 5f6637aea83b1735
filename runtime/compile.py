"""Deviceless TPU compilation: a plan's training step compiled by libtpu for abstract TPU devices.

Nothing is allocated; `memory_analysis()` gives per-device bytes, and a `CompileTimeHbmOom` becomes a
report with `fits=False` and the compiler's figures. `compile_step` also keeps the scheduled HLO.
`compile_in_child` runs `compile_for` in a child process, since libtpu ends the whole process when one
of its checks fails (SIGABRT): the caller gets a report naming the plan and the failed check, and goes on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cost_models.chips import ChipKind
from cost_models.compute import SCOPED_VMEM_FLAG, scoped_vmem_flag
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


# Where cpplan keeps the LIBTPU_INIT_ARGS it was given when it adds its own flags to them, and what it wrote,
# so that a later compile for another chip, here or in a child, starts again from the user's and not from
# another chip's set (v5e's asynchronous collective fusion is refused by v5p's compiler).
USER_COMPILER_ARGS = "CPPLAN_USER_LIBTPU_INIT_ARGS"
WRITTEN_COMPILER_ARGS = "CPPLAN_WRITTEN_LIBTPU_INIT_ARGS"
COMPILER_ARGS_VARIABLES = ("LIBTPU_INIT_ARGS", USER_COMPILER_ARGS, WRITTEN_COMPILER_ARGS)


def user_compiler_args(env) -> str:
    """The LIBTPU_INIT_ARGS the user gave: as kept in `USER_COMPILER_ARGS` while LIBTPU_INIT_ARGS holds what
    cpplan wrote there; otherwise (never written, or set again since) as set."""
    args = env.get("LIBTPU_INIT_ARGS", "")
    if USER_COMPILER_ARGS in env and env.get(WRITTEN_COMPILER_ARGS) == args:
        return env[USER_COMPILER_ARGS]
    return args


def merged_compiler_args(user_args: str, chip_name: str, extra: str = "") -> str:
    """LIBTPU_INIT_ARGS: `user_args` as given, then each of cpplan's flags for `chip_name`, the packed
    placement every TPU compile asks for, and `extra`, that the user did not set, so the user's value
    wins whatever order libtpu reads them in."""
    return users_first(user_args, f"{TPU_COMPILER_FLAGS.get(chip_name, '')} {PACKED_PLACEMENT_FLAG} {extra}")


def users_first(user_args: str, our_args: str) -> str:
    """LIBTPU_INIT_ARGS: `user_args` as given, then each of `our_args` whose flag the user did not set."""
    user = user_args.split()
    named = {_flag_name(arg) for arg in user}
    return " ".join(user + [arg for arg in our_args.split() if _flag_name(arg) not in named])


def with_compiler_flags(env: dict, chip_name: str, extra: str = "") -> dict:
    """A copy of `env` with `merged_compiler_args` in LIBTPU_INIT_ARGS (read once, when the TPU backend
    starts)."""
    user = user_compiler_args(env)
    merged = merged_compiler_args(user, chip_name, extra)
    return {**env, USER_COMPILER_ARGS: user, WRITTEN_COMPILER_ARGS: merged, "LIBTPU_INIT_ARGS": merged}


def use_compiler_flags(chip_name: str, extra: str = "") -> None:
    """Sets this process's LIBTPU_INIT_ARGS to `with_compiler_flags` of it. Call it before jax starts
    the TPU backend (`jax.devices()`, `jax.distributed`): a started backend keeps its flags."""
    flagged = with_compiler_flags(dict(os.environ), chip_name, extra)
    os.environ.update({name: flagged[name] for name in COMPILER_ARGS_VARIABLES})


def plan_compiler_options(plan: Plan) -> dict | None:
    """The options each compile of `plan`'s programs on its devices takes (`Lowered.compile`'s
    `compiler_options`): the scoped VMEM its splash blocks need, or None where the compiler's default
    suffices or the user's LIBTPU_INIT_ARGS set the limit (theirs wins). Per compile, not in the process's
    flags: one process compiles plans of several block sizes, and the raised limit makes every compile
    slower (the 0.5B model's 8K step: 31 s at the default, 85 s at 96 MiB; docs/measurements.md)."""
    limit = plan.scoped_vmem_limit_kib
    user = {_flag_name(arg) for arg in user_compiler_args(os.environ).split()}
    if limit is None or _flag_name(SCOPED_VMEM_FLAG) in user:
        return None
    return scoped_vmem_options(limit)


def scoped_vmem_options(limit_kib: int) -> dict:
    """`Lowered.compile`'s `compiler_options` raising the scoped VMEM limit to `limit_kib`, for one compile."""
    return {_flag_name(SCOPED_VMEM_FLAG): str(limit_kib)}


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
    message: str = ""  # the compiler's error when the step does not fit or no program came out
    failure: str = ""  # why the compiler made no program (an abort, a refusal); "" when it made one or ran out of HBM

    @property
    def required_bytes(self) -> int | None:
        """HBM the step needs per device: `hbm_bytes_per_device`, or the compiler's out-of-memory figure
        (None when the compiler made no program and gave no figure: see `failure`)."""
        return self.hbm_bytes_per_device if self.fits else self.oom_required_bytes

    @property
    def required_gib(self) -> float | None:
        return None if self.required_bytes is None else self.required_bytes / GiB

    def __str__(self) -> str:
        head = f"{self.plan.topology} {self.plan.strategy_label} seq {self.plan.seq_len}"
        if self.failure:
            return f"{head}: no program: {self.failure}"
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


def _check_tpu(plan: Plan) -> None:
    if plan.topology_spec.chip.kind is not ChipKind.TPU:
        raise CpplanError(
            f"compile_for compiles for TPU slices; {plan.topology} is not one. Use runtime.run for cpu:N plans."
        )


def tpu_devices(plan: Plan):
    """Abstract TPU devices of the plan's slice (of each of its slices).

    Raises:
        CpplanError: the plan is not for a TPU, or libtpu is missing.
    """
    topo = plan.topology_spec
    _check_tpu(plan)
    # abstract devices use no TPU: let several processes (e.g. parallel test runs) load libtpu at once
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    # the chip's flags and the scoped VMEM the plan's splash blocks need (a loaded libtpu keeps its own)
    use_compiler_flags(topo.chip.name, scoped_vmem_flag(plan.scoped_vmem_limit_kib))
    try:
        import libtpu  # noqa: F401  (the TPU compiler; get_topology_desc needs it)
    except ImportError:
        raise CpplanError(f"deviceless TPU compilation needs libtpu, which is not installed; {LIBTPU_HINT}.") from None
    from jax.experimental import topologies

    one_slice = dataclasses.replace(topo, num_slices=1).name
    try:
        try:
            return topologies.get_topology_desc(
                topology_name=one_slice, platform="tpu", num_slices=topo.num_slices
            ).devices
        except Exception as err:
            if "chips_per_host_bounds" not in str(err):
                raise
            # a slice smaller than a host (v5e:1x1): libtpu 0.0.42 divides it by its default host of 2x2x1
            # chips and refuses; the slice's own dims are its host's
            host = tuple(topo.chip_dims) + (1,) * (3 - len(topo.chip_dims))
            return topologies.get_topology_desc(
                topology_name=one_slice, platform="tpu", num_slices=topo.num_slices, chips_per_host_bounds=host
            ).devices
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
    process: libtpu reads its flags once, when it loads). The dump is asked for as the user would, so
    that the child's own `use_compiler_flags` keeps it."""
    dump = HLO_DUMP_ARGS.format(dir=directory)
    args = f"{env.get('LIBTPU_INIT_ARGS', '')} {dump}".strip()
    return {
        **env,
        "LIBTPU_INIT_ARGS": args,
        USER_COMPILER_ARGS: f"{user_compiler_args(env)} {dump}".strip(),
        WRITTEN_COMPILER_ARGS: args,
    }


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


def lowered_step(plan: Plan, *, packed: bool = False):
    """The plan's training step lowered for its slice's abstract TPU devices, ready to compile
    (`packed`: with segment ids, as a run over packed documents compiles it)."""
    from runtime.mesh import build_mesh
    from runtime.train import Trainer

    trainer = Trainer(plan, build_mesh(plan, tpu_devices(plan)))
    return trainer.train_step.lower(*trainer.abstract_state(packed=packed))


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


def compile_for(plan: Plan, *, packed: bool = False, compiler_options: dict | None = None) -> CompileReport:
    """Compiles the plan's full training step for its TPU topology, deviceless, in this process; HBM
    overflow gives a `CompileReport` with `fits=False`, not an exception. `packed`: the step with segment
    ids; `compiler_options`: XLA debug options for this compile alone (e.g. `xla_dump_to`). A compiler that
    aborts ends this process: `compile_in_child` survives it.

    Raises:
        CpplanError: the plan cannot run as laid out, the topology is not a TPU, or libtpu is missing.
        jax.errors.JaxRuntimeError: the compiler refused the step for another reason than HBM.
    """
    import jax

    available = plan.topology_spec.hbm_bytes_per_device
    start = time.perf_counter()
    try:
        compiled = lowered_step(plan, packed=packed).compile(compiler_options=compiler_options)
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


# -- a compile in a child process ------------------------------------------------------------------
# The command `compile_in_child` runs, REQUEST and RESULT paths appended (runtime/compile_child.py).
CHILD_COMMAND = (sys.executable, "-m", "runtime.compile_child")
_STOP_POLL_S = 0.5  # how often a child compile that may be stopped asks `should_stop`
_LOG_TAIL_LINES = 40  # of the child's output, kept in a report's message when no program came out
# a failed check as glog writes it: `F1206 11:32:34.123456  4242 llo_loop.cc:175] Check failed: ...`
_FAILED_CHECK = re.compile(r"(?:([\w./+-]+:\d+)\]\s*)?(Check failed:.*)")
_FATAL_LOG = re.compile(r"^F\d{4} [\d:.]+\s+\d+\s+([\w./+-]+:\d+)\]\s*(.+)")


def compiler_abort_line(log: str) -> str | None:
    """The compiler's reason for ending its process, from what the process wrote: its first failed
    check (`llo_loop.cc:175 Check failed: ...`), else its first fatal log line (`F...] message`), else None."""
    lines = log.splitlines()
    for line in lines:
        match = _FAILED_CHECK.search(line)
        if match:
            return " ".join(part for part in (match[1], match[2].strip()) if part)
    for line in lines:
        match = _FATAL_LOG.match(line.strip())
        if match:
            return f"{match[1]} {match[2].strip()}"
    return None


def child_environment(plan: Plan, env: dict | None = None) -> dict:
    """The environment of a child compile of `plan`: `env` (default this process's) with the TPU compiler
    flags `compile_for` would add here (the user's LIBTPU_INIT_ARGS first, so they win), abstract devices
    only (JAX_PLATFORMS=cpu: a TPU this process holds stays its; libtpu loaded beside it), and this
    checkout first on the module path."""
    chip = plan.topology_spec.chip.name
    env = with_compiler_flags(
        dict(os.environ if env is None else env), chip, scoped_vmem_flag(plan.scoped_vmem_limit_kib)
    )
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def compile_in_child(
    plan: Plan,
    *,
    packed: bool = False,
    compiler_options: dict | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> CompileReport | None:
    """`compile_for(plan)` run in a child process (`CHILD_COMMAND`, jax imported afresh there, with
    `child_environment`), so that a compiler that ends its process ends the child alone. The one way
    cpplan compiles a plan that may abort: `cpplan compile`, `run`'s pre-flight and `validate-memory`.

    Args:
        plan: a TPU plan; packed / compiler_options: as `compile_for` takes them.
        should_stop: asked while the child compiles; once true the child is ended and None returned.
    Returns:
        The child's `CompileReport` (the compiler's figures, or `fits=False` and its out-of-memory
        figures); where no program came out, a report with `fits=False` and `failure` saying why: the
        signal that ended the child and the compiler's failed check, read from the child's output
        (`compiler_abort_line`), or the compiler's refusal, or how the child ended. None when stopped.
    Raises:
        CpplanError: the plan is not for a TPU, or the child says the plan cannot run as laid out or
            that jax or libtpu is missing.
    """
    _check_tpu(plan)
    with tempfile.TemporaryDirectory(prefix="cpplan-compile-") as tmp:
        request, result, log = (Path(tmp) / name for name in ("request.json", "result.json", "child.log"))
        options = compiler_options or {}
        request.write_text(json.dumps({"plan": plan.to_dict(), "packed": packed, "compiler_options": options}))
        start = time.perf_counter()
        with open(log, "wb") as output:
            child = subprocess.Popen(
                [*CHILD_COMMAND, str(request), str(result)],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=child_environment(plan),
            )
        try:
            stopped = _wait_for(child, should_stop)
        finally:
            if child.poll() is None:  # stopped, or this process interrupted (KeyboardInterrupt)
                child.kill()
                child.wait()
        if stopped:
            return None
        elapsed = time.perf_counter() - start
        output_text = log.read_text(errors="replace")
        answer = json.loads(result.read_text()) if result.exists() else None
    return _child_report(plan, child.returncode, answer, output_text, elapsed)


def _wait_for(child: subprocess.Popen, should_stop: Callable[[], bool] | None) -> bool:
    """Waits for `child` to end; True when `should_stop` said to stop first (or as it ended)."""
    if should_stop is None:
        child.wait()
        return False
    while True:
        try:
            child.wait(timeout=_STOP_POLL_S)
        except subprocess.TimeoutExpired:
            if should_stop():
                return True
            continue
        return should_stop()  # a Ctrl-C reaches the child too: it is the stop, not the plan's failure


def _child_report(plan: Plan, returncode: int, answer: dict | None, output: str, elapsed: float) -> CompileReport:
    """What a child compile came to, as a `CompileReport`."""
    tail = "\n".join(output.strip().splitlines()[-_LOG_TAIL_LINES:])
    if answer is not None and answer["outcome"] == "compiled":
        return CompileReport(plan=plan, **answer["report"])
    if answer is not None and answer["outcome"] == "error":  # the plan, or this install, not the compiler
        raise CpplanError(answer["message"])
    if answer is not None:  # "refused": the compiler said no for another reason than HBM
        first = answer["message"].strip().splitlines()[0] if answer["message"].strip() else "(no message)"
        failure = f"the TPU compiler refused it: {first[:300]}"
        message = answer["message"]
    elif returncode < 0:
        name = signal.Signals(-returncode).name
        line = compiler_abort_line(output)
        if line is not None:
            failure = f"the TPU compiler ended its process ({name}): {line}"
        elif -returncode == signal.SIGKILL:
            failure = "the compile process was killed (SIGKILL), e.g. by the host's out-of-memory killer"
        else:
            failure = f"the compile process was ended by {name} with no failed check in its output"
        message = tail
    else:
        last = tail.splitlines()[-1] if tail else "no output"
        failure = f"the compile process exited with status {returncode} and no result: {last}"
        message = tail
    return CompileReport(
        plan=plan,
        fits=False,
        compile_s=elapsed,
        available_bytes=plan.topology_spec.hbm_bytes_per_device,
        message=message,
        failure=failure,
    )
