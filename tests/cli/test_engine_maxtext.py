"""`cpplan run --engine maxtext`: MaxText 0.2.5 pre-flights and trains the planner's choice, its step log
read into metrics.jsonl.

One case runs MaxText itself (cpu_mesh, so the stage on MaxText's stack runs it: 5 steps of `tiny` on
cpu:8, about a minute); it needs MaxText in this Python or in the venv `CPPLAN_MAXTEXT_VENV` names and
skips, saying so, without. The others give the engine a stand-in for MaxText's Python (a script that
answers as MaxText 0.2.5 does: its out-of-memory error, a compiler abort, `Memory analysis`, step
lines) to check the fallback, the records and the signal, and its refusals of bad input.
"""

import importlib.util
import json
import math
import os
import signal
import statistics
import sys
from pathlib import Path

import pytest
from cli_process import cpplan, finish, wait_until

from cli import main
from cli.engine_maxtext import (
    CONFIG_FILE,
    HOST_FLAGS,
    MAXTEXT_DIR,
    VENV_ENV,
    config_text,
    optimizer_flags,
    parse_memory_line,
    parse_step_line,
    yaml_value,
)
from cli.main import build_parser
from cost_models.flops import model_flops_per_step
from cost_models.models import get_model
from cost_models.topology import get_topology
from cost_models.units import GiB

PLAN = ["--model", "tiny", "--seq-len", "1k", "--topology", "cpu:8"]

# a step line as MaxText 0.2.5 logs it (absl's prefix, then metric_logger.py's words), copied from a run
LOGGED = (
    "I1206 14:42:29.269359 140298452749184 metric_logger.py:265] completed step: 1, seconds: 0.373, "
    "TFLOP/s/device: 0.000, Tokens/s/device: 343.456, total_weights: 1024, loss: 6.004, lm_loss: 6.004, "
    "perplexity: 404.863"
)
# train_compile's last line, as it printed it for the same plan
MEMORY = (
    "Memory analysis: CompiledMemoryStats(generated_code_size_in_bytes=0, argument_size_in_bytes=184256, "
    "output_size_in_bytes=164316, alias_size_in_bytes=163776, temp_size_in_bytes=7259088, "
    "host_generated_code_size_in_bytes=0, host_argument_size_in_bytes=0, host_output_size_in_bytes=0, "
    "host_alias_size_in_bytes=0, host_temp_size_in_bytes=0)"
)

# The stand-in for MaxText's Python. Its compiles, in turn: out of HBM (MaxText's error as XLA words it),
# an abort with a failed check (glog's line, then SIGABRT), then a step that fits. Its trainer logs STEPS
# (seconds, loss) and exits, or, with HOLD, logs them and waits for a signal, noting the one that came; with
# OOM_FIRST its first run ends out of HBM instead, as MaxText's trainer does when its step's compile does.
STEPS = [(0.5, 5.545), (0.2, 5.5), (0.25, 5.4), (0.3, 5.3), (0.4, 5.2)]
FAKE = """#!{python}
import os, resource, signal, sys, time
from pathlib import Path

here = Path(__file__).parent
args = sys.argv[1:]
if args[0] == "-c":
    print("0.2.5")
elif args[0].endswith("maxtext_host_compile.py"):
    count = here / "compiles"
    n = int(count.read_text()) + 1 if count.exists() else 1
    count.write_text(str(n))
    (here / f"compile-{{n}}.argv").write_text(" ".join(args))
    if n == 1:
        sys.exit("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of "
                 "memory in memory space hbm. Used 5.00G of 3.00G hbm. Exceeded hbm capacity by 2.00G.")
    if n == 2:
        print("F1206 11:32:34.123456  4242 llo_loop.cc:175] Check failed: entries[i] <= limit", flush=True)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
        os.abort()
    print({memory!r})
elif args[:2] == ["-m", "maxtext.trainers.pre_train.train"]:
    (here / "train.argv").write_text(" ".join(args))
    runs = here / "trains"
    n = int(runs.read_text()) + 1 if runs.exists() else 1
    runs.write_text(str(n))
    if {oom_first} and n == 1:
        print("Traceback (most recent call last):", flush=True)
        sys.exit("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of "
                 "memory in memory space hbm. Used 17.00G of 15.75G hbm. Exceeded hbm capacity by 1.25G.")
    signal.signal(signal.SIGTERM, lambda *_: ((here / "got").write_text("SIGTERM"), sys.exit(0)))
    for i, (seconds, loss) in enumerate({steps!r}):
        print(f"I1206 14:42:29.1 1 metric_logger.py:265] completed step: {{i}}, seconds: {{seconds:.3f}}, "
              f"TFLOP/s/device: 0.002, Tokens/s/device: 500.000, total_weights: 1024, loss: {{loss:.3f}}, "
              f"lm_loss: {{loss:.3f}}, perplexity: 1.0", file=sys.stderr, flush=True)
    if {hold}:
        time.sleep(600)
else:
    sys.exit(f"not MaxText's: {{args}}")
"""


