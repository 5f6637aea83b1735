"""pure tier: a compile runs in a child process, so a TPU compiler that ends its process (a failed check,
SIGABRT) ends the child alone. The child here is tests/fake_compiler.py, which aborts as libtpu does or
answers as runtime/compile_child.py does, with no compiler: the pre-flight, `cpplan compile` and
validate-memory each take an abort as one failed candidate naming the plan and the check, and go on."""

import json
import os
import sys
from pathlib import Path

import pytest
from fake_compiler import FAILED_CHECK

import runtime.compile
from cli import main
from cost_models.errors import CpplanError
from planner import api
from planner.plan import Plan
from runtime.compile import compile_in_child, compiler_abort_line
from runtime.preflight import preflight
from validation.memory import validate_memory

pytestmark = pytest.mark.pure

FAKE = Path(__file__).resolve().parents[1] / "fake_compiler.py"
CHECK_LINE = "llo_loop.cc:175 Check failed: index_space_.start <= index_space_.limit (0 vs. -1)"
SEARCH = dict(global_batch_tokens=4096)


@pytest.fixture
def fake_compiler(monkeypatch, tmp_path):
    """`answer(default, {plan: outcome})`: every child compile from then on runs the fake compiler."""
    outcomes = tmp_path / "outcomes.json"

    def answer(default: str, plans: dict | None = None) -> None:
        rows = [[plan.to_dict(), outcome] for plan, outcome in (plans or {}).items()]
        outcomes.write_text(json.dumps({"default": default, "plans": rows}))

    monkeypatch.setattr(runtime.compile, "CHILD_COMMAND", (sys.executable, str(FAKE), str(outcomes)))
    return answer


def tiny_plans(count: int):
    return [r.plan for r in api.run_search("tiny", "4k", "v5p:2x2x1", **SEARCH).ranked[:count]]


def test_the_failed_check_is_read_from_what_the_compiler_wrote():
    assert compiler_abort_line(f"I1206 info\nF1206 12:00:01.000000    4242 {FAILED_CHECK}\n@ frame") == CHECK_LINE
    assert compiler_abort_line("F1206 12:00:01.000000  77 tpu_compiler.cc:9] the compiler gave up") == (
        "tpu_compiler.cc:9 the compiler gave up"
    )
    assert compiler_abort_line("Check failed: x < y") == "Check failed: x < y"
    assert compiler_abort_line("W1206 a warning\nall else") is None


def test_a_child_killed_by_sigabrt_is_a_report_naming_the_plan_and_the_check(fake_compiler):
    fake_compiler("abort")
    plan = tiny_plans(1)[0]
    report = compile_in_child(plan)
    assert not report.fits and report.required_bytes is None
    assert report.failure == f"the TPU compiler ended its process (SIGABRT): {CHECK_LINE}"
    assert str(report) == f"v5p:2x2x1 {plan.strategy_label} seq 4096: no program: {report.failure}"
    assert "EnqueueToHostIovaStridedDmaInGranulesRolledLoop" in report.message  # the stack is kept


@pytest.mark.parametrize(
    "outcome, failure",
    [
        ("refuse", "the TPU compiler refused it: INVALID_ARGUMENT: a kernel over its scoped VMEM"),
        ("exit", "the compile process exited with status 1 and no result: something went wrong before"),
    ],
)
def test_a_refusal_or_a_child_that_ends_with_no_answer_is_a_failure_too(fake_compiler, outcome, failure):
    fake_compiler(outcome)
    report = compile_in_child(tiny_plans(1)[0])
    assert not report.fits and report.failure.startswith(failure)


def test_the_childs_figures_and_out_of_memory_come_back_whole(fake_compiler):
    fake_compiler("fits")
    fits = compile_in_child(tiny_plans(1)[0])
    assert fits.fits and not fits.failure and fits.required_bytes == 5 * 1024**3
    fake_compiler("oom")
    oom = compile_in_child(tiny_plans(1)[0])
    assert not oom.fits and not oom.failure and oom.required_bytes == 120 * 1024**3


