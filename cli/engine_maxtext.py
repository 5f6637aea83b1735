"""`cpplan run --engine maxtext`: the planner's choice trained by MaxText 0.2.5, in a process of its own.

The plans are searched as MaxText runs them (`--target maxtext`: its memory, only plans it accepts) and
each is written as a MaxText config (`run-dir/maxtext/config.yml`: `base_config: base.yml` and the flags
`planner.maxtext.export_maxtext` gives, the one source of them). Best first, each is pre-flighted by
MaxText's own ahead-of-time compile, `python -m maxtext.trainers.pre_train.train_compile` (deviceless for
a TPU slice; for a `cpu:N` host, which MaxText's accelerator map does not name, `cli/maxtext_host_compile.py`
runs the same `main` on the host's devices). A plan whose compile runs out of memory, or whose compiled
step holds more than the chip row's memory, is left for the next; a compile that crashes or exits with
an error is a failed plan, not a failed command. The first that passes is trained by
`python -m maxtext.trainers.pre_train.train CONFIG` plus the user's `--maxtext-arg KEY=VALUE` words, and
each step line MaxText logs (`maxtext/common/metric_logger.py`, `_log_training_metrics`: `completed step:
N, seconds: S, TFLOP/s/device: T, Tokens/s/device: K, total_weights: W, loss: L, ...`) becomes a record
of `metrics.jsonl` as it comes (`runtime.metrics.StepLog`, the format of cpplan's own runs), with MFU
against the chip row's peak as the MaxText-target price has it. SIGTERM or Ctrl-C is passed on to MaxText,
which is waited for, and what it measured is reported.

cpplan's optimizer flags become MaxText's (`optimizer_flags`); without them MaxText keeps its own defaults,
which are cpplan's (`runtime.optimizer`). `cpplan validate --engine maxtext` (`cli/maxtext_validate.py`) runs
each plan it chooses through the same `prepare` and `train`.

MaxText runs in the Python given by `--maxtext-python` (default: `$CPPLAN_MAXTEXT_VENV/bin/python`
where that is set, the variable `benchmarks/bench_maxtext.py` reads, else this Python).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cost_models.chips import ChipKind
from cost_models.errors import CpplanError
from cost_models.flops import model_flops_per_step
from cost_models.targets import Target
from cost_models.topology import get_topology
from cost_models.units import GiB, MiB
from cost_models.vocabulary import CPStrategy
from runtime.compile import user_compiler_args, users_first

ENGINES = ("cpplan", "maxtext")
MAXTEXT_VERSION = "0.2.5"  # the release whose log lines, modules and rules this module reads
VENV_ENV = "CPPLAN_MAXTEXT_VENV"
INSTALL_HINT = (
    f"install it in a Python 3.12 venv of its own (python3.12 -m venv mt && mt/bin/pip install "
    f"'maxtext[tpu]=={MAXTEXT_VERSION}') and give --maxtext-python mt/bin/python (or set {VENV_ENV}=mt)"
)
TRAIN_MODULE = "maxtext.trainers.pre_train.train"
COMPILE_MODULE = "maxtext.trainers.pre_train.train_compile"
HOST_COMPILE = Path(__file__).with_name("maxtext_host_compile.py")
MAXTEXT_DIR = "maxtext"  # under --run-dir: the config, the logs, and MaxText's own outputs
CONFIG_FILE = "config.yml"
TRAIN_LOG = "train.log"
COMPILE_LOG = "compile-{rank}.log"
RUN_NAME = "train"  # MaxText writes under base_output_directory/run_name: checkpoints/, tensorboard/

# MaxText on a host (configs/types.py and layers/attention_op.py of 0.2.5): `hardware=cpu` (else it looks
# for TPUs), one process (its CPU set-up of jax.distributed needs a launcher's JOB_INDEX), and attention
# as `dot_product` (`flash` off a TPU is its GPU Triton kernel). Of the context-parallel strategies only
# all-gather runs there: ring needs a GPU or a TPU, Ulysses and USP a TPU.
HOST_FLAGS = {"hardware": "cpu", "skip_jax_distributed_system": True, "attention": "dot_product"}
HOST_STRATEGY = CPStrategy.ALL_GATHER
# what the engine writes beside the plan's flags; the user's --maxtext-arg may set these
RUN_DEFAULTS = {"run_name": RUN_NAME, "dataset_type": "synthetic"}
# jax's persistent compilation cache: MaxText sets its own, jax_cache_dir (base.yml: ~/jax_cache), over jax's
# variable; where the variable is set it is passed on as jax_cache_dir, so one cache serves both
JAX_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"

# a step as MaxText 0.2.5 logs it (maxtext/common/metric_logger.py, MetricLogger._log_training_metrics);
# a profiler's boundary step is logged without its time and is not a step here
STEP_LINE = re.compile(r"completed step: (\d+), seconds: ([0-9.]+)")
LOSS_FIELD = re.compile(r", loss: ([^,\s]+)")
TFLOPS_FIELD = re.compile(r"TFLOP/s/device: ([0-9.]+)")
# train_compile's last line (maxtext/trainers/pre_train/train_compile.py: `Memory analysis: {...}`)
MEMORY_LINE = re.compile(r"Memory analysis: CompiledMemoryStats\((.*)\)")
MEMORY_FIELDS = {
    "argument_bytes": "argument_size_in_bytes",
    "output_bytes": "output_size_in_bytes",
    "alias_bytes": "alias_size_in_bytes",
    "temp_bytes": "temp_size_in_bytes",
    "code_bytes": "generated_code_size_in_bytes",
}
FLAG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
POLL_S = 0.5  # how often a wait on MaxText asks whether a signal came
STOP_GRACE_S = 120.0  # how long MaxText gets to end after the signal is passed on (it may save a checkpoint)
TAIL_LINES = 15  # of a failed MaxText process's log, printed

# `cpplan run` flags the MaxText engine reads beside the planning ones (`cli.args.add_search_options`): the
# run's length and directory, the pre-flight's, its own, and the optimizer's (`optimizer_flags`); of the planning
# ones, cpplan's data is not MaxText's
READ_FLAGS = {
    "steps",
    "run_dir",
    "max_fallbacks",
    "dry_run",
    "engine",
    "maxtext_arg",
    "maxtext_python",
    "learning_rate",
    "warmup_steps",
    "decay",
    "final_lr_fraction",
    "weight_decay",
    "clip_norm",
}
UNREAD_PLANNING_FLAGS = {"data", "data_dtype", "eos_id"}
# what MaxText has in place of a flag of cpplan's runtime, for the refusal's fix
MAXTEXT_EQUIVALENTS = {
    "data": "its dataset flags, e.g. --maxtext-arg dataset_type=grain --maxtext-arg grain_train_files=PATTERN",
    "data_dtype": "its dataset flags (dataset_type, grain_file_type, ...)",
    "eos_id": "its dataset flags (its tokenizer's end-of-sequence token)",
    "pack": "--maxtext-arg packing=true",
    "seed": "--maxtext-arg init_weights_seed=N (and data_shuffle_seed=N)",
    "checkpoint_every": "--maxtext-arg checkpoint_period=N",
    "keep_checkpoints": "--maxtext-arg max_num_checkpoints_to_keep=N",
    "resume": "MaxText resumes from its checkpoints under --run-dir itself: give another --run-dir to start afresh",
    "resume_from": "MaxText resumes from the newest checkpoint under --run-dir",
    "profile_steps": "--maxtext-arg profiler=xplane --maxtext-arg skip_first_n_steps_for_profiler=A "
    "--maxtext-arg profiler_steps=N",
    **dict.fromkeys(
        ("coordinator", "num_processes", "process_id", "join_timeout"),
        "no such flag here: this engine runs MaxText as one process on one host",
    ),
}


RUN_ENGINE_HELP = (
    "what trains the chosen plan: cpplan's runtime, or MaxText 0.2.5 in a process of its own (the plan "
    "searched as MaxText runs it, pre-flighted by its train_compile, its step log read into metrics.jsonl)"
)


# MaxText 0.2.5's optimizer flags (maxtext/configs/base.yml) that cpplan's optimizer flags set, each with the flag
# that sets it. Its schedule (maxtext/utils/maxtext_utils.py, create_learning_rate_schedule): a linear warmup of
# int(steps × warmup_steps_fraction) steps from 0, then lr_schedule_type 'cosine' (half a cosine to
# learning_rate × learning_rate_final_fraction at the last step) or 'wsd' (the peak held, then the last
# int(steps × wsd_decay_steps_fraction) steps decay to that floor, wsd_decay_style 'linear' or 'cosine').
# cpplan's cosine is MaxText's; its linear decay from the warmup's end is wsd with every step after the warmup
# decaying, linearly; its constant rate is wsd with no decay steps.
OPTIMIZER_KEYS = {
    "learning_rate": "--learning-rate",
    "warmup_steps_fraction": "--warmup-steps",
    "lr_schedule_type": "--decay",
    "wsd_decay_style": "--decay",
    "wsd_decay_steps_fraction": "--decay",
    "learning_rate_final_fraction": "--final-lr-fraction",
    "adam_weight_decay": "--weight-decay",
    "gradient_clipping_threshold": "--clip-norm",
}


def add_arguments(p: argparse.ArgumentParser, engine_help: str = RUN_ENGINE_HELP) -> None:
    """The engine's flags of a command that runs plans: --engine, --maxtext-arg and --maxtext-python."""
    p.add_argument("--engine", choices=ENGINES, default="cpplan", help=engine_help)
    p.add_argument(
        "--maxtext-arg",
        action="append",
        metavar="KEY=VALUE",
        help="with --engine maxtext: a MaxText flag passed on as given (repeatable), e.g. its data and checkpoint "
        "flags (dataset_type=grain grain_train_files=..., checkpoint_period=100, load_parameters_path=...); "
        "the flags of the plan itself are cpplan's to set (default: dataset_type=synthetic)",
    )
    p.add_argument(
        "--maxtext-python",
        metavar="PYTHON",
        help=f"with --engine maxtext: the Python that has MaxText {MAXTEXT_VERSION} installed (default: "
        f"${VENV_ENV}/bin/python where {VENV_ENV} is set, else this Python)",
    )


