"""A full (non-causal) mask reaches the planner from every entry point a user has: the CLI's
`--full-mask` on each command that takes a model, and a Hugging Face config's `is_causal: false`;
the flag combinations a full mask cannot have are refused up front, naming the rule and the fix."""

import json

import pytest

from cli import build_parser, main
from cli.args import model_of
from cost_models.errors import CpplanError
from cost_models.models import MODELS, ModelSpec, get_model
from planner import Plan

pytestmark = pytest.mark.pure

# `small`: 4 layers, hidden 256, 8 query heads / 4 KV heads × 32, MLP 512, vocabulary 256; one
# sequence of 4096 tokens on one fixed plan (ring over 4, no balancing, full remat)
PLAN_FLAGS = [
    "--model",
    "small",
    "--seq-len",
    "4k",
    "--topology",
    "v5p:2x2x1",
    "--strategies",
    "ring",
    "--mesh",
    "context=4",
    "--exact-batch",
    "1",
    "--remat",
    "full",
    "--load-balance",
    "none",
]
S, LAYERS, HEADS, HEAD_DIM, HIDDEN = 4096, 4, 8, 32, 256
# per layer forward, by hand: q, k, v 2·S·256·(8 + 2·4)·32; out 2·S·256·8·32; MLP 2·S·3·256·512;
# causal attention 4·S²·8·32 / 2 (MaxText's count: half the pairs); the head 2·S·256·256
QKV, OUT, MLP = 1_073_741_824, 536_870_912, 3_221_225_472
CAUSAL_ATTENTION = 8_589_934_592
HEAD = 536_870_912


