"""The cpplan command line, run as a user runs it."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli import main

pytestmark = pytest.mark.pure


def test_explain_human_and_json(capsys):
    assert main(["explain", "--model", "llama3.1-8b", "--seq-len", "4M", "--topology", "v5p-256", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "Chosen plan" in out and "#4" in out and "#5" not in out
    assert "llama3.1-8b (8.03B params," in out
    assert main(["explain", "--model", "small", "--seq-len", "4k", "--topology", "v5p:2x2x1"]) == 0
    assert "small (2.49M params," in capsys.readouterr().out  # not "0.00B"
    assert main(["explain", "--model", "llama3.1-8b", "--seq-len", "4M", "--topology", "v5p-256", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["best"]["plan"]["seq_len"] == 4 * 2**20 and data["best"]["estimate"]["fits"]


def test_sweep_shows_each_length(capsys):
    assert main(["sweep", "--model", "llama3.1-8b", "--topology", "tpu7x:2x2x4", "--seq-lens", "64k,256k,16M"]) == 0
    out = capsys.readouterr().out
    assert "64K" in out and "256K" in out and "16M  nothing fits" in out
    lines = out.splitlines()
    step_ends = {line.index("s ", line.index("  ", 10) + 2) for line in lines[1:3]}  # each row's step time
    assert step_ends == {lines[0].index("step") + len("step") - 1}  # ends where its header does, however long the plan
    assert main(["sweep", "--model", "tiny", "--topology", "cpu:8", "--seq-lens", "1k,4k", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["seq_len"] for r in rows] == [1024, 4096] and all(r["fits"] for r in rows)


def test_sweep_marks_a_plan_within_the_memory_error_of_the_capacity(capsys):
    # 1856K tokens: max-seq-len's answer on v5p-16, priced at 95.5 of 95.7 GiB
    assert main(["sweep", "--model", "llama3.1-8b", "--topology", "v5p-16", "--seq-lens", "1M,1856k"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "Gi*" in out[2] and "Gi*" not in out[1]
    assert out[-1].startswith("(*: fits within the memory price's measured error of the capacity")


def test_max_seq_len_and_export(capsys):
    assert main(["max-seq-len", "--model", "llama3.1-8b", "--topology", "v5p-16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_seq_len"] >= 2**20
    # ring: the best plan here is a zigzag USP, which MaxText refuses (its USP takes no load balancing)
    assert (
        main(
            [
                "export",
                "--format",
                "maxtext",
                "--model",
                "llama3.1-8b",
                "--seq-len",
                "128k",
                "--topology",
                "v5p-16",
                "--global-batch-tokens",
                "128k",
                "--strategies",
                "ring",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert "ici_context_parallelism=" in out and "max_target_length=131072" in out and "model_name=llama3.1-8b" in out
    # the compiler flags go to stderr, never among the training flags
    assert "cpplan: run it with LIBTPU_INIT_ARGS=--xla_tpu_buffer_assignment_algorithm=BEST_OF_SPATIAL_TEMPORAL" in err
    assert "xla_tpu" not in out


def test_export_json_carries_the_libtpu_flags_maxtext_needs(capsys):
    # all-gather over 4 at 32K on v5p-8: MaxText's target takes splash blocks of 2048, whose grid step needs
    # more scoped VMEM than the compiler's default 16 MiB (a compile without the flag fails)
    args = ["export", "--format", "maxtext", "--model", "llama3.1-8b", "--seq-len", "32k", "--topology", "v5p-8"]
    assert (
        main([*args, "--strategies", "all_gather", "--mesh", "context=4", "--global-batch-tokens", "32k", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["flags"]["sa_block_q"] == 2048
    assert out["libtpu_init_args"] == (
        "--xla_tpu_scoped_vmem_limit_kib=65472 --xla_tpu_buffer_assignment_algorithm=BEST_OF_SPATIAL_TEMPORAL"
    )


def test_a_batch_target_or_an_exact_batch(capsys):
    """--global-batch-tokens is a target the search moves to a count that fits; --exact-batch is kept."""
    assert (
        main(
            [
                "explain",
                "--model",
                "llama3.1-8b",
                "--seq-len",
                "128k",
                "--topology",
                "v5p-16",
                "--exact-batch",
                "3",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["global_batch"] == 3
    assert (
        main(
            [
                "explain",
                "--model",
                "llama3.1-8b",
                "--seq-len",
                "128k",
                "--topology",
                "v5p-16",
                "--global-batch-tokens",
                "384k",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["global_batch"] in (2, 3, 4, 6)
    assert (
        main(
            [
                "explain",
                "--model",
                "llama3.1-8b",
                "--seq-len",
                "128k",
                "--topology",
                "v5p-16",
                "--exact-batch",
                "3",
                "--global-batch-tokens",
                "384k",
            ]
        )
        == 2
    )
    assert "global_batch" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["explain", "--model", "lama3.1-8b", "--seq-len", "4M", "--topology", "v5p-256"],
            "Did you mean 'llama3.1-8b'",
        ),
        (["explain", "--model", "llama3.1-8b", "--seq-len", "4M", "--topology", "v5p:3x3x3"], "does not exist"),
        (
            ["explain", "--model", "llama3.1-8b", "--seq-len", "-4", "--topology", "v5p-16"],
            "cannot read sequence length",
        ),
        (
            ["explain", "--model", "llama3.1-8b", "--seq-len", "4M", "--topology", "v5p-16", "--mesh", "context"],
            "AXIS=SIZE",
        ),
    ],
)
def test_bad_input_is_one_line_not_a_traceback(capsys, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("cpplan: error: ") and words in err and "Traceback" not in err


def test_nothing_fits_exits_1_with_the_reasons(capsys):
    assert main(["explain", "--model", "llama3.1-405b", "--seq-len", "8M", "--topology", "v5p-16"]) == 1
    assert "No plan fits" in capsys.readouterr().out


ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("explain", "sweep", "max-seq-len", "export", "run", "compile", "calibrate", "validate", "validate-memory")


def test_help_lists_every_command_with_its_line():
    out = subprocess.run(
        [sys.executable, "-m", "cli", "--help"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("    ") and line.split()}
    assert listed >= set(COMMANDS), out
    assert "the longest sequence any plan fits" in out and "write a chip row" in out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_its_own_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: cpplan {command}") and "--" in out


def test_validate_without_a_case_says_what_it_needs(capsys):
    assert main(["validate", "--model", "tiny"]) == 2
    assert "needs --model, --seq-lens and --topology" in capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_has_help_stating_its_default(command):
    from cli import build_parser

    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sub = subparsers.choices[command]
    formatter = sub._get_formatter()
    for action in sub._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        assert action.help, f"{command} {action.option_strings[0]} has no help"
        if action.default not in (None, False, argparse.SUPPRESS):
            assert f"(default: {action.default})" in formatter._expand_help(action), (command, action.option_strings)


def test_a_host_priced_with_the_generic_row_says_how_to_calibrate(tmp_path, capsys, monkeypatch):
    """cpu:N is priced with the packaged rough row until `cpplan calibrate` writes this machine's."""
    import shutil

    from cost_models.chips import CHIP_DIR, CHIP_DIR_ENV

    argv = ["explain", "--model", "tiny", "--seq-len", "4k", "--topology", "cpu:8", "--top", "0"]
    monkeypatch.delenv(CHIP_DIR_ENV, raising=False)
    assert main(argv) == 0
    assert "cpplan calibrate --topology cpu:8" in capsys.readouterr().err
    shutil.copy(CHIP_DIR / "cpu.json", tmp_path / "cpu.json")  # as calibrate would write it
    monkeypatch.setenv(CHIP_DIR_ENV, str(tmp_path))
    assert main(argv) == 0
    assert "calibrate" not in capsys.readouterr().err
