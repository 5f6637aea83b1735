"""tpu_compile tier: the two memory features the price models per checkpoint, checked against the
XLA TPU compiler deviceless: sequence parallelism over tensor, and remat offload to host memory.
(benchmarks/bench_memory.py checks many more plans; these two are the representative ones.)"""
import dataclasses

import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("libtpu")

from cost_models.models import get_model  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime.compile import compile_for  # noqa: E402

pytestmark = pytest.mark.tpu_compile
MODEL = dataclasses.replace(get_model("llama3.1-8b"), name="llama3.1-8b-2l", num_layers=2)


def plan(**fields):
    return Plan(model=MODEL, topology="v5p:2x2x2", seq_len=4096, global_batch=4, mesh=make_mesh(fsdp=4, tensor=2),
                block_q=512, block_kv=512, loss_chunk_tokens=4096, **fields)


@pytest.mark.parametrize("remat", ["full", "minimal_offloaded"])
def test_tensor_parallel_memory_is_priced_as_it_compiles(remat):
    """Tensor 2 with sequence parallelism; with every matmul output offloaded to host memory, the
    compiler holds on device what the price says (host buffers are not HBM)."""
    p = plan(remat=remat)
    predicted, compiled = estimate(p), compile_for(p)
    assert compiled.fits and predicted.fits
    assert predicted.hbm_bytes_per_device == pytest.approx(compiled.required_bytes, rel=0.10)
