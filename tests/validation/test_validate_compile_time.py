"""Validate's compiles: a second validate of the same plans loads their programs from the persistent
compilation cache, plans laid out alike share one initialising program, a compile that fails in the
thread compiling ahead is recorded against its plan as a compile in hand is, and each plan gets a line
(and journal fields) saying how long its compile and its steps took. Compiles are counted from jax's
monitoring events and the cache's files, never timed."""

import json
import os
import threading
from collections import OrderedDict

import pytest

# ring on cpu:8 with each attention backward: one layout of parameters, two step programs
PLANS = dict(max_plans=1, top=1, strategies=["ring"], compute_dtype="float32", both_backwards=True)


def _two_plans():
    from validation.steptime import choose_plans

    plans = choose_plans("tiny", [1024], "cpu:8", **PLANS)
    # the premise: two plans that differ in their attention backward only
    assert [r.plan.fused_attention_backward for r in plans] == [False, True]
    return plans


def _validate(plans, journal, **kwargs):
    from validation.steptime import validate_step_times

    lines = []
    report = validate_step_times(
        "tiny", [1024], "cpu:8", steps=2, plans=plans, journal=journal, say=lines.append, **kwargs
    )
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    return report, records, lines


@pytest.fixture
def fresh_initialisers(monkeypatch):
    """No initialising program kept from earlier tests."""
    from runtime import initialise

    monkeypatch.setattr(initialise, "_programs", OrderedDict())


