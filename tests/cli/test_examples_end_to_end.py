"""The examples and the `cpplan run` / `cpplan compile` commands, run end to end at small sizes, as a
new user runs them: the planner's examples (pure tier), and the runtime's examples and commands."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_process import run

ROOT = Path(__file__).resolve().parents[2]
# the scripts import this checkout's packages, not whichever copy is installed
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def run_script(*args):
    proc = run([sys.executable, *args], f"the end of {args[0]}", cwd=ROOT, env=ENV)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.pure
@pytest.mark.parametrize(
    "script, words",
    [
        ("explain_long_context.py", ["v5p-256", "tpu7x-128", "8M", "MFU"]),
        ("strategy_crossover.py", ["seq_len", "ring", "nothing fits"]),
        ("maxtext_config.py", ["your config", "cpplan's plan", "ici_context_parallelism="]),
    ],
)
def test_example_runs(script, words):
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script)], capture_output=True, text=True, check=True, cwd=ROOT, env=ENV
    ).stdout
    for w in words:
        assert w in out


@pytest.mark.cpu_mesh
def test_run_cpu_best_plan_example():
    out = run_script("examples/run_cpu_best_plan.py", "--seq-len", "2048", "--steps", "2")
    assert "measured: compiled in" in out
    assert "predicted step" in out and "ratio" in out


@pytest.mark.tpu_compile
def test_compile_llama_v5p_example():
    pytest.importorskip("libtpu")
    out = run_script("examples/compile_llama_v5p.py", "--model", "small", "--seq-len", "4k", "--layers", "1")
    assert "v5p:2x2x2" in out and "GiB per device" in out
    assert "predicted" in out and "compiler" in out


@pytest.mark.cpu_mesh
def test_cli_run_prints_measured_next_to_predicted(tmp_path):
    out = run_script(
        "-m",
        "cli",
        "run",
        "--model",
        "tiny",
        "--seq-len",
        "2048",
        "--topology",
        "cpu:8",
        "--steps",
        "2",
        "--data",
        "tests/testdata/prose.txt",
        "--run-dir",
        str(tmp_path / "run"),
    )
    assert "predicted" in out and "measured" in out
    assert "MFU" in out and "HBM/dev" in out


@pytest.mark.tpu_compile
def test_cli_compile_tiny_on_v5p():
    pytest.importorskip("libtpu")
    out = run_script(
        "-m",
        "cli",
        "compile",
        "--model",
        "tiny",
        "--seq-len",
        "4096",
        "--topology",
        "v5p:2x2x1",
        "--global-batch-tokens",
        "4096",
    )
    assert "compiled:" in out and "predicted:" in out and "fits" in out
    assert "not priced: head_dim 16 is not a multiple of the TPU's 128 lanes" in out


@pytest.mark.tpu_compile
def test_cli_compile_json_is_strict_json_with_the_compiler_and_the_price():
    pytest.importorskip("libtpu")
    out = run_script(
        *("-m", "cli", "compile", "--model", "tiny", "--seq-len", "4096", "--topology", "v5p:2x2x1"),
        *("--global-batch-tokens", "4096", "--json"),
    )
    d = json.loads(out)
    c = d["compiled"]
    assert c["fits"] and c["required_bytes"] == (
        c["argument_bytes"] + c["output_bytes"] - c["alias_bytes"] + c["temp_bytes"] + c["code_bytes"]
    )
    assert d["plan"]["seq_len"] == 4096 and d["predicted"]["fits"]
    assert d["predicted"]["notes"][0].startswith("head_dim 16 is not a multiple")


@pytest.mark.pure
def test_cli_run_refuses_a_tpu_topology():
    proc = run(
        [
            sys.executable,
            "-m",
            "cli",
            "run",
            "--model",
            "tiny",
            "--seq-len",
            "4096",
            "--topology",
            "v5p:2x2x1",
            "--global-batch-tokens",
            "4096",
        ],
        "the refusal",
        cwd=ROOT,
        env=ENV,
    )
    assert proc.returncode == 2
    assert "Use `cpplan compile`" in proc.stderr


@pytest.mark.cpu_mesh
def test_cli_validate_sets_up_the_virtual_devices_itself(tmp_path):
    """No XLA_FLAGS from the caller: `cpplan validate --topology cpu:8` must still find 8 devices."""
    env = {k: v for k, v in ENV.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    proc = run(
        [
            sys.executable,
            "-m",
            "cli",
            "validate",
            "--model",
            "tiny",
            "--seq-lens",
            "1k",
            "--topology",
            "cpu:8",
            "--strategies",
            "ring",
            "--max-plans",
            "1",
            "--top",
            "1",
            "--steps",
            "2",
            "--no-plots",
            "--out",
            str(tmp_path),
        ],
        "the end of validate",
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = (tmp_path / "report.md").read_text()
    assert "plans measured: 1 (ring); failed: 0" in report


@pytest.mark.cpu_mesh
def test_host_commands_ask_for_the_topologys_virtual_devices():
    """`cpplan validate/calibrate --topology cpu:4` without XLA_FLAGS get 4 devices, not 1."""
    code = (
        "from cli.devices import use_host_devices; use_host_devices('cpu:4'); import jax; "
        "import sys; sys.exit(0 if jax.device_count() == 4 else f'{jax.device_count()} devices')"
    )
    env = {k: v for k, v in ENV.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env)
