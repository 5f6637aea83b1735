"""The optimizer `cpplan run` and `cpplan validate` train with (runtime/optimizer.py): MaxText 0.2.5's
AdamW, its learning rate warmed up and decayed by hand-computed values, the gradients clipped to their
global norm, bad values refused naming the flag, and 50 steps of the defaults that never blow up."""

import math

import pytest

from cost_models.errors import CpplanError
from runtime.optimizer import AdamW, Decay

PEAK, FLOOR = 1e-3, 1e-4  # final fraction 0.1


def rates(optimizer: AdamW, counts) -> list[float]:
    schedule = optimizer.schedule()
    return [float(schedule(c)) for c in counts]


@pytest.mark.cpu_mesh
def test_the_rate_rises_over_the_warmup_then_decays_to_the_floor_at_the_last_step():
    pytest.importorskip("jax")
    # 11 steps (updates 0..10), 2 of warmup: the decay runs over updates 2..10, 8 intervals
    cosine = AdamW(steps=11, learning_rate=PEAK, warmup_steps=2)
    # warmup c/2 of the peak; then floor + (peak - floor)·(1 + cos(π·(c-2)/8))/2: at c=4 a quarter of the
    # way, (1 + cos(π/4))/2 = 0.853553; at c=6 half way, 0.5
    want = [0.0, 5e-4, 1e-3, None, FLOOR + 9e-4 * 0.8535534, None, 5.5e-4, None, None, None, FLOOR]
    got = rates(cosine, range(11))
    for count, value in enumerate(want):
        if value is not None:
            assert got[count] == pytest.approx(value, rel=1e-5, abs=1e-9), count
    assert all(a >= b for a, b in zip(got[2:], got[3:]))  # falls all the way
    assert rates(cosine, [20]) == pytest.approx([FLOOR])  # past the run: the floor (a longer resumed run)
    linear = AdamW(steps=11, learning_rate=PEAK, warmup_steps=2, decay="linear")
    assert rates(linear, [2, 4, 6, 10]) == pytest.approx([1e-3, 1e-3 - 9e-4 / 4, 5.5e-4, FLOOR], rel=1e-5)
    constant = AdamW(steps=11, learning_rate=PEAK, warmup_steps=2, decay=Decay.CONSTANT)
    assert rates(constant, [1, 2, 6, 10]) == pytest.approx([5e-4, PEAK, PEAK, PEAK], rel=1e-6)


@pytest.mark.cpu_mesh
def test_the_defaults_are_maxtexts():
    pytest.importorskip("jax")
    run = AdamW(steps=50)
    assert (run.learning_rate, run.final_fraction, run.clip_norm, run.weight_decay) == (3e-5, 0.1, 1.0, 0.1)
    assert (run.b1, run.b2, run.eps, run.decay) == (0.9, 0.95, 1e-8, Decay.COSINE)
    assert run.warmup == 5  # int(0.1 × 50)
    assert rates(run, [0, 5, 49]) == pytest.approx([0.0, 3e-5, 3e-6], rel=1e-5)
    assert AdamW(steps=5).warmup == 0 and AdamW(steps=19).warmup == 1  # rounded down, as MaxText's int()
    # one update after the warmup is the last step: it is at the floor
    assert rates(AdamW(steps=3, learning_rate=PEAK, warmup_steps=2), [2]) == pytest.approx([FLOOR])
    # steps taken by hand (no run to span): the peak from the first
    assert rates(AdamW(), [0, 10**6]) == pytest.approx([3e-5, 3e-5])


@pytest.mark.cpu_mesh
def test_a_gradient_of_norm_10_reaches_adam_scaled_to_norm_1():
    pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np
    import optax

    params = {"w": jnp.zeros(4), "b": jnp.zeros(())}
    grads = {"w": jnp.full(4, 5.0), "b": jnp.zeros(())}  # global norm √(4·25) = 10

    def first_moment_norm(optimizer: AdamW) -> float:
        transformation = optimizer.transformation()
        _, state = transformation.update(grads, transformation.init(params), params)
        return float(optax.tree.norm(optax.tree.get(state, "mu")))

    # Adam's first moment after one update is (1 - b1) × the gradient it was given
    assert first_moment_norm(AdamW(steps=10)) == pytest.approx(0.1 * 1.0, rel=1e-6)
    assert first_moment_norm(AdamW(steps=10, clip_norm=0)) == pytest.approx(0.1 * 10.0, rel=1e-6)
    assert first_moment_norm(AdamW(steps=10, clip_norm=20)) == pytest.approx(0.1 * 10.0, rel=1e-6)  # under it
    # and the update itself: the first of a warmup is zero, as MaxText's (its rate starts at 0)
    transformation = AdamW(steps=10, warmup_steps=2).transformation()
    updates, _ = transformation.update(grads, transformation.init(params), params)
    assert np.all(np.asarray(updates["w"]) == 0)


