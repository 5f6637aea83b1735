"""`cpplan run`'s optimizer flags: parsed into the runtime's one AdamW (MaxText's defaults where not given),
and a bad value refused before any work with one line naming the value, the rule and the fix."""

import pytest

from cli.args import optimizer_of
from cli.main import build_parser, main
from runtime.optimizer import AdamW, Decay

pytestmark = pytest.mark.pure

RUN = ["run", "--model", "tiny", "--seq-len", "1k", "--topology", "cpu:8"]


def test_the_flags_given_set_the_optimizer_and_the_rest_are_maxtexts():
    args = build_parser().parse_args(
        [
            *RUN,
            "--steps",
            "30",
            "--learning-rate",
            "1e-4",
            "--warmup-steps",
            "3",
            "--decay",
            "linear",
            "--final-lr-fraction",
            "0.2",
            "--weight-decay",
            "0",
            "--clip-norm",
            "0.5",
        ]
    )
    assert optimizer_of(args) == AdamW(
        steps=30,
        learning_rate=1e-4,
        warmup_steps=3,
        decay=Decay.LINEAR,
        final_fraction=0.2,
        weight_decay=0.0,
        clip_norm=0.5,
    )
    defaults = build_parser().parse_args(RUN)
    assert optimizer_of(defaults) == AdamW(steps=5)  # --steps' default; warmup int(0.5) = 0
    assert defaults.checkpoint_every is None  # chosen by the run from the plan's step time


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--learning-rate=-1e-3"], "--learning-rate -0.001: the peak learning rate must be a number above 0"),
        (["--learning-rate", "nan"], "--learning-rate nan: "),
        (["--learning-rate", "x"], "argument --learning-rate: invalid float value: 'x'"),
        (["--steps", "10", "--warmup-steps", "11"], "--warmup-steps 11 with --steps 10: the warmup must end by"),
        (["--warmup-steps", "-1"], "argument --warmup-steps: -1 must be at least 0"),
        (["--decay", "exponential"], "argument --decay: invalid choice: 'exponential'"),
        (["--final-lr-fraction", "2"], "--final-lr-fraction 2.0: the rate decays to this fraction"),
        (["--decay", "constant", "--final-lr-fraction", "0.2"], "--final-lr-fraction 0.2 with --decay constant"),
        (["--clip-norm", "-1"], "--clip-norm -1.0: "),
        (["--weight-decay", "inf"], "--weight-decay inf: "),
    ],
)
def test_a_bad_optimizer_flag_is_refused_in_one_line(flags, message, capsys):
    try:
        code = main([*RUN, *flags])
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpplan: error: ") and message in lines[0], captured.err
    assert "Traceback" not in captured.err + captured.out