@pytest.fixture
def compile_cache(tmp_path, monkeypatch):
    """The persistent cache on, as `cpplan validate` turns it on, in a folder of the test's own; jax's
    settings as they were afterwards."""
    import jax

    from runtime.compile_cache import CACHE_DIR_ENV, use_compile_cache

    names = ("jax_enable_compilation_cache", "jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = {name: getattr(jax.config, name) for name in names}
    where = tmp_path / "cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(where))
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    assert str(where) in use_compile_cache()
    # every program is kept, however quickly this host compiles it (jax's default keeps those over a second)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    yield where
    for name, value in before.items():
        jax.config.update(name, value)
    from jax.experimental.compilation_cache import compilation_cache

    compilation_cache.reset_cache()


@pytest.mark.cpu_mesh
def test_a_second_validate_of_the_same_plans_loads_every_program_from_the_cache(
    tmp_path, compile_cache, fresh_initialisers, monkeypatch
):
    from runtime import initialise

    plans = _two_plans()
    _, first, _ = _validate(plans, tmp_path / "first.jsonl")
    assert [r["failure"] for r in first] == [None, None]
    # nothing was kept: the first plan compiles its step, the two initialisers and what its trace
    # computes on the host the first time in this process; the second its step only
    assert [(r["compile_cache_hits"], r["compile_cache"]) for r in first] == [(0, "cache miss"), (0, "cache miss")]
    assert first[0]["compiles"] >= 3 and first[1]["compiles"] == 1
    kept = sorted(p.name.split("-")[0] for p in compile_cache.iterdir() if p.name.endswith("-cache"))
    assert kept.count("jit_fn") == 2 and "jit_initial_params" in kept and "jit_initial_opt_state" in kept

    monkeypatch.setattr(initialise, "_programs", OrderedDict())  # as a new process starts: nothing in memory
    _, second, lines = _validate(plans, tmp_path / "second.jsonl")
    assert [(r["compiles"], r["compile_cache_hits"], r["compile_cache"]) for r in second] == [
        (3, 3, "cache hit"),
        (1, 1, "cache hit"),
    ]
    assert sorted(p.name.split("-")[0] for p in compile_cache.iterdir() if p.name.endswith("-cache")) == kept
    assert all("(cache hit)" in line for line in lines)
    assert [r["measured_step_s"] > 0 for r in second] == [True, True]


@pytest.mark.cpu_mesh
def test_plans_laid_out_alike_share_one_initialiser_that_gives_their_own_weights(fresh_initialisers, monkeypatch):
    import flax.linen as nn
    import jax
    import numpy as np

    from runtime import initialise
    from runtime.runner import compile_plan

    traced = []
    real = initialise.initial_params

    def counted(model, rng):
        traced.append(model.plan.fused_attention_backward)  # once per trace: jax runs it only to trace it
        return real(model, rng)

    monkeypatch.setattr(initialise, "initial_params", counted)
    a, b = (compile_plan(r.plan, steps=2) for r in _two_plans())
    assert traced == [False]  # the first plan's model traced it; the second's never was
    assert a.compiles.compiled >= 3 and b.compiles.compiled == 1  # the second compiles its step only
    assert a.trainer.param_shardings == b.trainer.param_shardings

    # the shared program gives the second plan the weights its own initialiser gives (as `Trainer.init`
    # made them before programs were shared)
    shared, _ = b.trainer.init(seed=3)
    own = jax.jit(lambda r: nn.meta.unbox(b.trainer._init_variables(r)), out_shardings=b.trainer.param_shardings)(
        jax.random.PRNGKey(3)
    )
    assert jax.tree.structure(shared) == jax.tree.structure(own)
    for x, y in zip(jax.tree.leaves(shared), jax.tree.leaves(own)):
        assert x.sharding == y.sharding
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.cpu_mesh
def test_a_compile_failing_in_the_thread_ahead_is_recorded_against_its_plan(tmp_path, monkeypatch):
    from runtime import runner
    from validation.steptime import failure_reason

    first, second = _two_plans()
    plans = [first, second, first]  # the one after the failure is measured too
    error = RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 20.5G of 15.75G hbm.")
    threads = []
    real = runner.compile_plan

    def compile_plan(plan, **kwargs):
        threads.append(threading.current_thread())
        if plan.fused_attention_backward:
            raise error
        return real(plan, **kwargs)

    monkeypatch.setattr(runner, "compile_plan", compile_plan)
    report, records, lines = _validate(plans, tmp_path / "measurements.jsonl", compile_ahead=True)
    # the first plan compiles in hand, each later one in a thread ahead (begun beside it, so in any order)
    assert sorted(t is threading.main_thread() for t in threads) == [False, False, True]
    assert [r["compiled_ahead"] for r in records] == [False, True, True]
    assert [r.failure for r in report.results] == [None, failure_reason(error), None]
    assert records[1]["failure"] == "out of memory: " + str(error)
    assert (records[1]["compiles"], records[1]["steps"]) == (None, 0)
    assert records[0]["measured_step_s"] > 0 and records[2]["measured_step_s"] > 0
    assert lines[1].endswith(f"(failed; ahead, waited {records[1]['compile_wait_s']:.1f} s); out of memory: {error}")


@pytest.mark.cpu_mesh
def test_a_plans_steps_wait_for_the_compiles_of_its_wave(tmp_path, monkeypatch):
    import runtime
    from runtime import runner

    first, second = _two_plans()
    plans = [first, second, first]  # a wave of two (AHEAD_COMPILES one), then a wave of one
    monkeypatch.setattr("validation.steptime.AHEAD_COMPILES", 1)
    monkeypatch.setattr("validation.steptime.QUIET_POLL_S", 0.01)
    events = []
    first_compiled, waited = threading.Event(), threading.Event()
    polls = []
    real_compile, real_run = runner.compile_plan, runtime.run

    def stop():
        polls.append(True)  # asked at each poll while the first plan waits for its wave
        if len(polls) == QUIET_POLLS:
            waited.set()
        return False

    def compile_plan(plan, **kwargs):
        ahead = threading.current_thread() is not threading.main_thread()
        if ahead:
            first_compiled.wait()  # compiling ahead, it ends after the plan in hand has compiled
        try:
            compiled = real_compile(plan, **kwargs)
        finally:
            first_compiled.set()
        if ahead:
            waited.wait()  # and after the plan in hand has waited for it through QUIET_POLLS polls
        events.append(f"compiled {'fused' if plan.fused_attention_backward else 'separate'}")
        return compiled

    def run(plan, *, compiled, **kwargs):
        value = compiled()
        events.append(f"steps {'fused' if plan.fused_attention_backward else 'separate'}")
        return real_run(plan, compiled=value, **kwargs)

    monkeypatch.setattr(runner, "compile_plan", compile_plan)
    monkeypatch.setattr(runtime, "run", run)
    _, records, lines = _validate(plans, tmp_path / "measurements.jsonl", compile_ahead=True, stop=stop)
    # the first plan's steps waited for the second's compile; the third compiled in a wave of its own
    assert events == ["compiled separate", "compiled fused", "steps separate", "steps fused"] + [
        "compiled separate",
        "steps separate",
    ]
    assert [r["compiled_ahead"] for r in records] == [False, True, False]
    # at least QUIET_POLLS polls of 0.01 s; nothing left to wait for after it
    assert records[0]["quiet_wait_s"] >= QUIET_POLLS * 0.01
    assert records[1]["quiet_wait_s"] == records[2]["quiet_wait_s"] == 0
    assert f"then {records[0]['quiet_wait_s']:.1f} s for its wave's other compiles" in lines[0]
    assert "for its wave" not in lines[1] + lines[2]
    assert [r["failure"] for r in records] == [None, None, None]


QUIET_POLLS = 6  # polls of 0.01 s: a wait the plan's line reports (it says waits from 0.05 s)


@pytest.mark.pure
def test_a_plan_told_to_stop_while_its_wave_compiles_is_abandoned_before_its_steps(monkeypatch):
    from validation.steptime import PlanCompile, StoppedBeforeSteps

    monkeypatch.setattr("validation.steptime.QUIET_POLL_S", 0.01)
    release = threading.Event()
    blocked = PlanCompile(release.wait, ahead=True)  # a compile that ends only when released
    asked = []

    def stop():
        asked.append(True)
        return True

    with pytest.raises(StoppedBeforeSteps, match="interrupted before its steps"):
        PlanCompile(lambda: "compiled").result(then_wait_for=[blocked], stop=stop)
    assert asked == [True] and not release.is_set()  # it stopped the first time it asked
    release.set()
    assert blocked.result() is True


@pytest.mark.pure
def test_the_line_of_a_plan_says_its_compile_and_its_steps():
    from validation.steptime import plan_line

    record = {
        "label": "ring [context=4] full, blocks 512",
        "seq_len": 2048,
        "compile_s": 41.24,
        "compile_wait_s": 3.04,
        "compiled_ahead": True,
        "quiet_wait_s": 0.0,
        "compile_cache": "cache hit",
        "step_times_s": [1.5, 0.82, 0.84],
        "steps": 3,
        "steps_s": 3.16,
        "failure": None,
    }
    assert plan_line(3, 12, record) == (
        "plan 3/12 ring [context=4] full, blocks 512 at 2048 tokens: compile 41.2 s (cache hit; ahead, waited "
        "3.0 s), steps 3 in 3.16 s (best 0.82 s)"
    )
    first = record | {"compiled_ahead": False, "quiet_wait_s": 12.34}
    assert plan_line(1, 12, first) == (
        "plan 1/12 ring [context=4] full, blocks 512 at 2048 tokens: compile 41.2 s (cache hit; then 12.3 s for "
        "its wave's other compiles), steps 3 in 3.16 s (best 0.82 s)"
    )
    stopped = record | {"compiled_ahead": False, "compile_cache": "cache miss", "step_times_s": [1.5], "steps": 1}
    stopped |= {"steps_s": 1.5, "failure": "abandoned: interrupted after 1 of 3 steps"}
    assert plan_line(1, 2, stopped) == (
        "plan 1/2 ring [context=4] full, blocks 512 at 2048 tokens: compile 41.2 s (cache miss), steps 1 in 1.50 s "
        "(best 1.5 s); abandoned: interrupted after 1 of 3 steps"
    )


@pytest.mark.cpu_mesh
def test_the_cache_is_the_users_own_unless_placed_or_turned_off(tmp_path, monkeypatch):
    import jax

    from runtime.compile_cache import CACHE_DIR_ENV, MAX_SIZE_ENV, default_cache_dir, use_compile_cache

    names = ("jax_enable_compilation_cache", "jax_compilation_cache_dir", "jax_compilation_cache_max_size")
    before = {name: getattr(jax.config, name) for name in names}
    try:
        monkeypatch.delenv(MAX_SIZE_ENV, raising=False)
        monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert default_cache_dir() == tmp_path / "xdg" / "cpplan" / "jax"
        assert use_compile_cache().startswith(f"compilation cache: {tmp_path / 'xdg' / 'cpplan' / 'jax'} (cpplan's")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xdg" / "cpplan" / "jax")
        monkeypatch.delenv("XDG_CACHE_HOME")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        assert default_cache_dir() == tmp_path / "home" / ".cache" / "cpplan" / "jax"
        monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "mine"))
        assert use_compile_cache() == (
            f"compilation cache: {tmp_path / 'mine'} (${CACHE_DIR_ENV}; kept to 10 GiB at each start, the programs "
            f"read least recently removed first (${MAX_SIZE_ENV} changes it); --no-compile-cache turns it off)"
        )
        # past the bound, the program read least recently goes before this run compiles; jax's own bound stays
        # off (it would fail every write to a directory another process without it wrote to)
        (tmp_path / "mine").mkdir()
        for key, read_at in (("older", 1_000), ("newer", 2_000)):
            (tmp_path / "mine" / f"{key}-cache").write_bytes(b"x" * 3_000)
            os.utime(tmp_path / "mine" / f"{key}-cache", (read_at, read_at))
        monkeypatch.setenv(MAX_SIZE_ENV, "5000")
        assert ": 1 removed now, 0.00 GiB; --no-compile-cache" in use_compile_cache()
        assert [p.name for p in (tmp_path / "mine").iterdir()] == ["newer-cache"]
        assert jax.config.jax_compilation_cache_max_size == -1
        monkeypatch.setenv(MAX_SIZE_ENV, "-1")
        assert f"; no bound (${MAX_SIZE_ENV}=-1);" in use_compile_cache()
        assert use_compile_cache(False) == "compilation cache: off (--no-compile-cache)"
        assert not jax.config.jax_enable_compilation_cache
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()
