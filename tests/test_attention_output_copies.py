"""A kept attention output as each runtime holds it: cpplan's in two layouts (the kernel's residual
and the layer's output, both named `context`) where an all-to-all lies between them (Ulysses, USP),
once elsewhere (the layer's output is a relayout it leaves unnamed); MaxText's once (only the
kernel's residual is named): `cost_models.targets.TargetTraits.attention_output_copies` and
`StrategySpec.output_relaid_from_residual`."""
import pytest

from cost_models.models import MODELS
from cost_models.targets import TRAITS, Target
from cost_models.units import MiB
from planner import Plan, make_mesh
from planner.estimate import estimate

pytestmark = pytest.mark.pure
MODEL = MODELS["llama3.1-8b"]


MESHES = {"none": make_mesh(fsdp=8), "ulysses": make_mesh(context_ulysses=8), "ring": make_mesh(context=8)}
# (target, strategy, copies): cpplan names the layer's output too only behind Ulysses' all-to-all
CASES = [("cpplan", "ulysses", 2), ("cpplan", "none", 1), ("cpplan", "ring", 1), ("maxtext", "ulysses", 1),
         ("maxtext", "none", 1)]


def _part(part, target, strategy, **custom):
    # 8 sequences of 8K over 8 devices: 8192 tokens a device; the attention output 32 heads × 128 wide
    plan = Plan(model=MODEL, topology="v5p-16", seq_len=8192, global_batch=8, mesh=MESHES[strategy],
                cp_strategy=strategy, remat="custom", remat_custom=tuple(custom.items()))
    return estimate(plan, target=target).hbm_bytes[part]


def test_the_runtimes_hold_the_copies_their_compiles_show():
    assert TRAITS[Target.CPPLAN].attention_output_copies == 2
    assert TRAITS[Target.MAXTEXT].attention_output_copies == 1


@pytest.mark.parametrize("target, strategy, copies", CASES)
def test_a_kept_attention_output_costs_its_copies_in_every_layer(target, strategy, copies):
    # 8192 tokens × 4096 values × 2 bytes = 64 MiB a copy a layer, 32 layers
    kept, recomputed = (_part("activations", target, strategy, context=p) for p in ("device", "remat"))
    assert kept - recomputed == pytest.approx(copies * 32 * 64 * MiB)


@pytest.mark.parametrize("target, strategy, copies", CASES)
def test_an_offloaded_attention_output_comes_back_in_its_copies(target, strategy, copies):
    offloaded, recomputed = (_part("mlp_working_set", target, strategy, context=p) for p in ("offload", "remat"))
    assert offloaded - recomputed == pytest.approx(copies * 64 * MiB)