@dataclass(frozen=True)
class MaxTextStep:
    """One step as MaxText logged it (its index counts from 0)."""

    index: int
    seconds: float
    loss: float
    tflops_per_device: float | None  # MaxText's own count per device and second (absent while its batch ramps up)


def parse_step_line(line: str) -> MaxTextStep | None:
    """The step a MaxText 0.2.5 log line reports, or None where the line is no step's."""
    step = STEP_LINE.search(line)
    if step is None:
        return None
    loss = LOSS_FIELD.search(line)
    tflops = TFLOPS_FIELD.search(line)
    return MaxTextStep(
        index=int(step[1]),
        seconds=float(step[2]),
        loss=float(loss[1]) if loss else math.nan,
        tflops_per_device=float(tflops[1]) if tflops else None,
    )


def parse_memory_line(output: str):
    """train_compile's `Memory analysis` figures as a `runtime.compile.CompiledMemory`, or None."""
    from runtime.compile import CompiledMemory

    match = MEMORY_LINE.search(output)
    if match is None:
        return None
    fields = dict(re.findall(r"(\w+)=(\d+)", match[1]))
    if not all(name in fields for name in MEMORY_FIELDS.values()):
        return None
    return CompiledMemory(**{ours: int(fields[theirs]) for ours, theirs in MEMORY_FIELDS.items()})


