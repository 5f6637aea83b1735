"""A model whose layers differ in mask runs each layer's attention as a switch between the masks'
(cpplan's runtime), and the backward reruns the switch whole whatever the policy keeps: on a chip that
schedules the rerun attention before the MLP's backward, its values are held through it
(cost_models.pricing.memory `attention_before_mlp_backward`, `TargetTraits.layers_switch_masks`)."""

import dataclasses

import pytest

from cost_models.models import MODELS
from cost_models.targets import TRAITS, Target
from cost_models.units import MiB
from planner import Plan, make_mesh
from planner.estimate import estimate

pytestmark = pytest.mark.pure
K = 1024


def mlp_side(monkeypatch, topology, strategy, mesh, remat="minimal_with_context", pattern="LG", *, switch=True):
    """The MLP side of a layer's backward for Llama 3.1 8B's shapes, 4 layers, 4 sequences of 128K,
    a 4096-token window on the local layers; `switch` False prices it as a target without the switch."""
    traits = dataclasses.replace(TRAITS[Target.CPPLAN], layers_switch_masks=switch)
    monkeypatch.setitem(TRAITS, Target.CPPLAN, traits)
    model = dataclasses.replace(MODELS["llama3.1-8b"], name="llama-4l", num_layers=4, window=4 * K)
    model = dataclasses.replace(model, layer_pattern=pattern)
    plan = Plan(model=model, topology=topology, seq_len=128 * K, global_batch=4, mesh=make_mesh(**mesh), remat=remat)
    plan = dataclasses.replace(plan, cp_strategy=strategy)
    return estimate(plan).hbm_bytes["mlp_working_set"]


def switch_excess(monkeypatch, *args, **kwargs):
    return mlp_side(monkeypatch, *args, **kwargs) - mlp_side(monkeypatch, *args, **kwargs, switch=False)


def test_all_gather_holds_the_rerun_q_and_output_beside_the_gathered_kv_it_already_holds(monkeypatch):
    # tpu7x runs the rerun attention first; per device 4 sequences x 16384 local queries x 32 heads x 128
    # x 2 bytes = 512 MiB of q, of the output and of its gradient; the gathered K/V are the strategy's
    # buffers, held through the MLP's backward already, and not counted again
    excess = switch_excess(monkeypatch, "tpu7x:2x2x1", "all_gather", dict(context=8))
    assert excess == pytest.approx(3 * 512 * MiB)


def test_ulysses_holds_its_laid_out_q_output_and_kv(monkeypatch):
    # after the all-to-all a device holds 4 of 32 query heads and 1 of 8 K/V heads over the whole
    # 131072 tokens of its 4 sequences: q, output and gradient 512 MiB each, K and V 128 MiB each
    excess = switch_excess(monkeypatch, "tpu7x:2x2x1", "ulysses", dict(context_ulysses=8))
    assert excess == pytest.approx((3 * 512 + 2 * 128) * MiB)


@pytest.mark.parametrize(
    "topology, remat, pattern",
    [
        ("v5p:2x2x2", "minimal_with_context", "LG"),  # v5p reruns the switch after the MLP's backward
        ("tpu7x:2x2x1", "full", "LG"),  # the MLP's input waits for the attention: priced apart
        ("tpu7x:2x2x1", "minimal_with_context", "L"),  # one mask: no switch
    ],
)
def test_nothing_moves_where_the_switch_is_not_run_first_or_not_there(monkeypatch, topology, remat, pattern):
    assert switch_excess(monkeypatch, topology, "all_gather", dict(context=8), remat, pattern) == 0
