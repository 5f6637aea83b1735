"""The sequential block's attention out projection on a context × tensor mesh, compiled deviceless
for v5p (tpu_compile tier; one small plan, ~20 s): XLA gathers `wo` over its weight axes, as the
price says, not the attention output over context (which it did while the projection was left to
the partitioner: weight gathers -81%, tensor bytes +22%, FLOPs -3.4% against the price)."""
import pytest

pytest.importorskip("jax")
pytest.importorskip("libtpu")

from cost_models.models import get_model  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime.compile import compile_step  # noqa: E402
from validation.compiled_program import count_check, plan_mesh_axes, read_compiled_program  # noqa: E402

pytestmark = pytest.mark.tpu_compile


def test_context_by_tensor_step_gathers_weights_not_the_attention_output():
    plan = Plan(model=get_model("small"), topology="v5p:2x2x1", seq_len=4096, global_batch=1,
                mesh=make_mesh(context=2, tensor=2), cp_strategy="all_gather", load_balance="none",
                remat="minimal_with_context", block_q=256, block_kv=256, loss_chunk_tokens=256)
    check = count_check(plan, read_compiled_program(compile_step(plan).hlo_text, mesh_axes=plan_mesh_axes(plan)))
    for family in ("fsdp_all_gather", "fsdp_reduce_scatter", "tensor", "context"):
        assert abs(check.bytes_error(family)) <= 0.05, (family, check)
    assert abs(check.flops_error) <= 0.03, check