def yaml_value(value: object) -> str:
    """A flag's value as YAML that MaxText's OmegaConf reads as the command line's `key=value` would be."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if text.startswith("[") and text.endswith("]"):  # a list in command-line form, e.g. [silu,linear]
        return "[" + ", ".join(json.dumps(item.strip()) for item in text[1:-1].split(",") if item.strip()) + "]"
    return json.dumps(text)


def config_text(flags: dict[str, object]) -> str:
    """A MaxText config of `flags` over MaxText's base.yml."""
    lines = ['base_config: "base.yml"'] + [f"{key}: {yaml_value(value)}" for key, value in flags.items()]
    return "\n".join(lines) + "\n"


def owned_flags(exported, host: bool) -> dict[str, object]:
    """The flags a plan's MaxText run takes from the plan (`planner.maxtext.MaxTextExport`), a host's among them."""
    return {**exported.flags, **(HOST_FLAGS if host else {}), **exported.compile_flags}


def user_flags(words: list[str], owned: dict[str, object], optimizer: dict[str, object] | None = None) -> list[str]:
    """The `--maxtext-arg` words, checked: KEY=VALUE each, none setting a flag of the plan (`owned`), one that
    cpplan's optimizer flags set (`optimizer`, `optimizer_flags`' answer), or the run's length.

    Raises:
        CpplanError: a word that is not KEY=VALUE, or one that sets what the plan or an optimizer flag sets.
    """
    for word in words:
        key, eq, _ = word.partition("=")
        if not eq or not FLAG_KEY.fullmatch(key):
            raise CpplanError(
                f"--maxtext-arg {word!r}: write one MaxText flag as KEY=VALUE, e.g. --maxtext-arg "
                f"checkpoint_period=100."
            )
        if key == "steps":
            raise CpplanError(f"--maxtext-arg {word!r}: the run's length is --steps; give --steps instead.")
        if optimizer and key in optimizer:
            raise CpplanError(
                f"--maxtext-arg {word!r}: {key} is set by {OPTIMIZER_KEYS[key]} here ({key}={optimizer[key]}); "
                f"give the value once, with {OPTIMIZER_KEYS[key]} or with --maxtext-arg."
            )
        if key in owned:
            raise CpplanError(
                f"--maxtext-arg {word!r}: {key} is the plan's ({key}={owned[key]}), which MaxText runs as priced; "
                f"choose the plan with cpplan's flags instead (--mesh, --strategies, --remat, --load-balance, "
                f"--exact-batch, ...)."
            )
    return list(words)


def maxtext_python(args: argparse.Namespace) -> str:
    """The Python that runs MaxText, checked to have it installed.

    Raises:
        CpplanError: it does not run, or has no MaxText.
    """
    if args.maxtext_python:
        python, source = args.maxtext_python, "--maxtext-python"
    elif os.environ.get(VENV_ENV):
        python, source = str(Path(os.environ[VENV_ENV]) / "bin" / "python"), f"${VENV_ENV}"
    else:
        python, source = sys.executable, "this Python (no --maxtext-python given)"
    probe = "import importlib.metadata as m, maxtext.trainers; print(m.version('maxtext'))"
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CpplanError(f"{source} {python!r} does not run ({err}); {INSTALL_HINT}.") from None
    if found.returncode != 0:
        last = (found.stderr.strip().splitlines() or ["no output"])[-1]
        raise CpplanError(f"{source} {python!r} has no MaxText ({last}); {INSTALL_HINT}.")
    version = found.stdout.strip()
    if version != MAXTEXT_VERSION:
        print(
            f"cpplan: note: {python} has MaxText {version}; this engine reads MaxText {MAXTEXT_VERSION}'s step "
            f"lines and modules, and another release may log or name them otherwise",
            file=sys.stderr,
        )
    return python