def fake_maxtext(tmp_path: Path, *, hold: bool = False, oom_first: bool = False) -> str:
    path = tmp_path / "fake-maxtext" / "python"
    path.parent.mkdir()
    path.write_text(FAKE.format(python=sys.executable, memory=MEMORY, steps=STEPS, hold=hold, oom_first=oom_first))
    path.chmod(0o755)
    return str(path)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.pure
def test_step_and_memory_lines_read_as_maxtext_writes_them():
    step = parse_step_line(LOGGED)
    assert (step.index, step.seconds, step.loss, step.tflops_per_device) == (1, 0.373, 6.004, 0.0)
    rampup = parse_step_line(
        "[Rampup Batch Size Phase], completed step: 0, seconds: 1.500, total_weights: 8, loss: 9.000, lm_loss: 9.000"
    )
    assert (rampup.index, rampup.seconds, rampup.loss, rampup.tflops_per_device) == (0, 1.5, 9.0, None)
    assert parse_step_line("completed profiler activation/deactivation step: 3, total_weights: 8, loss: 1.0") is None
    assert parse_step_line("Completed eval step: 3, seconds: 0.100, running loss=2.000") is None
    memory = parse_memory_line("Cost analysis: {}\n" + MEMORY)
    # arguments + outputs − aliased + temporaries + code: 184256 + 164316 − 163776 + 7259088 + 0
    assert memory.hbm_bytes_per_device == 7_443_884
    assert parse_memory_line("Jitting and compilation complete!") is None


@pytest.mark.pure
def test_the_config_reads_as_the_command_line_would():
    assert [yaml_value(v) for v in (True, False, 8, 0.125, "all_gather", "[silu,linear]")] == [
        "true",
        "false",
        "8",
        "0.125",
        '"all_gather"',
        '["silu", "linear"]',
    ]
    assert config_text({"steps": 5, "attention": "dot_product"}) == (
        'base_config: "base.yml"\nsteps: 5\nattention: "dot_product"\n'
    )


@pytest.mark.pure
def test_maxtexts_compiler_flags_are_the_users_then_the_exports(monkeypatch):
    """MaxText's process gets the user's LIBTPU_INIT_ARGS, then the export's flags the user did not set; not
    another chip's set an earlier compile of this process wrote there."""
    from types import SimpleNamespace

    from cli.engine_maxtext import _environment
    from runtime.compile import use_compiler_flags

    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_scoped_vmem_limit_kib=61440")
    use_compiler_flags("v5e")  # v5e's asynchronous-collective set now in this process's flags
    export = SimpleNamespace(libtpu_init_args="--xla_tpu_scoped_vmem_limit_kib=98304 --xla_tpu_other=1")
    env = _environment(export, host=False, deviceless=True)
    assert env["LIBTPU_INIT_ARGS"] == "--xla_tpu_scoped_vmem_limit_kib=61440 --xla_tpu_other=1"
    assert env["JAX_PLATFORMS"] == "cpu"
    assert _environment(export, host=True, deviceless=False)["LIBTPU_INIT_ARGS"] == os.environ["LIBTPU_INIT_ARGS"]


