"""The price's collective bytes per family (`cost_models.counts`), worked out by hand for small
plans from what the compiled steps move (benchmarks/results/compiler_counts.txt)."""
import pytest

from cost_models.counts import priced_link_bytes
from cost_models.models import get_model
from planner.estimate import candidates_of
from planner.plan import Plan, make_mesh

pytestmark = pytest.mark.pure

BF16, FP32 = 2, 4


def _plan(strategy: str, mesh: dict, remat: str, batch: int = 1) -> Plan:
    return Plan(model=get_model("small"), topology="v5p:2x2x1", seq_len=4096, global_batch=batch,
                mesh=make_mesh(**mesh), cp_strategy=strategy, load_balance="none", remat=remat,
                block_q=256, block_kv=256, loss_chunk_tokens=256)


def test_head_gathers_in_the_compute_dtype_and_scatters_its_gradient_in_fp32():
    """FSDP over 4: each layer's weights gathered twice (forward, backward) in bf16 and their
    gradients scattered once in bf16; the head gathered twice in bf16 and its fp32 gradient
    scattered once. A split of the head's time by count (2/3 : 1/3) charges the gathers 33% too much."""
    m = get_model("small")
    bytes_ = priced_link_bytes(candidates_of(_plan("none", {"fsdp": 4}, "full", batch=4)))
    share = 3 / 4  # an all-gather or reduce-scatter over 4 devices moves (n-1)/n of the array
    layer, head = m.params_per_layer, m.vocab * m.hidden
    assert bytes_["fsdp_all_gather"][0] == pytest.approx(share * (m.num_layers * 2 * layer + 2 * head) * BF16)
    assert bytes_["fsdp_reduce_scatter"][0] == pytest.approx(share * (m.num_layers * layer * BF16 + head * FP32))


@pytest.mark.parametrize("strategy, remat, regathered", [
    ("ring", "full", True), ("usp", "full", True),  # attention as loops of hops, q/k/v recomputed
    ("ring", "minimal_with_context", False),  # q/k/v kept: their weights are gathered once in the backward
    ("all_gather", "full", False), ("ulysses", "full", False),  # attention is one kernel call
])
def test_ring_and_usp_backward_gathers_recomputed_qkv_weights_twice(strategy, remat, regathered):
    """Compiled ring and USP steps under full remat gather wq, wk and wv twice in the backward
    (before the recomputed forward hops and after the backward hops): 75.5 MB more than two
    gathers a layer for two Llama-3.1-8B layers on v5p:2x2x1, matched by the price to 0.00%."""
    m = get_model("small")
    mesh = {"context": 2, "context_ulysses": 2} if strategy == "usp" else {
        "context_ulysses": 4} if strategy == "ulysses" else {"context": 4}
    bytes_ = priced_link_bytes(candidates_of(_plan(strategy, mesh, remat)))
    qkv = m.hidden * (m.num_heads + 2 * m.num_kv_heads) * m.head_dim
    layers = 2 * m.params_per_layer + (qkv if regathered else 0)
    head = 2 * m.vocab * m.hidden
    assert bytes_["fsdp_all_gather"][0] == pytest.approx(3 / 4 * (m.num_layers * layers + head) * BF16)


def test_a_host_gathers_ring_weights_once_whatever_the_policy():
    """XLA's CPU compiler does not gather the q/k/v weights twice: a cpu:8 ring step has as many
    weight gathers under full remat as under minimal_with_context."""
    def gathers(remat):
        plan = Plan(model=get_model("small"), topology="cpu:8", seq_len=4096, global_batch=2,
                    mesh=make_mesh(context=4, fsdp=2), cp_strategy="ring", load_balance="zigzag", remat=remat,
                    block_q=512, block_kv=512, compute_dtype="float32", param_dtype="float32")
        return priced_link_bytes(candidates_of(plan))["fsdp_all_gather"][0]

    assert gathers("full") == pytest.approx(gathers("minimal_with_context"))


def test_data_parallel_gradients_are_all_reduced_in_the_compute_dtype():
    """A v5p:2x2x1 step with data=2 × fsdp=2 all-reduces 2,490,368 B of gradients over `data` per
    device (compiled): the model's parameters over the weight group, in bf16 (fp32 would be twice)."""
    m = get_model("small")
    bytes_ = priced_link_bytes(candidates_of(_plan("none", {"data": 2, "fsdp": 2}, "full", batch=4)))
    assert bytes_["data_all_reduce"][0] == pytest.approx(2 * (2 - 1) / 2 * m.num_params / 2 * BF16)
    assert bytes_["data_all_reduce"][0] == pytest.approx(2490368, rel=0.01)