@pytest.mark.cpu_mesh
def test_a_checkpoint_written_with_one_clip_norm_resumes_under_another(tmp_path):
    """The state's layout does not depend on clipping: a run's checkpoints, written with or without it, read
    back into the other's state whole (they were set aside as unreadable when the layouts differed); one of
    the layout without clipping before that is refused, saying so, and left where it is."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("orbax.checkpoint")
    import jax.numpy as jnp

    from runtime.checkpoint import Checkpoints

    params = {"w": jnp.arange(4.0), "b": jnp.ones(())}
    grads = {"w": jnp.full(4, 5.0), "b": jnp.ones(())}
    identity = {"model": "tiny", "seq_len": 8, "global_batch": 1, "seed": 0}
    for written, read in ((1.0, 0.0), (0.0, 1.0)):
        transformation = AdamW(steps=10, clip_norm=written).transformation()
        _, state = transformation.update(grads, transformation.init(params), params)
        directory = tmp_path / f"clip-{written}"
        checkpoints = Checkpoints(directory, every=1, keep=2, identity=identity)
        checkpoints.save(1, params, state)
        checkpoints.close()
        target = AdamW(steps=10, clip_norm=read).transformation().init(params)
        assert jax.tree.structure(target) == jax.tree.structure(state)
        notes = []
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (params, target))
        restored = Checkpoints(directory, every=1, keep=2, identity=identity).restore(*abstract, on_note=notes.append)
        assert notes == [] and restored.step == 1
        assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), restored.opt_state, state)))
    # a checkpoint of the earlier unclipped layout (AdamW's state alone) is refused by what differs, not set aside
    import optax

    directory = tmp_path / "adamw-alone"
    checkpoints = Checkpoints(directory, every=1, keep=2, identity=identity)
    checkpoints.save(1, params, optax.adamw(1e-3).init(params))
    checkpoints.close()
    with pytest.raises(CpplanError, match=r"holds another state than this run's \(no array opt_state/2/0/count there"):
        Checkpoints(directory, every=1, keep=2, identity=identity).restore(*abstract)
    assert [p.name for p in directory.iterdir()] == ["1"]


@pytest.mark.pure
@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(learning_rate=-1e-3), "--learning-rate -0.001: the peak learning rate must be a number above 0"),
        (dict(learning_rate=0.0), "--learning-rate 0.0:"),
        (dict(learning_rate=math.nan), "--learning-rate nan:"),
        (
            dict(warmup_steps=20),
            "--warmup-steps 20 with --steps 10: the warmup must end by the run's last step; "
            "give at most 10 warmup steps, or more --steps",
        ),
        (dict(warmup_steps=-1), "--warmup-steps -1: give a whole number"),
        (dict(final_fraction=1.5), "--final-lr-fraction 1.5: .* from 0 to 1"),
        (dict(clip_norm=-1.0), r"--clip-norm -1.0: .* 0 or more; give e.g. 1.0"),
        (dict(weight_decay=math.inf), "--weight-decay inf:"),
        (dict(b2=1.0), r"adam b2 1.0: a moment's decay rate is in \[0, 1\)"),
        (dict(decay="exponential"), "--decay 'exponential' is not a decay; give one of cosine, linear, constant"),
    ],
)
def test_a_bad_value_is_refused_naming_the_flag_the_rule_and_the_fix(settings, message):
    with pytest.raises(CpplanError, match=message):
        AdamW(steps=10, **settings)


@pytest.mark.pure
def test_a_warmup_as_long_as_the_run_is_allowed_and_described():
    whole = AdamW(steps=10, warmup_steps=10)
    assert whole.final_learning_rate == whole.learning_rate
    assert str(whole).endswith("learning rate 0 → 3e-05 over 10 warmup steps; gradients clipped to global norm 1")
    assert str(AdamW(steps=50)) == (
        "AdamW (b1 0.9, b2 0.95, eps 1e-08, weight decay 0.1): learning rate 0 → 3e-05 over 5 warmup steps, "
        "then cosine to 3e-06 at step 50; gradients clipped to global norm 1"
    )


@pytest.mark.cpu_mesh
def test_fifty_steps_of_the_defaults_on_synthetic_tokens_never_rise_past_five_percent():
    """The tiny model on cpu:8, 50 steps of AdamW's defaults (warmup 5 steps, cosine to a tenth, clipped at
    1.0) on seeded random tokens: no loss above 1.05 × the first step's. Deterministic: fixed seeds."""
    pytest.importorskip("jax")
    from planner import api
    from runtime import run

    report = run(api.plan("tiny", "1k", "cpu:8"), steps=50, seed=0)
    losses = report.losses
    print(f"first {losses[0]:.4f}, max {max(losses):.4f}, last {losses[-1]:.4f}")
    assert len(losses) == 50 and all(math.isfinite(x) for x in losses)
    assert max(losses) <= 1.05 * losses[0]