def refuse_runtime_flags(args: argparse.Namespace) -> None:
    """Refuses the flags of cpplan's own runtime that MaxText does not read, each with MaxText's equivalent.

    Raises:
        CpplanError: such a flag given with a value other than its default.
    """
    from cli.args import add_search_options
    from cli.main import build_parser

    required = ["--model", "m", "--seq-len", "1", "--topology", "cpu:8"]
    defaults = build_parser().parse_args(["run", *required])
    planning = argparse.ArgumentParser()
    add_search_options(planning)
    read = READ_FLAGS | (set(vars(planning.parse_args(required))) - UNREAD_PLANNING_FLAGS)
    for name, value in sorted(vars(args).items()):
        if name in read or value == getattr(defaults, name, value):
            continue
        flag = "--" + name.replace("_", "-")
        fix = MAXTEXT_EQUIVALENTS.get(name, "its own flags, through --maxtext-arg KEY=VALUE")
        raise CpplanError(
            f"{flag} is a flag of cpplan's own runtime, which --engine maxtext does not read; MaxText has {fix} "
            f"(or leave out --engine maxtext to run on cpplan's runtime)."
        )


def step_fraction(count: int, steps: int) -> float:
    """The least fraction `f` of `steps` whose MaxText step count, `int(steps * f)`, is `count` (count / steps
    may multiply back to just under `count`, which int() would round down)."""
    fraction = count / steps
    while int(steps * fraction) < count:
        fraction = math.nextafter(fraction, math.inf)
    return fraction


def optimizer_flags(args: argparse.Namespace) -> dict[str, object]:
    """MaxText's flags for the optimizer flags given (`cli.args.add_optimizer_options`), over `--steps`; none
    given, none: MaxText keeps its defaults, which are cpplan's (`runtime.optimizer`).

    Raises:
        CpplanError: a value out of its range (`cli.args.optimizer_of`'s checks), or a schedule MaxText's
            fractions of the run cannot express.
    """
    from cli.args import optimizer_of

    adamw = optimizer_of(args)  # the ranges checked; its warmup is MaxText's int(steps × fraction)
    flags: dict[str, object] = {}
    if args.learning_rate is not None:
        flags["learning_rate"] = args.learning_rate
    if args.warmup_steps is not None:
        flags["warmup_steps_fraction"] = step_fraction(args.warmup_steps, args.steps)
    if args.decay == "cosine":
        flags["lr_schedule_type"] = "cosine"
    elif args.decay == "constant":
        flags.update(lr_schedule_type="wsd", wsd_decay_steps_fraction=0.0)
    elif args.decay == "linear":
        decaying = args.steps - adamw.warmup
        if decaying == 1:
            # optax's linear_schedule over 0 transition steps (MaxText's one decay step) holds its start
            raise CpplanError(
                f"--decay linear with --steps {args.steps} and {adamw.warmup} warmup steps: one step after the "
                f"warmup, which cpplan's linear decay sets at the floor and MaxText's (wsd, linear) at the peak; "
                f"give more --steps or fewer --warmup-steps, or --decay cosine."
            )
        # the warmup written out even where it is MaxText's default: 0.1 + the decay's share of, say, 15 steps
        # (14/15) is over 1, where the warmup's own share, 1/15, is not
        warmup_fraction = flags.setdefault("warmup_steps_fraction", step_fraction(adamw.warmup, args.steps))
        fraction = step_fraction(decaying, args.steps)
        if warmup_fraction + fraction > 1.0:  # MaxText's check of a wsd schedule (configs/types.py)
            raise CpplanError(
                f"--decay linear with --steps {args.steps} and {adamw.warmup} warmup steps: MaxText's fractions of "
                f"the run for the warmup ({warmup_fraction!r}) and the decay ({fraction!r}) add up to more than 1, "
                f"which it refuses; give another --steps or --warmup-steps."
            )
        flags.update(lr_schedule_type="wsd", wsd_decay_style="linear", wsd_decay_steps_fraction=fraction)
    if args.final_lr_fraction is not None:
        flags["learning_rate_final_fraction"] = args.final_lr_fraction
    if args.weight_decay is not None:
        flags["adam_weight_decay"] = args.weight_decay
    if args.clip_norm is not None:
        flags["gradient_clipping_threshold"] = args.clip_norm
    return flags


def search_args(args: argparse.Namespace, host: bool) -> argparse.Namespace:
    """The run's flags as a search for MaxText reads them: `--target maxtext`, and on a host the one strategy
    MaxText runs there.

    Raises:
        CpplanError: --strategies on a host without all_gather.
    """
    from cli.args import csv_words

    searched = argparse.Namespace(**{**vars(args), "target": Target.MAXTEXT.value})
    if host:
        asked = csv_words(args.strategies)
        if asked is not None and HOST_STRATEGY.value not in asked:
            raise CpplanError(
                f"--strategies {args.strategies} with --engine maxtext on {args.topology}: on a host MaxText "
                f"{MAXTEXT_VERSION} runs context parallelism as {HOST_STRATEGY.value} only (its ring needs a GPU "
                f"or a TPU, its ulysses and usp a TPU); allow {HOST_STRATEGY.value}, or run on a TPU slice."
            )
        searched.strategies = HOST_STRATEGY.value
    return searched


