"""tpu_compile tier: a plan's programs ask for the scoped VMEM its splash blocks need in each compile
(`runtime.compile.plan_compiler_options`), so that one process compiles plans of every block size
with no raised limit in its flags (a raised limit makes every compile about three times slower)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("libtpu")

from runtime.compile import COMPILER_ARGS_VARIABLES  # noqa: E402

pytestmark = pytest.mark.tpu_compile

ROOT = Path(__file__).resolve().parents[2]

# A one-layer model with heads of 128 and splash blocks of 2048 on v5e, whose step needs more scoped
# VMEM than the compiler's default: compiled deviceless in a process whose libtpu flags never hold the
# limit (cpplan's own flag-setting turned off before libtpu loads).
CHILD = """
import dataclasses
from runtime import compile as compiling
compiling.use_compiler_flags = lambda *args, **kwargs: None
from cost_models.models import get_model
from planner.plan import Plan, make_mesh
from runtime.mesh import build_mesh
from runtime.runner import compile_plan
from runtime.train import Trainer

model = dataclasses.replace(get_model("benchmarks/tpu_v5e/attention-4l-small-mlp.json"), num_layers=1, hidden=256,
                            num_heads=2, num_kv_heads=2, intermediate=256, vocab=256)
plan = Plan(model=model, topology="v5e:1x1", mesh=make_mesh(), seq_len=2048, global_batch=1, cp_strategy="none",
            block_q=2048, block_kv=2048, loss_chunk_tokens=2048, compute_dtype="bfloat16")
print("options", compiling.plan_compiler_options(plan))
devices = compiling.tpu_devices(plan)
trainer = Trainer(plan, build_mesh(plan, devices))
try:
    trainer.train_step.lower(*trainer.abstract_state()).compile()
    print("without the options: compiled")
except Exception as err:
    print("without the options:", str(err).splitlines()[0][:120])
compiled = compile_plan(plan, steps=1, devices=devices)
print("compile_plan:", compiled.compiles.compiled, "programs")
"""


def test_a_plan_needing_the_raised_limit_compiles_in_a_process_without_it():
    env = {k: v for k, v in os.environ.items() if k not in COMPILER_ARGS_VARIABLES}
    env |= {"JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_WORKER_HOSTNAMES": "localhost"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("options", "without", "compile_plan"))]
    assert done.returncode == 0, done.stderr[-3000:]
    assert lines[0] == "options {'xla_tpu_scoped_vmem_limit_kib': '98304'}"
    # the premise: at the compiler's default the step does not compile
    assert lines[1].startswith("without the options: RESOURCE_EXHAUSTED") and "ScopedVmemOom" in lines[1]
    # the step and the two initialisers (the parameters' runs the model's forward, its splash kernel too)
    assert lines[2] == "compile_plan: 3 programs"