@pytest.mark.runtime_extra  # metrics.jsonl is written by runtime.metrics.StepLog (tensorboardX)
def test_a_plan_that_does_not_compile_is_left_for_the_next_and_steps_become_records(tmp_path, capsys):
    python = fake_maxtext(tmp_path)
    run_dir = tmp_path / "run"
    argv = ["run", "--engine", "maxtext", *PLAN, "--steps", "5", "--run-dir", str(run_dir), "--max-fallbacks", "3"]
    optimizer = ["--learning-rate", "1e-4", "--decay", "linear"]
    code = main([*argv, *optimizer, "--maxtext-python", python, "--maxtext-arg", "checkpoint_period=2", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    answer = json.loads(out.out)
    first, second, third = answer["preflight"]
    assert (first["fits"], first["compiled"], first["required_bytes"]) == (False, True, 5 * GiB)
    assert first["available_bytes"] == 3 * GiB
    assert not second["fits"] and not second["compiled"]
    assert "SIGABRT" in second["reason"] and "llo_loop.cc:175 Check failed: entries[i] <= limit" in second["reason"]
    assert third["fits"] and third["required_bytes"] == 7_443_884
    assert answer["plan"] == third["plan"] and answer["maxtext_flags"] == ["checkpoint_period=2"]
    # the user's flag reached every MaxText process, after the config
    fake_dir = Path(python).parent
    config = run_dir / MAXTEXT_DIR / CONFIG_FILE
    for name in ("compile-1.argv", "compile-3.argv", "train.argv"):
        assert (fake_dir / name).read_text().endswith(f"{config} checkpoint_period=2"), name
    text = config.read_text()
    assert all(f"{key}: {yaml_value(value)}\n" in text for key, value in HOST_FLAGS.items())
    assert "steps: 5\n" in text and 'dataset_type: "synthetic"\n' in text
    # the optimizer flags as MaxText's: no warmup (int(5 × 0.1) = 0 steps), then all 5 steps decay linearly
    for line in ("learning_rate: 0.0001", 'lr_schedule_type: "wsd"', 'wsd_decay_style: "linear"'):
        assert f"{line}\n" in text, line
    assert "warmup_steps_fraction: 0.0\n" in text and "wsd_decay_steps_fraction: 1.0\n" in text
    # one record per step MaxText logged, counted from 1: 1024 tokens over 8 devices; MFU as cpplan's own runs
    flops = model_flops_per_step(get_model("tiny"), 1024, 1)
    peak = get_topology("cpu:8").peak_flops_per_device
    got = records(run_dir)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5]
    for record, (seconds, loss) in zip(got, STEPS):
        assert (record["step_time_s"], record["loss"]) == (seconds, loss)
        assert record["tokens_per_s_per_device"] == pytest.approx(128 / seconds)
        assert record["mfu"] == pytest.approx(flops / (seconds * 8 * peak))
    measured = answer["measured"]
    assert measured["step_time_s"] == statistics.median([0.2, 0.25, 0.3, 0.4])  # the steps after the first
    assert measured["mfu"] == pytest.approx(flops / (0.275 * 8 * peak))
    assert measured["maxtext_tflops_per_s_per_device"] == 0.002
    assert answer["losses"] == [loss for _, loss in STEPS] and answer["predicted"]["target"] == "maxtext"


@pytest.mark.runtime_extra
def test_sigterm_is_passed_on_to_maxtext_and_what_it_logged_is_kept(tmp_path):
    python = fake_maxtext(tmp_path, hold=True)
    run_dir = tmp_path / "run"
    proc = cpplan(
        "run", "--engine", "maxtext", *PLAN, "--steps", "100", "--run-dir", str(run_dir), "--max-fallbacks", "3",
        "--maxtext-python", python, cwd=tmp_path,
    )  # fmt: skip
    metrics = run_dir / "metrics.jsonl"
    wait_until(lambda: metrics.exists() and len(metrics.read_text().splitlines()) == len(STEPS), proc, "5 records")
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc, "cpplan's exit after SIGTERM")
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert (Path(python).parent / "got").read_text() == "SIGTERM"  # MaxText was told, and cpplan waited for it
    assert "stopped by SIGTERM after 5 logged step(s)" in err and "ended with status 0" in err
    assert [r["step"] for r in records(run_dir)] == [1, 2, 3, 4, 5]
    assert "MFU" in out


def refused(argv, capsys) -> str:
    """Runs the CLI; asserts exit 2 with one line on stderr and no traceback; returns the line."""
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpplan: error: "), captured.err
    return lines[0]


RUN = ["run", "--engine", "maxtext", *PLAN]


