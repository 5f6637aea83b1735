"""The examples and the `cpplan run` / `cpplan compile` commands, run end to end at small sizes."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_script(*args, timeout=300):
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.cpu_mesh
def test_run_cpu_best_plan_example():
    out = run_script("examples/run_cpu_best_plan.py", "--seq-len", "2048", "--steps", "2")
    assert "measured: compiled in" in out
    assert "predicted step" in out and "ratio" in out


@pytest.mark.tpu_compile
def test_compile_llama_v5p_example():
    pytest.importorskip("libtpu")
    out = run_script("examples/compile_llama_v5p.py", "--seq-len", "4k", "--layers", "1")
    assert "v5p:2x2x2" in out and "GiB per device" in out
    assert "predicted" in out and "compiler" in out


@pytest.mark.cpu_mesh
def test_cli_run_prints_measured_next_to_predicted():
    out = run_script("-m", "planner.cli", "run", "--model", "tiny", "--seq-len", "2048", "--topology", "cpu:8",
                     "--steps", "2", "--data", "tests/testdata/prose.txt")
    assert "predicted" in out and "measured" in out
    assert "MFU" in out and "HBM/dev" in out


@pytest.mark.tpu_compile
def test_cli_compile_tiny_on_v5p():
    pytest.importorskip("libtpu")
    out = run_script("-m", "planner.cli", "compile", "--model", "tiny", "--seq-len", "4096", "--topology",
                     "v5p:2x2x1", "--global-batch-tokens", "4096")
    assert "compiled:" in out and "predicted:" in out and "fits" in out


@pytest.mark.pure
def test_cli_run_refuses_a_tpu_topology():
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "run", "--model", "tiny", "--seq-len", "4096",
                           "--topology", "v5p:2x2x1", "--global-batch-tokens", "4096"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Use `cpplan compile`" in proc.stderr
