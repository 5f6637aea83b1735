"""tpu_compile tier: sequence parallelism over tensor, priced per checkpoint, checked against the
XLA TPU compiler deviceless. (benchmarks/bench_memory.py checks many more plans, offload among
them; this is the representative one.)"""

import dataclasses

import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("libtpu")

from cost_models.models import get_model  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime.compile import compile_in_child  # noqa: E402

pytestmark = pytest.mark.tpu_compile
MODEL = dataclasses.replace(get_model("llama3.1-8b"), name="llama3.1-8b-2l", num_layers=2)


def test_tensor_parallel_memory_is_priced_as_it_compiles(monkeypatch):
    """Tensor 2 with sequence parallelism (bench_memory's first row): the compiler holds what the
    price says, within 10%. Compiled in a child process with v5p's compiler flags alone, whatever chip an
    earlier test of this process set LIBTPU_INIT_ARGS or loaded libtpu for (libtpu reads its flags once,
    and the child takes this process's as the user's; v5e's asynchronous collective fusion is refused on
    v5p: "No feasible span count for single input all reduce scatter fusion")."""
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    plan = Plan(
        model=MODEL,
        topology="v5p:2x2x2",
        seq_len=8192,
        global_batch=8,
        mesh=make_mesh(fsdp=4, tensor=2),
        block_q=512,
        block_kv=512,
        loss_chunk_tokens=8192,
        remat="full",
    )
    predicted, compiled = estimate(plan), compile_in_child(plan)
    assert compiled.failure == "" and compiled.fits and predicted.fits
    assert predicted.hbm_bytes_per_device == pytest.approx(compiled.required_bytes, rel=0.10)