def _explain_json(capsys, *extra) -> dict:
    assert main(["explain", *PLAN_FLAGS, "--top", "0", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)["best"]


def _step_flops(attention: int) -> int:
    """Model FLOPs of a training step (forward once, backward twice) with `attention` per layer."""
    return 3 * (LAYERS * (QKV + OUT + MLP + attention) + HEAD)


def test_the_flag_doubles_the_attention_flops_of_the_same_plan(capsys):
    assert QKV == 2 * S * HIDDEN * 16 * HEAD_DIM and OUT == 2 * S * HIDDEN * HEADS * HEAD_DIM
    assert MLP == 2 * S * 3 * HIDDEN * 512
    assert CAUSAL_ATTENTION == 4 * S * S * HEADS * HEAD_DIM // 2 and HEAD == 2 * S * HIDDEN * 256
    causal, full = _explain_json(capsys), _explain_json(capsys, "--full-mask")
    assert full["plan"]["model"]["causal"] is False and causal["plan"]["model"]["causal"] is True
    same = ("mesh", "cp_strategy", "load_balance", "remat", "block_q", "block_kv", "global_batch")
    assert {k: full["plan"][k] for k in same} == {k: causal["plan"][k] for k in same}
    assert causal["estimate"]["model_flops"] == _step_flops(CAUSAL_ATTENTION) == 162_671_886_336
    assert full["estimate"]["model_flops"] == _step_flops(2 * CAUSAL_ATTENTION) == 265_751_101_440
    attention = [e["estimate"]["model_flops"] - _step_flops(0) for e in (causal, full)]
    assert attention[1] == 2 * attention[0] == 3 * LAYERS * 2 * CAUSAL_ATTENTION
    # what the busiest device executes is the same: the last rank of an unbalanced causal ring sees
    # three whole hops and its own 1024-token diagonal, one whole 1024×1024 block (3 + 1 blocks),
    # as every rank does under the full mask (1024 queries × 4096 keys)
    assert full["estimate"]["executed_flops_per_device"] == causal["estimate"]["executed_flops_per_device"]
    assert full["plan"]["block_q"] == full["plan"]["block_kv"] == S // 4


def test_the_flag_reaches_the_plan_json(capsys):
    assert main(["export", "--format", "json", *PLAN_FLAGS, "--full-mask"]) == 0
    plan = Plan.from_json(capsys.readouterr().out)
    assert not plan.model.causal and plan.model == ModelSpec(**{**MODELS["small"].to_dict(), "causal": False})


@pytest.mark.parametrize(
    "argv",
    [
        ["explain", "--model", "small", "--seq-len", "4k", "--topology", "v5p:2x2x1"],
        ["sweep", "--model", "small", "--seq-lens", "4k", "--topology", "v5p:2x2x1"],
        ["max-seq-len", "--model", "small", "--topology", "v5p:2x2x1"],
        ["export", "--format", "json", "--model", "small", "--seq-len", "4k", "--topology", "v5p:2x2x1"],
        ["run", "--model", "small", "--seq-len", "4k", "--topology", "cpu:8"],
        ["compile", "--model", "small", "--seq-len", "4k", "--topology", "v5p:2x2x1"],
        ["validate", "--model", "small", "--seq-lens", "4k", "--topology", "cpu:8"],
        ["validate-memory", "--model", "small", "--seq-lens", "4k", "--topologies", "v5p:2x2x1"],
    ],
    ids=lambda argv: argv[0],
)
def test_every_command_that_takes_a_model_takes_the_flag(argv):
    assert model_of(build_parser().parse_args(argv)).causal
    assert not model_of(build_parser().parse_args([*argv, "--full-mask"])).causal


@pytest.mark.parametrize(
    "argv, planner_call",
    [
        (["sweep", "--model", "small", "--seq-lens", "4k", "--topology", "v5p:2x2x1"], "run_search"),
        (["max-seq-len", "--model", "small", "--topology", "v5p:2x2x1"], "max_seq_len"),
        (["explain", "--model", "small", "--seq-len", "4k", "--topology", "v5p:2x2x1"], "run_search"),
    ],
    ids=lambda a: a[0] if isinstance(a, list) else a,
)
def test_the_commands_plan_the_full_mask_model(monkeypatch, capsys, argv, planner_call):
    # the model each command hands the planner, not only what the parser accepts
    from planner import api

    seen, call = [], getattr(api, planner_call)

    def recording(model, *args, **kwargs):
        seen.append(model)
        return call(model, *args, **kwargs)

    monkeypatch.setattr(api, planner_call, recording)
    for flags in ([], ["--full-mask"]):
        assert main([*argv, *flags]) == 0
    capsys.readouterr()
    assert [m.causal for m in seen[:1] + seen[-1:]] == [True, False]


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["explain", *PLAN_FLAGS[:-2], "--load-balance", "zigzag", "--full-mask"],
            ["--load-balance zigzag with --full-mask", "gives every context rank the same work", "allow none"],
        ),
        (
            ["explain", *PLAN_FLAGS[:-2], "--load-balance", "dual_chunk", "--full-mask"],  # zigzag by another name
            ["--load-balance dual_chunk with --full-mask", "allow none"],
        ),
        (
            [
                "explain",
                "--model",
                "small",
                "--seq-len",
                "4k",
                "--topology",
                "v5p:2x2x1",
                "--target",
                "maxtext",
                "--full-mask",
            ],
            [
                "--target maxtext with --full-mask",
                "runs its llama2 and default decoder blocks causal",
                "leave out --target maxtext",
            ],
        ),
        (
            ["max-seq-len", "--model", "small", "--topology", "v5p:2x2x1", "--target", "maxtext", "--full-mask"],
            ["--target maxtext with --full-mask"],
        ),
        # export's default format is MaxText's flags
        (
            ["export", "--model", "small", "--seq-len", "4k", "--topology", "v5p:2x2x1", "--full-mask"],
            ["--format maxtext with --full-mask", "--format json writes the plan"],
        ),
        (["validate", "--measured", "steps.csv", "--full-mask"], ["--full-mask", "drop --full-mask"]),
    ],
    ids=["zigzag", "zigzag-alias", "explain-maxtext", "max-seq-len-maxtext", "export-maxtext", "validate-measured"],
)
def test_conflicting_flags_are_refused_with_the_rule_and_the_fix(capsys, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("cpplan: error: ") and err.count("\n") == 1 and "Traceback" not in err
    for w in words:
        assert w in err


def test_zigzag_among_other_choices_is_not_a_conflict(capsys):
    assert (
        main(["explain", *PLAN_FLAGS[:-2], "--load-balance", "zigzag,none", "--full-mask", "--top", "0", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["best"]["plan"]["load_balance"] == "none"


def _config(tmp_path, **fields) -> str:
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 512,
        "vocab_size": 256,
        **fields,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_a_hugging_face_config_states_a_full_mask_with_is_causal(tmp_path):
    assert get_model(_config(tmp_path)).causal  # a decoder LM's config says nothing: causal
    assert get_model(_config(tmp_path, is_causal=True)).causal
    assert not get_model(_config(tmp_path, is_causal=False)).causal
    # is_decoder does not decide a Llama-style model's mask: false (its default) or true, still causal
    assert all(get_model(_config(tmp_path, is_decoder=value)).causal for value in (False, True))
    with pytest.raises(CpplanError, match=r"is_causal='no' must be true or false; fix the config"):
        get_model(_config(tmp_path, is_causal="no"))


def test_a_full_mask_config_meets_the_same_refusals(tmp_path, capsys):
    path = _config(tmp_path, is_causal=False)
    assert main(["explain", "--model", path, "--seq-len", "4k", "--topology", "v5p:2x2x1", "--target", "maxtext"]) == 2
    assert f"--target maxtext with --model {path} (is_causal: false)" in capsys.readouterr().err
    assert main(["explain", "--model", path, "--seq-len", "4k", "--topology", "v5p:2x2x1", "--top", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["best"]["plan"]["model"]["causal"] is False