@pytest.mark.pure
def test_bad_input_is_refused_with_the_value_the_rule_and_the_fix(tmp_path, capsys):
    python = fake_maxtext(tmp_path)
    bare = tmp_path / "bare-python"  # a Python without MaxText, as the probe sees one
    bare.write_text(f"#!{sys.executable}\nimport sys\nsys.exit(\"ModuleNotFoundError: No module named 'maxtext'\")\n")
    bare.chmod(0o755)
    line = refused([*RUN, "--maxtext-python", str(bare)], capsys)
    assert f"--maxtext-python {str(bare)!r} has no MaxText (ModuleNotFoundError" in line
    assert "maxtext[tpu]==0.2.5" in line
    line = refused([*RUN, "--maxtext-python", str(tmp_path / "none")], capsys)
    assert "does not run" in line and "--maxtext-python" in line
    line = refused([*RUN, "--maxtext-python", python, "--maxtext-arg", "ici_context_parallelism=4"], capsys)
    assert "ici_context_parallelism is the plan's (ici_context_parallelism=8)" in line and "--mesh" in line
    line = refused([*RUN, "--maxtext-python", python, "--maxtext-arg", "steps=9"], capsys)
    assert "give --steps instead" in line
    line = refused([*RUN, "--maxtext-python", python, "--maxtext-arg", "no value"], capsys)
    assert "'no value'" in line and "KEY=VALUE" in line
    line = refused([*RUN, "--checkpoint-every", "50"], capsys)
    assert "--checkpoint-every" in line and "checkpoint_period=N" in line
    line = refused([*RUN, "--strategies", "ring"], capsys)
    assert "--strategies ring" in line and "all_gather only" in line
    moe = ["--model", "tiny-moe", *PLAN[2:], "--run-dir", str(tmp_path / "run"), "--maxtext-python", python]
    line = refused(["run", "--engine", "maxtext", *moe], capsys)
    assert "'tiny-moe' has experts" in line and "model_name" in line
    line = refused(
        [*RUN, "--maxtext-python", python, "--learning-rate", "1e-4", "--maxtext-arg", "learning_rate=1"], capsys
    )
    assert "learning_rate is set by --learning-rate here (learning_rate=0.0001)" in line
    line = refused(
        [*RUN, "--maxtext-python", python, "--decay", "linear", "--steps", "10", "--warmup-steps", "9"], capsys
    )
    assert "--decay linear with --steps 10 and 9 warmup steps" in line and "--decay cosine" in line
    line = refused([*RUN, "--decay", "constant", "--final-lr-fraction", "0.5"], capsys)
    assert "--final-lr-fraction 0.5 with --decay constant" in line


def mapped(*flags: str) -> dict:
    """MaxText's optimizer flags for `cpplan run --engine maxtext` with `flags`."""
    return optimizer_flags(build_parser().parse_args([*RUN, *flags]))


@pytest.mark.pure
def test_optimizer_flags_become_maxtexts_by_name():
    assert mapped() == {}  # MaxText keeps its own defaults, which are cpplan's
    given = ["--learning-rate", "1e-4", "--decay", "cosine", "--final-lr-fraction", "0.2"]
    assert mapped(*given, "--weight-decay", "0.01", "--clip-norm", "0") == {
        "learning_rate": 1e-4,
        "lr_schedule_type": "cosine",
        "learning_rate_final_fraction": 0.2,
        "adam_weight_decay": 0.01,
        "gradient_clipping_threshold": 0.0,
    }
    # 5 of 20 steps warm up, the other 15 decay linearly: MaxText's wsd whose decay is every step after the warmup
    assert mapped("--steps", "20", "--warmup-steps", "5", "--decay", "linear") == {
        "warmup_steps_fraction": 0.25,
        "lr_schedule_type": "wsd",
        "wsd_decay_style": "linear",
        "wsd_decay_steps_fraction": 0.75,
    }
    # the default warmup of 15 steps, int(15 × 0.1) = 1, written out: 0.1 + 14/15 is over the 1 MaxText allows
    assert mapped("--steps", "15", "--decay", "linear") == {
        "warmup_steps_fraction": 1 / 15,
        "lr_schedule_type": "wsd",
        "wsd_decay_style": "linear",
        "wsd_decay_steps_fraction": 14 / 15,
    }
    # a constant rate: wsd with no decay steps
    assert mapped("--steps", "10", "--decay", "constant") == {
        "lr_schedule_type": "wsd",
        "wsd_decay_steps_fraction": 0.0,
    }
    # 1/49 × 49 is 0.9999999999999999, which MaxText's int() makes 0 warmup steps: the next float up makes 1
    fraction = mapped("--steps", "49", "--warmup-steps", "1")["warmup_steps_fraction"]
    assert fraction == math.nextafter(1 / 49, 1) and int(49 * fraction) == 1


