"""What a checkpoint costs: the default interval keeps a save under 2% of the step time (hand-computed
from the checkpoint's bytes, the processes and the write bandwidth), a timed first save refines it, a run
ends saying what its saves cost, and a stop asked for after the last step leaves a finished run."""

from types import SimpleNamespace

import pytest

from cost_models.units import MiB
from runtime.checkpoint import DISK_WRITE_BYTES_PER_S, SAVE_BUDGET, SaveCost, SaveInterval, checkpoint_bytes


@pytest.mark.pure
def test_a_checkpoint_holds_the_weights_and_both_moments():
    plan = SimpleNamespace(model=SimpleNamespace(num_params=1000), param_dtype="float32", mu_dtype="bfloat16")
    assert checkpoint_bytes(plan) == 1000 * (4 + 4 + 2)  # weights and nu as the weights, mu in mu_dtype


@pytest.mark.pure
def test_the_default_interval_keeps_a_save_under_two_percent_of_the_steps_between_saves():
    # the boot disk's figure: 100 GiB × 0.28 MiB/s per GiB
    assert DISK_WRITE_BYTES_PER_S == 28 * MiB == 29_360_128 and SAVE_BUDGET == 0.02
    # 1e9 fp32 parameters, fp32 moments: 12e9 bytes over 4 processes, 3e9 each; at 28 MiB/s a save takes
    # 3e9 / 29,360,128 = 102.18 s; steps of 5 s: 2% of N steps covers it from N = 102.18 / 0.1 = 1021.8 → 1022
    interval = SaveInterval(12_000_000_000, 4, DISK_WRITE_BYTES_PER_S, 5.0, "the disk")
    assert interval.save_s == pytest.approx(102.1798, rel=1e-5)
    assert interval.every == 1022
    assert 1022 * 5.0 * SAVE_BUDGET >= interval.save_s > 1021 * 5.0 * SAVE_BUDGET
    # one process writes it all: 4× the seconds, 4× the interval (408.72 s / 0.1 s = 4087.2 → 4088)
    assert SaveInterval(12_000_000_000, 1, DISK_WRITE_BYTES_PER_S, 5.0, "the disk").every == 4088
    # a save far shorter than a step: every step
    assert SaveInterval(1_000, 1, DISK_WRITE_BYTES_PER_S, 5.0, "the disk").every == 1
    # a timed first save of 10 s with steps of 2 s: 10 / (0.02 × 2) = 250 steps, at 3e9 / 10 = 3e8 B/s
    measured = interval.measured(save_s=10.0, step_s=2.0)
    assert measured.every == 250 and measured.write_bytes_per_s == pytest.approx(3e8)
    assert str(measured) == (
        "checkpoints every 250 steps: a save of 11.18 GiB (2.79 GiB per process) took 10 s (286.1 MiB/s), "
        "under 2% of 250 steps of 2 s"
    )


@pytest.mark.pure
def test_a_runs_saves_are_priced_by_the_loop_they_held_and_the_steps_they_slowed():
    # 8 steps; saves after steps 2 and 5 held the loop 0.05 s each and were written during steps 4 and 7
    cost = SaveCost(
        step_times_s=(0.5, 0.1, 0.1, 0.3, 0.1, 0.1, 0.25, 0.1),
        writing=(False, False, False, True, False, False, True, False),
        held_s=(0.05, 0.05),
        final_s=0.2,
        every=3,
        checkpoint_bytes=3 * MiB,
    )
    assert cost.clean_step_s == pytest.approx(0.1)  # the first step (warm-up) left out
    # held 0.1 s, slowed steps 0.2 + 0.15 s over a clean step: 0.45 s of 8 × 0.1 s
    assert cost.extra_s == pytest.approx(0.45) and cost.fraction == pytest.approx(0.5625)
    assert str(cost) == (
        "checkpoint cost: a save of 3.0 MiB held the loop 0.05 s (median of 2, at most 0.05 s; 0.5 steps of "
        "100.0 ms); the 2 step(s) run while a save was written took 275.0 ms (2.8×); the 2 save(s) within the run "
        "added 56.2% to its steps' time"
    )
    only_final = SaveCost((0.5, 0.1, 0.1), (False,) * 3, (), 0.2, 0, 3 * MiB)
    assert str(only_final).endswith("held the loop 0.2 s (median of 1; 2 steps of 100.0 ms); no save within the run")


@pytest.mark.cpu_mesh
def test_a_default_interval_is_refined_by_its_timed_first_save_and_a_stop_after_the_last_step_is_no_stop(tmp_path):
    """A predicted step so long that every step is due: the first save is waited for and timed, and the
    interval follows it; the run ends with the saves' cost. The stop flag comes up when the last step is
    done (as a SIGTERM landing in it would): the run finished, so it is not reported stopped."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("orbax.checkpoint")
    from planner import api
    from runtime.data import open_dataset
    from runtime.loop import Checkpointing, train
    from runtime.mesh import build_mesh
    from runtime.optimizer import AdamW
    from runtime.train import Trainer

    steps = 3
    plan = api.plan("tiny", "1k", "cpu:8")
    trainer = Trainer(plan, build_mesh(plan, jax.devices()), optimizer=AdamW(steps=steps))
    compiled = trainer.train_step.lower(*trainer.abstract_state()).compile()
    polls, notes = [], []

    def stop_after_the_last_step() -> bool:
        polls.append(len(polls) + 1)
        return polls[-1] == steps

    report = train(
        trainer,
        compiled,
        steps=steps,
        dataset=open_dataset(None, seq_len=plan.seq_len, vocab=plan.model.vocab, seed=0),
        run_dir=tmp_path,
        checkpointing=Checkpointing(predicted_step_s=1e6),
        should_stop=stop_after_the_last_step,
        on_note=notes.append,
    )
    assert polls == [1, 2, 3] and not report.stopped and len(report.losses) == steps
    assert notes[0].startswith("checkpoints every 1 steps: a save of 1.2 MiB takes ~")
    assert notes[1].startswith("the first save, timed: checkpoints every ")
    assert notes[-2] == f"checkpoint at step 3 in {tmp_path / 'checkpoints'}"
    assert notes[-1].startswith("checkpoint cost: a save of 1.2 MiB held the loop ")
    saved = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert saved[0] == 1 and saved[-1] == 3  # the timed first save, and the last step's
