"""A run resumes from what is intact: a checkpoint a kill or a bad disk left unreadable is set aside
and the one before it taken; --resume-from takes the one asked for, or says which there are."""

import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

import jax.numpy as jnp  # noqa: E402

from cost_models.errors import CpplanError  # noqa: E402
from runtime.checkpoint import Checkpoints, array_shapes, layout_difference  # noqa: E402

pytestmark = pytest.mark.cpu_mesh
IDENTITY = {"model": "tiny", "seq_len": 8, "global_batch": 1, "seed": 0}


def _state(value: float):
    return {"w": jnp.full((4,), value)}, {"m": jnp.full((4,), -value)}


def _saved(directory, steps) -> Checkpoints:
    checkpoints = Checkpoints(directory, every=1, keep=5, identity=IDENTITY)
    for step in steps:
        checkpoints.save(step, *_state(float(step)))
    checkpoints.close()
    return Checkpoints(directory, every=1, keep=5, identity=IDENTITY)


def _abstract():
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), _state(0.0))


def test_an_unreadable_newest_checkpoint_is_set_aside_and_the_one_before_it_resumed(tmp_path):
    checkpoints = _saved(tmp_path / "ckpt", [2, 4])
    for path in (tmp_path / "ckpt" / "4").rglob("*"):  # what a save cut short leaves: names, no contents
        if path.is_file():
            path.write_bytes(b"")
    notes = []
    restored = checkpoints.restore(*_abstract(), on_note=notes.append)
    assert restored.step == 2 and float(restored.params["w"][0]) == 2.0 and float(restored.opt_state["m"][0]) == -2.0
    assert len(notes) == 1 and "step 4" in notes[0] and "4.unreadable" in notes[0]
    assert (tmp_path / "ckpt" / "4.unreadable").is_dir() and checkpoints.latest_step == 2


def test_resume_from_takes_the_step_asked_for_or_names_those_there_are(tmp_path):
    checkpoints = _saved(tmp_path / "ckpt", [2, 4])
    assert checkpoints.restore(*_abstract(), step=2).step == 2
    with pytest.raises(CpplanError, match="--resume-from 3: .* holds checkpoints at steps 2, 4; give one of them"):
        checkpoints.restore(*_abstract(), step=3)


def test_a_checkpoint_of_another_state_is_refused_naming_the_array_and_left_where_it_is(tmp_path):
    """A state whose arrays differ from the run's (a model config edited under the same name) is no damaged file:
    the restore says which array differs and sets nothing aside."""
    checkpoints = _saved(tmp_path / "ckpt", [2, 4])
    wider = jax.tree.map(lambda a: jax.ShapeDtypeStruct((5,), a.dtype), _abstract())
    with pytest.raises(
        CpplanError,
        match=r"step 4 .* holds another state than this run's \(opt_state/m is \(4,\) there, \(5,\) now\)",
    ):
        checkpoints.restore(*wider)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["2", "4"]


def test_layout_difference_names_the_first_array_that_differs():
    written = {"params/w": (4,), "opt_state/m": (4,)}
    assert layout_difference(written, dict(written)) == ""
    assert layout_difference(None, {"params/w": (5,)}) == ""  # no metadata read: the restore decides
    assert layout_difference(written, {"params/w": (5,), "opt_state/m": (4,)}) == "params/w is (4,) there, (5,) now"
    assert layout_difference(written, {**written, "params/b": ()}) == "no array params/b there, () now"
    assert layout_difference(written, {"params/w": (4,)}) == "opt_state/m there is not in this run's state"


def test_a_state_and_its_saved_metadata_name_their_arrays_alike(tmp_path):
    """The paths of a live optimizer state (named tuples, tuples) and of Orbax's metadata of it once saved
    (dicts, lists) are the same strings, so a state saved whole is never refused."""
    import optax

    params = {"w": jnp.ones((4, 2)), "b": jnp.zeros(())}
    opt_state = optax.chain(optax.identity(), optax.adamw(1e-3)).init(params)
    checkpoints = Checkpoints(tmp_path / "ckpt", every=1, keep=1, identity=IDENTITY)
    checkpoints.save(1, params, opt_state)
    checkpoints.close()
    reread = Checkpoints(tmp_path / "ckpt", every=1, keep=1, identity=IDENTITY)
    shapes = array_shapes({"params": params, "opt_state": opt_state})
    assert reread._written_shapes(1) == shapes
    assert shapes["opt_state/1/0/mu/w"] == (4, 2) and shapes["params/b"] == ()