def engine_topology(args: argparse.Namespace, *, dry_run: bool | None = None):
    """The topology MaxText runs the plans on, and whether it is a host's (`cpu:N`). `dry_run`: the command's
    --dry-run (True: it only compiles, which a TPU slice allows off its VMs), None where it has none.

    Raises:
        CpplanError: a topology that is neither a TPU slice nor a host, or a TPU slice to train off its VMs.
    """
    from cli.devices import on_a_tpu_vm

    topo = get_topology(args.topology, getattr(args, "num_slices", None))
    host = topo.chip.kind.shares_cores
    if not host and topo.chip.kind is not ChipKind.TPU:
        raise CpplanError(
            f"--engine maxtext runs on a TPU slice or a cpu:N host; {topo.name} is neither: plan for a TPU "
            f"topology or cpu:8."
        )
    if not host and not dry_run and not on_a_tpu_vm():
        instead = (
            ", or give --dry-run to pre-flight it here with MaxText's deviceless compile" if dry_run is not None else ""
        )
        raise CpplanError(
            f"MaxText trains on the devices present; {topo.name} is a TPU slice and this host has no TPU: run it "
            f"on the slice's TPU VM{instead}."
        )
    return topo, host


def run_maxtext(args: argparse.Namespace) -> int:
    """`cpplan run --engine maxtext`: plans for MaxText, pre-flights each plan with its train_compile until one
    fits, trains it with MaxText's trainer, and reports measured step time and MFU against the price."""
    from cli.args import model_of, search_options
    from cli.devices import note_uncalibrated_host, use_host_devices
    from cli.signals import INTERRUPTS
    from planner import api
    from planner.explanation import Explanation
    from planner.maxtext import export_maxtext

    refuse_runtime_flags(args)
    _, host = engine_topology(args, dry_run=args.dry_run)
    optimizer = optimizer_flags(args)
    searched = search_args(args, host)
    search = api.run_search(model_of(searched), args.seq_len, args.topology, **search_options(searched))
    explanation = Explanation(search)
    if explanation.best is None:
        raise CpplanError(explanation.nothing_fits_text())
    python = maxtext_python(args)
    # before any work: the model as MaxText has it (export refuses one it lacks), and the user's flags
    user_flags(args.maxtext_arg or [], owned_flags(export_maxtext(search.ranked[0].plan), host), optimizer)
    run_dir = Path(args.run_dir)
    work = run_dir / MAXTEXT_DIR
    if run_dir.exists() and not run_dir.is_dir():
        raise CpplanError(f"--run-dir {str(run_dir)!r} is a file; give a directory (it is created when missing).")
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CpplanError(f"--run-dir {str(run_dir)!r}: cannot create {str(work)!r} ({err}); give another.") from None
    if host:
        use_host_devices(args.topology)  # XLA_FLAGS and JAX_PLATFORMS, which MaxText's process inherits
    note_uncalibrated_host(args.topology)
    notes = sys.stderr if args.json else sys.stdout

    def say(text: str) -> None:
        print(text, file=notes, flush=True)

    with INTERRUPTS.deferred():  # a signal is passed on to MaxText, not raised here
        chosen = preflight(
            [r.plan for r in search.ranked[: args.max_fallbacks]],
            host=host,
            steps=args.steps,
            work=work,
            python=python,
            words=args.maxtext_arg or [],
            flags=optimizer,
            say=say,
            should_stop=lambda: INTERRUPTS.stopped,
        )
        if INTERRUPTS.stopped:
            name = signal.Signals(INTERRUPTS.received[-1]).name
            print(
                f"cpplan: stopped by {name} during MaxText's pre-flight compile; nothing was trained", file=sys.stderr
            )
            return INTERRUPTS.exit_status()
        if args.dry_run:
            return _report(args, chosen, None)
        measured = train(
            chosen.prepared,
            run_dir=run_dir,
            steps=args.steps,
            python=python,
            say=say,
            interrupts=INTERRUPTS,
            label=f"plan #{chosen.attempts[-1].rank}",
            compile_s=chosen.attempts[-1].compile_s,
            memory=chosen.memory,
        )
    return _report(args, chosen, measured)


@dataclass(frozen=True)
class Prepared:
    """A plan written as a MaxText config, with what MaxText's processes for it are run with."""

    exported: object  # planner.maxtext.MaxTextExport
    config: Path
    words: list[str]  # the user's --maxtext-arg, given after the config
    env: dict  # the trainer's environment

    @property
    def plan(self):
        return self.exported.plan


