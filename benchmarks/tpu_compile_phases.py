"""Where a validation's compile time goes, on the chip this runs on: the plans `cpplan validate` would run for MODEL at
LENGTHS, compiled as validate compiles them (its compiler flags, the persistent cache in a fresh directory), each
phase timed: the backend's start, building the trainer, tracing, lowering, XLA's compile (and loading) of the step,
the initialisers; then, the cache off, the first plan's step compiled again in the warm process, two and four plans
compiled at once in threads (the host's free memory beside), and the first plan's step for the chip's abstract
(deviceless) devices. jax's own compile events (`jax.monitoring` durations) are kept beside each phase.

    python benchmarks/tpu_compile_phases.py MODEL LENGTHS OUT [TOPOLOGY]   # on a TPU VM; a line per phase

Writes OUT/compile_phases.jsonl as it goes (one JSON object per phase).
"""

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's runtime, uninstalled

PLANS_A_LENGTH = 2


class Phases:
    """Timed phases and jax's compile events, written as they end."""

    def __init__(self, path: Path):
        self.file = path.open("w")
        self.events: list[tuple[str, str, float, float]] = []  # thread, event, seconds, ended at
        self.lock = threading.Lock()
        self.t0 = time.perf_counter()

    def on_duration(self, event: str, seconds: float, **_kwargs) -> None:
        with self.lock:
            self.events.append((threading.current_thread().name, event, seconds, time.perf_counter() - self.t0))

    def timed(self, name: str, fn, **fields):
        begin = time.perf_counter()
        seen = len(self.events)
        value = fn()
        end = time.perf_counter()
        thread = threading.current_thread().name
        with self.lock:
            events = [e for e in self.events[seen:] if e[0] == thread]
        record = {
            "phase": name,
            "thread": thread,
            "seconds": round(end - begin, 3),
            "started_s": round(begin - self.t0, 3),
            "ended_s": round(end - self.t0, 3),
            "jax_events": [[e[1].rsplit("/", 1)[-1], round(e[2], 3)] for e in events],
            **fields,
        }
        with self.lock:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        print(
            f"{name}: {record['seconds']:.1f} s ({thread}, {record['started_s']:.1f}–{record['ended_s']:.1f} s)",
            flush=True,
        )
        return value


def compile_phases(phases: Phases, ranked, label: str, devices=None) -> None:
    """`runtime.runner.compile_plan`'s work for one plan, phase by phase."""
    from runtime.compile import plan_compiler_options
    from runtime.initialise import prepare_initialisers
    from runtime.mesh import build_mesh
    from runtime.optimizer import AdamW
    from runtime.train import Trainer

    plan = ranked.plan
    fields = {"plan": plan.strategy_label, "remat": plan.remat.value, "seq_len": plan.seq_len}
    trainer = phases.timed(
        f"{label} trainer", lambda: Trainer(plan, build_mesh(plan, devices), optimizer=AdamW(steps=3)), **fields
    )
    traced = phases.timed(f"{label} trace", lambda: trainer.train_step.trace(*trainer.abstract_state()), **fields)
    lowered = phases.timed(f"{label} lower", traced.lower, **fields)
    phases.timed(f"{label} compile", lambda: lowered.compile(plan_compiler_options(plan)), **fields)
    if devices is None:
        phases.timed(f"{label} initialisers", lambda: prepare_initialisers(trainer), **fields)


def at_once(phases: Phases, plans, label: str) -> None:
    """The plans compiled each in a thread of its own, all begun together, with the host's free memory
    sampled while they run."""
    import psutil

    threads = [
        threading.Thread(
            target=compile_phases, args=(phases, ranked, f"{label}: plan {i + 1}"), name=f"{label} {i + 1}"
        )
        for i, ranked in enumerate(plans)
    ]
    free = []
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        free.append(psutil.virtual_memory().available)
        time.sleep(0.5)
    phases.timed(
        f"{label}: host",
        lambda: None,
        least_free_gib=round(min(free) / 2**30, 2),
        total_gib=round(psutil.virtual_memory().total / 2**30, 2),
        swap_used_gib=round(psutil.swap_memory().used / 2**30, 2),
    )


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    model, lengths, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    topology = sys.argv[4] if len(sys.argv) > 4 else "v5e:1x1"
    out.mkdir(parents=True, exist_ok=True)

    from cli.args import seq_lens
    from cli.devices import check_devices
    from cost_models.chips import ChipKind
    from cost_models.models import get_model
    from cost_models.topology import get_topology
    from validation.steptime import choose_plans

    plans = choose_plans(
        get_model(model),
        seq_lens(lengths),
        topology,
        max_plans=PLANS_A_LENGTH,
        top=PLANS_A_LENGTH,
        compute_dtype="bfloat16",
    )
    phases = Phases(out / "compile_phases.jsonl")
    import jax

    from runtime.compile_cache import use_compile_cache

    jax.monitoring.register_event_duration_secs_listener(phases.on_duration)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["JAX_COMPILATION_CACHE_DIR"] = cache
        phases.timed("backend start", lambda: check_devices(get_topology(topology), "validate"))
        phases.timed("cache", lambda: use_compile_cache(True))
        compile_phases(phases, plans[0], "plan 1 (cold)")
        compile_phases(phases, plans[1], "plan 2")
        phases.timed("cache off", lambda: use_compile_cache(False))  # each program compiled, none loaded
        compile_phases(phases, plans[0], "plan 1 again (warm process)")
        for count in (2, 4):
            at_once(phases, plans[:count], f"{count} at once")
        if get_topology(topology).chip.kind is ChipKind.TPU:
            from runtime.compile import tpu_devices

            compile_phases(phases, plans[0], "plan 1 deviceless", devices=tpu_devices(plans[0].plan))


if __name__ == "__main__":
    main()
