"""A planned run on the devices present: join the processes, pre-flight the ranked plans (best
first, falling back to the next that compiles and fits), open the data, and train."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cost_models.chips import ChipKind
from planner.plan import Plan
from runtime.distributed import ProcessGroup


@dataclass(frozen=True)
class Launch:
    """What `cpplan run` asks of a run; one line per flag of the same name."""

    steps: int
    run_dir: Path
    data: str | None = None
    pack: bool = False
    data_dtype: str | None = None
    eos_id: int | None = None
    seed: int = 0
    max_fallbacks: int = 4
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    resume: bool = True
    profile_steps: tuple[int, int] | None = None


def use_tpu_compiler_flags(chip, plans: Sequence[Plan] = ()) -> None:
    """On a TPU, before jax starts its backend: the compiler flags the price's overlap data was read
    with, and the scoped VMEM the splash blocks of any of `plans` (those a run may fall back to)
    need. The user's own LIBTPU_INIT_ARGS win."""
    if chip.kind is ChipKind.TPU:
        from runtime.compile import scoped_vmem_flag, use_compiler_flags

        limits = [p.scoped_vmem_limit_kib for p in plans if p.scoped_vmem_limit_kib is not None]
        use_compiler_flags(chip.name, scoped_vmem_flag(max(limits) if limits else None))


def prepare(plans: Sequence[Plan], group: ProcessGroup, launch: Launch, *, say: Callable[[str], None]):
    """Joins the processes, opens the data, and pre-flights `plans` (ranked, best first): the first
    of the first `max_fallbacks` that compiles and fits on this process's devices wins.

    Returns:
        (the `runtime.preflight.Preflight`, the dataset).
    Raises:
        CpplanError: none of them compiles and fits, or the data cannot be read.
    """
    from runtime.distributed import initialize

    plans = list(plans[: launch.max_fallbacks])
    chip = plans[0].topology_spec.chip
    use_tpu_compiler_flags(chip, plans)
    initialize(group, platform=chip.kind.jax_platform)
    import jax

    from runtime.data import open_dataset
    from runtime.preflight import preflight

    best = plans[0]  # every ranked plan has its model and sequence length
    dataset = open_dataset(
        launch.data,
        seq_len=best.seq_len,
        vocab=best.model.vocab,
        seed=launch.seed,
        pack=launch.pack,
        dtype=launch.data_dtype,
        eos_id=launch.eos_id,
    )
    say(
        f"{jax.process_count()} process(es), {jax.device_count()} {jax.devices()[0].platform} devices; "
        f"pre-flight compile of the planner's plans, best first:"
    )
    checked = preflight(
        plans,
        devices=jax.devices(),
        packed=launch.pack,
        max_attempts=launch.max_fallbacks,
        on_attempt=lambda attempt: say(f"  {attempt}"),
    )
    return checked, dataset


def train_checked(checked, dataset, launch: Launch, *, should_stop: Callable[[], bool], say: Callable[[str], None]):
    """Trains the plan the pre-flight chose, with checkpoints and metrics in `launch.run_dir`.

    Returns:
        runtime.loop's report of the steps done.
    """
    from runtime.loop import Checkpointing, train

    checkpointing = Checkpointing(every=launch.checkpoint_every, keep=launch.keep_checkpoints, resume=launch.resume)
    return train(
        checked.trainer,
        checked.compiled,
        steps=launch.steps,
        dataset=dataset,
        seed=launch.seed,
        run_dir=launch.run_dir,
        checkpointing=checkpointing,
        profile_steps=launch.profile_steps,
        should_stop=should_stop,
        memory=checked.memory,
        compile_s=sum(a.compile_s for a in checked.attempts),
        on_note=say,
    )