def prepare(
    plan, *, host: bool, steps: int, work: Path, words: list[str], flags: dict[str, object], cache: bool = True
) -> Prepared:
    """Writes `plan` as a MaxText config, `work/config.yml`, for a run of `steps` steps whose outputs go under `work`:
    the plan's flags (and a host's), the run's defaults, then `flags`, the engine's own (the optimizer's among them,
    which the user's `words` may not set again). `cache`: jax's persistent compilation cache, where
    $JAX_COMPILATION_CACHE_DIR names one (MaxText's own, ~/jax_cache, otherwise); without it, none at all.

    Raises:
        CpplanError: MaxText cannot run the plan (the export refuses it), or the user's words are refused.
    """
    from planner.maxtext import export_maxtext

    exported = export_maxtext(plan)
    optimizer = {key: value for key, value in flags.items() if key in OPTIMIZER_KEYS}
    words = user_flags(words, owned_flags(exported, host), optimizer)
    run = {**RUN_DEFAULTS, "base_output_directory": str(work), "steps": steps}
    env = _environment(exported, host=host, deviceless=False)
    if not cache:
        run["jax_cache_dir"] = ""  # MaxText sets no cache dir for an empty one (configs/pyconfig.py)
        env.pop(JAX_CACHE_ENV, None)
    elif os.environ.get(JAX_CACHE_ENV):
        run["jax_cache_dir"] = os.environ[JAX_CACHE_ENV]
    config = work / CONFIG_FILE
    config.write_text(config_text({**exported.flags, **(HOST_FLAGS if host else {}), **run, **flags}))
    return Prepared(exported, config, words, env)


@dataclass(frozen=True)
class Chosen:
    """The plan that passed the pre-flight, as MaxText runs it."""

    prepared: Prepared
    attempts: list  # runtime.preflight.Attempt, one per plan compiled
    memory: object  # runtime.compile.CompiledMemory of the passing compile, or None

    @property
    def plan(self):
        return self.prepared.plan


