"""The q/k/v weights a ring step gathers twice in its backward under full remat, priced and
checked against a deviceless v5p compile (tpu_compile tier; one small plan, ~30 s)."""
import pytest

pytest.importorskip("jax")
pytest.importorskip("libtpu")

from cost_models.models import get_model  # noqa: E402
from planner.plan import Plan, make_mesh  # noqa: E402
from runtime.compile import compile_step  # noqa: E402
from validation.compiled_program import count_check, plan_mesh_axes, read_compiled_program  # noqa: E402

pytestmark = pytest.mark.tpu_compile


def test_ring_full_remat_weight_gathers_match_the_compiled_step():
    plan = Plan(model=get_model("small"), topology="v5p:2x2x1", seq_len=4096, global_batch=1,
                mesh=make_mesh(context=4), cp_strategy="ring", load_balance="zigzag", remat="full",
                block_q=256, block_kv=256, loss_chunk_tokens=256)
    program = read_compiled_program(compile_step(plan).hlo_text, mesh_axes=plan_mesh_axes(plan))
    check = count_check(plan, program)
    # without the second q/k/v gather the price is 8.6% short of the compiled weight gathers
    assert abs(check.bytes_error("fsdp_all_gather")) <= 0.05, check
    assert abs(check.flops_error) <= 0.03, check
