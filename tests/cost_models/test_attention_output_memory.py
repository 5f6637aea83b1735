"""A kept attention output is held once, by either runtime and under every strategy: only the
kernel's (or ring's) residual is named `context` (cpplan's `runtime.model.DecoderLayer.attention`
leaves the layer's layout of it unnamed, as MaxText's attention op does). Behind Ulysses' and USP's
all-to-all the backward then sends the kept output back to the layer's layout again, for the out
projection's weight gradient: `cost_models.strategies.ulysses.all_to_all_cost`."""

import numpy as np
import pytest

from cost_models.models import MODELS
from cost_models.units import MiB
from planner import Plan, make_mesh
from planner.estimate import estimate

pytestmark = pytest.mark.pure
MODEL = MODELS["llama3.1-8b"]


MESHES = {
    "none": make_mesh(fsdp=8),
    "ulysses": make_mesh(context_ulysses=8),
    "ring": make_mesh(context=8),
    "usp": make_mesh(context=2, context_ulysses=4),
}
CASES = [(target, strategy) for target in ("cpplan", "maxtext") for strategy in MESHES]


def _estimate(target, strategy, **custom):
    # 8 sequences of 8K over 8 devices: 8192 tokens a device; the attention output 32 heads × 128 wide
    plan = Plan(
        model=MODEL,
        topology="v5p-16",
        seq_len=8192,
        global_batch=8,
        mesh=MESHES[strategy],
        cp_strategy=strategy,
        remat="custom",
        remat_custom=tuple(custom.items()),
    )
    return estimate(plan, target=target)


@pytest.mark.parametrize("target, strategy", CASES)
def test_a_kept_attention_output_costs_one_copy_in_every_layer(target, strategy):
    # 8192 tokens × 4096 values × 2 bytes = 64 MiB a layer, 32 layers
    kept, recomputed = (_estimate(target, strategy, context=p).hbm_bytes["activations"] for p in ("device", "remat"))
    assert kept - recomputed == pytest.approx(32 * 64 * MiB)


@pytest.mark.parametrize("target, strategy", CASES)
def test_an_offloaded_attention_output_comes_back_once(target, strategy):
    # against the output kept on device (recomputed, the whole attention would run again ahead of
    # the MLP's backward): one layer's copy back from the host, held on the MLP's side
    offloaded, kept = (
        _estimate(target, strategy, context=p).hbm_bytes["mlp_working_set"] for p in ("offload", "device")
    )
    assert offloaded - kept == pytest.approx(64 * MiB)


def _ulysses_cost():
    from small_candidates import one_candidate

    from cost_models.strategies import STRATEGIES
    from cost_models.vocabulary import CPStrategy

    x = one_candidate(CPStrategy.ULYSSES, ulysses=4)
    spec = STRATEGIES[CPStrategy.ULYSSES]
    return spec.cost(x, spec.layout(x), 0.0, 0.0)


def test_ulysses_sends_a_kept_output_back_again_in_the_backward():
    # small: 8 query heads, 4 KV heads of 32; 512 local tokens of 2048 over u = 4, bf16. An
    # all-to-all of A bytes a device costs A·u/(4W) = A/W at W = 1 GB/s: q 512·(8/4)·4·32·2 B =
    # 262,144 B, k and v each 131,072 B (4 KV heads, one per device)
    q, kv = 262144e-9, 131072e-9
    cost = _ulysses_cost()
    forward = q + 2 * kv + q  # q, k, v in; the output back
    assert np.ravel(cost.forward_s)[0] == pytest.approx(forward)
    # q, k, v in and the output back again (the out projection's weight gradient reads it in the
    # layer's layout: only the kernel's residual is kept); d_out in; dq, dk, dv back
    assert np.ravel(cost.backward_s)[0] == pytest.approx(forward + q + q + 2 * kv)
    assert np.ravel(cost.recompute_reuses_s)[0] == pytest.approx(forward)


def test_ulysses_context_traffic_is_the_same_whether_the_attention_is_kept_or_recomputed():
    from cost_models.pricing.communication import context_traffic

    cost = _ulysses_cost()
    kept, recomputed = (
        context_traffic(cost, r, 0.0, hides_behind_attention=False, shares_hops=False) for r in (0.0, 1.0)
    )
    assert np.ravel(kept.backward_s)[0] == pytest.approx(np.ravel(recomputed.backward_s)[0])