def _environment(exported, *, host: bool, deviceless: bool) -> dict:
    """MaxText's environment: this process's, unbuffered, with the export's LIBTPU_INIT_ARGS after the user's
    (the user's value of a flag wins); for a deviceless compile, abstract TPU devices only."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if host:
        return env
    env["LIBTPU_INIT_ARGS"] = users_first(user_compiler_args(env), exported.libtpu_init_args)
    if deviceless:
        env.update(JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
        env.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    return env


def preflight(
    plans, *, host: bool, steps: int, work: Path, python: str, words: list[str], flags: dict, say, should_stop
):
    """Compiles `plans` (best first, each `prepare`d with the engine's `flags`) with MaxText's train_compile until
    one fits; returns it as `Chosen`, or None when `should_stop` said to stop.

    Raises:
        CpplanError: MaxText cannot run the plans (an export refused, the user's flags), or none fits.
    """
    attempts = []
    for rank, plan in enumerate(plans, start=1):
        prepared = prepare(plan, host=host, steps=steps, work=work, words=words, flags=flags)
        if host:
            command = [python, str(HOST_COMPILE), str(prepared.config), *prepared.words]
        else:
            compile_words = [f"{k}={v}" for k, v in prepared.exported.compile_flags.items()]
            command = [python, "-m", COMPILE_MODULE, str(prepared.config), *compile_words, *prepared.words]
        log = work / COMPILE_LOG.format(rank=rank)
        start = time.perf_counter()
        with open(log, "w") as output:
            output.write(" ".join(command) + "\n")
            output.flush()
            child = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=_environment(prepared.exported, host=host, deviceless=not host),
                start_new_session=True,  # a signal reaches it through this process, which ends it
            )
            try:
                stopped = _wait(child, should_stop)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
        if stopped:
            return None
        elapsed = time.perf_counter() - start
        attempt, memory = _attempt(plan, rank, child.returncode, log.read_text(errors="replace"), elapsed, log)
        attempts.append(attempt)
        say(f"  MaxText pre-flight {attempt}")
        if attempt.fits:
            return Chosen(prepared, attempts, memory)
        if should_stop():
            return None
    raise CpplanError(
        f"MaxText's compile passed none of the planner's first {len(attempts)} plans:\n"
        + "\n".join(f"  {a}" for a in attempts)
        + f"\nIts logs are in {work}. Plan a shorter sequence or a smaller batch, or allow more plans "
        f"(--max-fallbacks)."
    )


def _size(nbytes: int) -> str:
    """Bytes in GiB, or in MiB below one GiB (a host's small plans)."""
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB else f"{nbytes / MiB:.2f} MiB"


def _wait(child: subprocess.Popen, should_stop) -> bool:
    """Waits for `child` to end; True when `should_stop` said to stop first."""
    while True:
        try:
            child.wait(timeout=POLL_S)
            return False
        except subprocess.TimeoutExpired:
            if should_stop():
                return True


def _attempt(plan, rank: int, returncode: int, output: str, elapsed: float, log: Path):
    """What one train_compile came to: `(Attempt, CompiledMemory or None)`."""
    from runtime.compile import compiler_abort_line, parse_hbm_oom
    from runtime.preflight import Attempt

    have = plan.topology_spec.hbm_bytes_per_device
    if returncode == 0:
        memory = parse_memory_line(output)
        need = None if memory is None else memory.hbm_bytes_per_device
        fits = need is None or need <= have
        reason = "" if fits else f"MaxText's compiled step holds {_size(need)}, over {_size(have)}"
        return Attempt(plan, rank, fits, elapsed, need, have, reason), memory if fits else None
    oom = parse_hbm_oom(output)
    if oom is not None:
        need, have = oom
        reason = f"MaxText's compile needs {_size(need)}, the device has {_size(have)}"
        return Attempt(plan, rank, False, elapsed, need, have, reason), None
    if returncode < 0:
        name = signal.Signals(-returncode).name
        line = compiler_abort_line(output) or "no failed check in its output"
        reason = f"MaxText's compile ended by {name}: {line} (log {log})"
    else:
        last = [line for line in output.strip().splitlines() if line.strip()] or ["no output"]
        reason = f"MaxText's compile exited with status {returncode}: {last[-1].strip()[:300]} (log {log})"
    return Attempt(plan, rank, False, elapsed, None, have, reason, compiled=False), None


@dataclass(frozen=True)
class Measured:
    """What MaxText's trainer did: its steps as logged, how it ended, and cpplan's report of them."""

    report: object  # runtime.runner.RunReport
    steps: tuple[MaxTextStep, ...]
    returncode: int
    signal_name: str | None  # the signal passed on to MaxText, where one came
    failure: str | None  # why MaxText ended with an error of its own (no signal passed on), or None
    log: Path
    command: list[str]

    @property
    def maxtext_tflops_per_device(self) -> float | None:
        """MaxText's own count per device and second, the median over the steps after the first."""
        counts = [s.tflops_per_device for s in self.steps[1:] or self.steps if s.tflops_per_device is not None]
        return statistics.median(counts) if counts else None


def train(
    prepared: Prepared,
    *,
    run_dir: Path,
    steps: int,
    python: str,
    say,
    interrupts,
    label: str,
    compile_s: float | None = None,
    memory=None,
) -> Measured:
    """Runs MaxText's trainer on the `prepare`d plan (`label` names it in the line said), writing each step it
    logs to `run_dir/metrics.jsonl` as it comes, and passing a signal `interrupts` records on to it; a trainer
    that fails is reported (`Measured.failure`) with the steps it logged. `compile_s` and `memory`: its
    pre-flight's, where it had one."""
    from runtime.metrics import StepLog
    from runtime.runner import RunReport

    plan = prepared.plan
    topo = plan.topology_spec
    flops = model_flops_per_step(plan.model, plan.seq_len, plan.global_batch)
    command = [python, "-m", TRAIN_MODULE, str(prepared.config), *prepared.words]
    log_path = prepared.config.parent / TRAIN_LOG
    say(f"MaxText trains {label}: {' '.join(command)} (its log: {log_path})")
    lines: queue.Queue = queue.Queue()
    with open(log_path, "w") as log:
        log.write(" ".join(command) + "\n")
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=prepared.env,
            text=True,
            errors="replace",
            start_new_session=True,  # Ctrl-C reaches it once, passed on from here
        )
        reader = threading.Thread(target=_read, args=(child.stdout, log, lines), daemon=True)
        reader.start()
        logged: list[MaxTextStep] = []
        step_log = None
        forwarded = None
        forwarded_at = 0.0
        try:
            while True:
                try:
                    item = lines.get(timeout=POLL_S)
                except queue.Empty:
                    item = None
                if isinstance(item, MaxTextStep):
                    if step_log is None:  # a resumed MaxText starts past its checkpoint's steps
                        step_log = StepLog(
                            run_dir,
                            model_flops=flops,
                            tokens_per_step=plan.global_batch * plan.seq_len,
                            num_devices=topo.num_devices,
                            peak_flops_per_device=topo.peak_flops_per_device,
                            total_steps=steps,
                            first_step=item.index,
                            leader=True,
                        )
                        if step_log.kept_aside:
                            step_log.note(step_log.kept_aside)
                    logged.append(item)
                    step_log.step(item.index + 1, loss=item.loss, seconds=item.seconds)
                elif item is _END:
                    break
                if interrupts.stopped and forwarded is None:
                    forwarded, forwarded_at = interrupts.received[-1], time.monotonic()
                    child.send_signal(forwarded)
                if forwarded is not None and time.monotonic() - forwarded_at > STOP_GRACE_S and child.poll() is None:
                    child.kill()
        finally:
            if child.poll() is None:  # this process interrupted past the deferral (a second Ctrl-C)
                child.kill()
            child.wait()
            reader.join()
            if step_log is not None:
                step_log.close()
    signal_name = None if forwarded is None else signal.Signals(forwarded).name
    failure = None
    if child.returncode != 0 and forwarded is None:
        tail = "\n".join(f"  {line}" for line in log_path.read_text(errors="replace").splitlines()[-TAIL_LINES:])
        failure = (
            f"MaxText's trainer exited with status {child.returncode} after {len(logged)} logged step(s); the end "
            f"of its log ({log_path}):\n{tail}"
        )
    report = RunReport(
        plan,
        compile_s,
        tuple(s.seconds for s in logged),
        tuple(s.loss for s in logged),
        flops,
        memory,
        first_step=logged[0].index if logged else 0,
        stopped=forwarded is not None,
    )
    return Measured(report, tuple(logged), child.returncode, signal_name, failure, log_path, command)


_END = object()  # what the reader puts last


def _read(stream, log, lines: queue.Queue) -> None:
    """Copies MaxText's output to its log, line by line, queueing each step line parsed, then `_END`."""
    for line in stream:
        log.write(line)
        log.flush()
        step = parse_step_line(line)
        if step is not None:
            lines.put(step)
    lines.put(_END)


def attention_note(plan) -> str | None:
    """Why MaxText's measured figures of a host's plan differ from its price beyond the host row's error, or None."""
    if not plan.topology_spec.chip.kind.shares_cores:
        return None
    return (
        "on a host MaxText runs attention as dot_product (its flash kernels are TPU and GPU ones): the price is of "
        "splash, so the two differ by more than the host row's error"
    )


def _report(args: argparse.Namespace, chosen: Chosen, measured: Measured | None) -> int:
    """Prints the dry run's verdict, or measured figures beside MaxText's price; the exit status."""
    from cli.args import to_json
    from cli.running import attempt_dict
    from cli.signals import INTERRUPTS
    from planner.estimate import estimate
    from planner.explanation import backward_text, describe_strategy

    plan = chosen.plan
    price = estimate(plan, target=Target.MAXTEXT)
    line = (
        f"plan: {describe_strategy(plan)}; mesh {plan.mesh_dict}; remat {plan.remat_label}; splash blocks "
        f"{plan.block_q}×{plan.block_kv}, backward {backward_text(plan, Target.MAXTEXT)}; {plan.global_batch} × "
        f"{plan.seq_len} tokens on {plan.topology}; MaxText config {chosen.prepared.config}"
    )
    host_note = attention_note(plan)
    data = {
        "engine": "maxtext",
        "plan": plan.to_dict(),
        "maxtext_config": str(chosen.prepared.config),
        "maxtext_flags": chosen.prepared.words,
        "preflight": [attempt_dict(a) for a in chosen.attempts],
        "predicted": {
            "target": Target.MAXTEXT.value,
            "step_time_s": price.step_time_s,
            "mfu": price.mfu,
            "hbm_bytes_per_device": price.hbm_bytes_per_device,
        },
    }
    if measured is None:
        print(
            to_json(data)
            if args.json
            else f"{line}\ndry run: plan #{chosen.attempts[-1].rank} compiles with MaxText and fits; stopping "
            f"before its trainer starts"
        )
        return 0
    report = measured.report
    if report.stopped:
        print(
            f"cpplan: stopped by {measured.signal_name} after {len(report.losses)} logged step(s); passed on to "
            f"MaxText, which ended with status {measured.returncode}; metrics in "
            f"{Path(args.run_dir) / 'metrics.jsonl'}, its log in {measured.log}",
            file=sys.stderr,
        )
    if not report.losses:
        if not report.stopped:
            print(f"cpplan: error: {measured.failure or 'MaxText logged no step: nothing measured'}", file=sys.stderr)
        return INTERRUPTS.exit_status(signal.SIGTERM) if report.stopped else 1
    hbm = report.hbm_bytes_per_device
    data.update(
        maxtext_command=measured.command,
        first_step=report.first_step,
        losses=list(report.losses),
        measured={
            "step_times_s": list(report.step_times_s),
            "step_time_s": report.step_time_s,
            "best_step_s": report.best_step_s,
            "mfu": report.mfu,
            "maxtext_tflops_per_s_per_device": measured.maxtext_tflops_per_device,
            "compile_s": report.compile_s,
            "hbm_bytes_per_device": hbm,
        },
        stopped=report.stopped,
        failure=measured.failure,
        notes=[host_note] if host_note else [],
    )
    if args.json:
        print(to_json(data))
    else:
        times = " ".join(f"{s * 1e3:.0f}" for s in report.step_times_s)
        print(line)
        print(f"measured by MaxText: steps {times} ms; {report}")
        print(f"{'':10}{'MaxText price':>16}{'measured':>14}")
        print(f"{'step':10}{price.step_time_s * 1e3:>14.1f}ms{report.step_time_s * 1e3:>12.1f}ms")
        print(f"{'MFU':10}{price.mfu:>16.1%}{report.mfu:>14.1%}")
        compiled = "n/a" if hbm is None else f"{hbm / MiB:.1f} MiB"
        print(f"{'HBM/dev':10}{price.hbm_bytes_per_device / MiB:>13.1f}MiB{compiled:>14}  (MaxText's compile)")
        if measured.maxtext_tflops_per_device is not None:
            print(f"MaxText's own count: {measured.maxtext_tflops_per_device:.3f} TFLOP/s per device (median)")
        if host_note:
            print(f"note: {host_note}")
        outputs = chosen.prepared.config.parent
        print(f"metrics in {Path(args.run_dir) / 'metrics.jsonl'}, MaxText's outputs in {outputs}")
    if measured.failure:
        print(f"cpplan: error: {measured.failure}", file=sys.stderr)
        return 1
    return INTERRUPTS.exit_status(signal.SIGTERM) if report.stopped else 0