def _has_maxtext() -> bool:
    return importlib.util.find_spec("maxtext") is not None


@pytest.mark.cpu_mesh
@pytest.mark.skipif(
    not (_has_maxtext() or os.environ.get(VENV_ENV)),
    reason=f"MaxText 0.2.5 is installed neither in this Python nor in a venv named by {VENV_ENV} "
    "(pip install 'maxtext[tpu]==0.2.5' on Python 3.12)",
)
def test_maxtext_trains_tiny_on_cpu_8_for_5_steps(tmp_path, capsys, monkeypatch):
    """MaxText 0.2.5 itself: its host compile passes the plan, its trainer runs 5 steps, each a record."""
    # MaxText keeps its compiles in ~/jax_cache unless told; the engine hands it jax's cache variable
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", os.environ.get("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax")))
    run_dir = tmp_path / "run"
    code = main([*RUN, "--steps", "5", "--run-dir", str(run_dir), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    answer = json.loads(out.out)
    assert answer["preflight"][-1]["fits"] and answer["preflight"][-1]["required_bytes"] > 0
    got = records(run_dir)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5]
    log = (run_dir / MAXTEXT_DIR / "train.log").read_text().splitlines()
    logged = [step for step in map(parse_step_line, log) if step is not None]
    assert [(r["step_time_s"], r["loss"]) for r in got] == [(s.seconds, s.loss) for s in logged]
    assert 5.0 < got[0]["loss"] < 6.5  # about ln 256 = 5.55 at the start, over tiny's 256 tokens
    flops = model_flops_per_step(get_model("tiny"), 1024, 1)
    peak = get_topology("cpu:8").peak_flops_per_device
    median = statistics.median(r["step_time_s"] for r in got[1:])
    assert answer["measured"]["mfu"] == pytest.approx(flops / (median * 8 * peak)) and answer["measured"]["mfu"] > 0
    assert answer["predicted"]["target"] == "maxtext" and 0 < answer["predicted"]["mfu"] <= 1


# MaxText 0.2.5's base.yml values of the schedule's flags that optimizer_flags may leave unset
BASE_SCHEDULE = dict(
    learning_rate=3e-5,
    lr_schedule_type="cosine",
    learning_rate_final_fraction=0.1,
    warmup_steps_fraction=0.1,
    wsd_decay_steps_fraction=0.1,
    wsd_decay_style="linear",
)


@pytest.mark.runtime_extra
@pytest.mark.skipif(not _has_maxtext(), reason="MaxText 0.2.5 is not installed in this Python (stage 3 has it)")
@pytest.mark.parametrize(
    "flags",
    [
        ["--steps", "10"],
        ["--steps", "20", "--warmup-steps", "5", "--decay", "linear", "--final-lr-fraction", "0.2"],
        ["--steps", "15", "--decay", "linear", "--learning-rate", "1e-3"],
        ["--steps", "10", "--decay", "constant", "--warmup-steps", "3"],
        ["--steps", "7", "--decay", "cosine", "--warmup-steps", "0", "--final-lr-fraction", "0"],
    ],
)
def test_maxtexts_schedule_of_the_mapped_flags_is_cpplans(flags):
    """The rate of every step by MaxText's own schedule (maxtext_utils.create_learning_rate_schedule) of the
    mapped flags, against cpplan's runtime.optimizer.AdamW of the same flags."""
    from types import SimpleNamespace

    from maxtext.configs import types
    from maxtext.utils.maxtext_utils import create_learning_rate_schedule

    from cli.args import optimizer_of

    args = build_parser().parse_args([*RUN, *flags])
    given = {**BASE_SCHEDULE, **optimizer_flags(args)}
    config = SimpleNamespace(
        **given,
        steps=args.steps,
        learning_rate_schedule_steps=args.steps,  # base.yml's -1: the run's steps
    )
    config.lr_schedule_type = types.LearningRateScheduleType(config.lr_schedule_type)
    config.wsd_decay_style = types.WsdDecayStyle(config.wsd_decay_style)
    theirs = create_learning_rate_schedule(config)
    ours = optimizer_of(args).schedule()
    for step in range(args.steps):
        assert float(theirs(step)) == pytest.approx(float(ours(step)), rel=1e-6, abs=1e-12), step