def test_the_preflight_takes_an_aborted_compile_as_one_failed_plan_and_moves_to_the_next(fake_compiler):
    first, second = tiny_plans(2)
    fake_compiler("oom", {first: "abort"})
    seen = []
    with pytest.raises(CpplanError, match="none of the planner's first 2 plans compiles and fits") as err:
        preflight([first, second], devices=None, on_attempt=seen.append)
    assert [a.rank for a in seen] == [1, 2] and [a.plan for a in seen] == [first, second]
    aborted, over = seen
    assert not aborted.fits and not aborted.compiled and aborted.required_bytes is None
    assert aborted.reason == f"the TPU compiler ended its process (SIGABRT): {CHECK_LINE}"
    assert str(aborted).startswith(f"#1 {first.strategy_label} ") and str(aborted).endswith(f"failed: {aborted.reason}")
    assert over.compiled and "does not fit: the compiler needs 120.00 GiB, the device has 95.00 GiB" in str(over)
    assert f"#1 {first.strategy_label}" in str(err.value) and CHECK_LINE in str(err.value)


def test_cpplan_compile_reports_the_aborted_plan_and_compiles_the_next(fake_compiler, capsys):
    first, second = tiny_plans(2)
    fake_compiler("fits", {first: "abort"})
    argv = ["compile", "--model", "tiny", "--seq-len", "4k", "--topology", "v5p:2x2x1", "--global-batch-tokens", "4096"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"  #1 {first.strategy_label} ") and out[0].endswith(
        f"failed: the TPU compiler ended its process (SIGABRT): {CHECK_LINE}; compiling plan #2"
    )
    assert out[1] == "plan #2 compiled in their place" and out[3].startswith("compiled:  v5p:2x2x1")
    assert main([*argv, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["rank"] == 2 and Plan.from_dict(answer["plan"]) == second and answer["compiled"]["fits"]
    assert [(a["rank"], a["compiled"], Plan.from_dict(a["plan"])) for a in answer["failed"]] == [(1, False, first)]
    # every plan aborting: the command says so and what to do, and fails
    fake_compiler("abort")
    assert main([*argv, "--max-fallbacks", "2"]) == 1
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 2 and all(
        line.startswith(f"  #{n} ") and CHECK_LINE in line for n, line in enumerate(lines, 1)
    )
    assert "made no program of the planner's first 2 plans" in captured.err and "--max-fallbacks" in captured.err


def test_validate_memory_records_an_aborted_compile_per_plan(fake_compiler):
    fake_compiler("abort")
    report = validate_memory("tiny", ["4k"], ["v5p:2x2x1"])
    assert report.results and all(r.failure.endswith(CHECK_LINE) and r.compiled_bytes is None for r in report.results)
    assert report.summary()["compared"] == 0 and CHECK_LINE in report.markdown()


def test_a_stop_asked_for_ends_the_child_and_returns_nothing(fake_compiler):
    fake_compiler("fits")
    assert compile_in_child(tiny_plans(1)[0], should_stop=lambda: True) is None


def test_the_child_compiles_with_this_processs_flags_on_abstract_devices(monkeypatch):
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_user_flag=1")
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")  # a TPU VM's process: the child must leave the chips to it
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    plan = tiny_plans(1)[0]
    env = runtime.compile.child_environment(plan)
    assert env["JAX_PLATFORMS"] == "cpu" and env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
    assert env["LIBTPU_INIT_ARGS"].startswith("--xla_tpu_user_flag=1 ")  # the user's first, so they win
    assert env["LIBTPU_INIT_ARGS"] == runtime.compile.merged_compiler_args(
        "--xla_tpu_user_flag=1", "v5p", runtime.compile.scoped_vmem_flag(plan.scoped_vmem_limit_kib)
    )
    root = str(Path(runtime.compile.__file__).resolve().parents[1])
    assert env["PYTHONPATH"] == f"{root}{os.pathsep}elsewhere"
