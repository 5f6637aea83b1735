"""cpu_mesh tier: two processes of four virtual CPU devices each, joined by `jax.distributed`
(gloo collectives), train every strategy to the same losses as this process's eight devices.

The test starts the two processes itself (this file, run as a script, is the worker); one launch
covers its cases in sequence. Each case cuts the mesh so that what a process feeds differs from a
single controller's: the sequence split between the processes (USP's ring over them, zigzag, the
all-to-all inside each), or the batch and the parameters split between them (all-gather's K/V
inside each).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the worker runs this file as a script
sys.path.insert(0, str(ROOT / "tests"))

from cli_process import finish  # noqa: E402

from cost_models.models import ModelSpec  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402

pytestmark = pytest.mark.cpu_mesh

PROSE = ROOT / "tests" / "testdata" / "prose.txt"  # real text: the loss falls, and depends on every row
SEQ = 1024
STEPS = 2  # the loss falls from the first step to the second (5.52 -> 5.22 on every case)
MODEL = ModelSpec("multihost-test", 2, 64, 8, 2, 16, 128, 256)  # 8 heads so Ulysses can take 4
CASES = {
    # the ring (context, devices 0 2 4 6 and 1 3 5 7) spans both processes, the all-to-all pairs do not
    "usp4x2": ("usp", dict(context=4, context_ulysses=2), True),
    "all_gather4-fsdp2": ("all_gather", dict(context=4, fsdp=2), True),  # the batch split between them
}


def make_plan(name: str) -> Plan:
    strategy, mesh, zigzag = CASES[name]
    return Plan(
        model=MODEL,
        topology="cpu:8",
        seq_len=SEQ,
        global_batch=2,
        mesh=make_mesh(**mesh),
        cp_strategy=strategy,
        load_balance="zigzag" if zigzag else "none",
        remat="full",
        block_q=128,
        block_kv=128,
        loss_chunk_tokens=0,
        param_dtype="float32",
        compute_dtype="float32",
    )


def losses_of(names: list[str]) -> dict[str, list[float]]:
    from runtime import run

    return {name: list(run(make_plan(name), steps=STEPS, data=PROSE, seed=0).losses) for name in names}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _worker(process_id: int, num_processes: int, coordinator: str, names: list[str]) -> None:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={8 // num_processes}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    from runtime.distributed import ProcessGroup, initialize

    initialize(ProcessGroup(coordinator, num_processes, process_id), platform="cpu")
    import jax

    assert jax.device_count() == 8 and jax.local_device_count() == 8 // num_processes
    print(json.dumps({"process": jax.process_index(), "losses": losses_of(names)}), flush=True)


@pytest.mark.parametrize(
    "names",
    # one launch for every case; on MaxText's stack the USP case's alone, which makes the other's
    # jax.distributed calls and collectives
    [
        pytest.param(list(CASES), marks=pytest.mark.release_repeat, id="every-case"),
        pytest.param(["usp4x2"], marks=pytest.mark.release_subset, id="usp4x2"),
    ],
)
def test_two_processes_train_as_one(names):
    coordinator = f"localhost:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(i), "2", coordinator, *names],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    single = losses_of(names)  # meanwhile, this process: 8 devices, one controller
    outputs = []
    for i, proc in enumerate(procs):
        try:
            stdout, stderr = finish(proc, f"the end of process {i}")
        except BaseException:  # given up on: leave no process behind
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, stderr[-3000:]
        outputs.append(json.loads(stdout.strip().splitlines()[-1]))
    print(json.dumps({"single": single, "two_processes": outputs[0]["losses"]}))
    for out in outputs:
        assert out["losses"].keys() == single.keys()
        for name, want in single.items():
            assert len(want) == STEPS and want[0] > 5.0 and want[-1] < want[0]  # ~ln(256) at first, then learning
            assert out["losses"][name] == pytest.approx(want, rel=1e-5), name


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:])
