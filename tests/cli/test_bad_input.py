"""Bad input at every boundary: CLI flags, model configs, chip rows, Plan JSON, measured CSVs and
logs, MaxText flags. Each is refused with exit 2 and one line naming the value, never a traceback,
before any work (so each case takes well under a second)."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli import main
from cost_models.chips import CHIP_DIR, CHIP_DIR_ENV
from cost_models.errors import CpplanError
from planner.maxtext import plan_from_maxtext
from planner.options import parse_seq_len
from planner.plan import Plan

pytestmark = pytest.mark.pure

PLAN = ["--model", "tiny", "--seq-len", "4k", "--topology", "cpu:8"]


def refused(argv, capsys) -> str:
    """Runs the CLI; asserts exit 2 with one line on stderr and no traceback; returns the line."""
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2, (argv, captured)
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpplan: error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


# -- CLI flags --------------------------------------------------------------------------------
RUN_FLAGS = [  # counts, steps, ids beyond what the runtime keeps in 32 bits, multi-process flags
    *(["--steps", v] for v in ("-1", "x", "1.5", "99999999999999999999")),
    *(["--checkpoint-every", v] for v in ("-1", "x", "4294967296")),
    *(["--keep-checkpoints", v] for v in ("0", "-1")),
    *(["--resume-from", v] for v in ("-1", "x", "0")),
    ["--resume-from", "5", "--no-resume"],
    *(["--seed", v] for v in ("-1", "x", "99999999999")),
    ["--data-dtype", "int8"],
    *(["--eos-id", v] for v in ("-1", "x")),
    ["--max-fallbacks", "-1"],
    *(["--profile-steps", v] for v in ("3", "5:2", "x:y", "0:2", "1:1000")),
    *(["--coordinator", v] for v in ("localhost", "localhost:99999", ":1234")),
    *(["--join-timeout", v] for v in ("0", "-5", "x")),
    *(["--num-processes", v] for v in ("0", "-1")),
    ["--process-id", "2", "--num-processes", "2"],
    ["--process-id", "-1"],
    ["--mesh", "context=16"],
    ["--run-dir", ""],
]
MAXTEXT_RUN = (
    "ici_context_parallelism=8 max_target_length=131072 per_device_batch_size=0.125 model_name=llama3.1-8b "
    "compile_topology=v5p-16 context_parallel_strategy=ring"
)
IMPORT_FLAGS = [  # MaxText command lines, each wrong in one token
    ("", ()),
    ("=", ()),
    *(
        (MAXTEXT_RUN.replace(old, new), ())
        for old, new in (
            ("ici_context_parallelism=8", "ici_context_parallelism=x"),
            ("131072", "-1"),
            ("131072", "0"),
            ("0.125", "-1"),
            ("0.125", "nan"),
            ("=ring", "=spiral"),
            ("v5p-16", "v5p-7"),
            ("llama3.1-8b", "nonexistent"),
            ("compile_topology=v5p-16", ""),
        )
    ),
    *(
        (f"{MAXTEXT_RUN} {extra}", ())
        for extra in (
            "remat_policy=sometimes",
            "ici_fsdp_parallelism=0",
            "dtype=float8",
            "max_target_length=4096",
            "context_parallel_load_balance=maybe",
        )
    ),
    (MAXTEXT_RUN.replace("compile_topology=v5p-16", ""), ("--topology", "cpu:0")),
]
FLAG_CASES = (
    [
        ["explain", *PLAN, "--top", "-3"],
        ["explain", *PLAN, "--top", "x"],
        ["explain", *PLAN, "--top", "1.5"],
        ["export", *PLAN, "--top", "1"],  # not an abbreviation of --topology
        ["explain", "--model", "tiny", "--seq-len", "4k", "--topo", "cpu:8"],
        ["explain", "--mod", "tiny", "--seq-len", "4k", "--topology", "cpu:8"],
        ["explain", *PLAN, "--mesh", "context=4,context=2"],
        ["explain", *PLAN, "--mesh", "context=²"],
        ["explain", *PLAN, "--mesh", "context"],
        ["explain", *PLAN, "--mesh", "context=-2"],
        ["explain", *PLAN, "--mesh", "context=0"],
        ["explain", *PLAN, "--mesh", "context=3"],
        ["explain", *PLAN, "--mesh", "kontext=2"],
        ["explain", *PLAN, "--mesh", ","],
        ["explain", *PLAN, "--mesh", ""],
        ["explain", *PLAN, "--mesh", "context=1e3"],
        ["explain", *PLAN, "--strategies", ","],
        ["explain", *PLAN, "--strategies", "rign"],
        ["explain", *PLAN, "--remat", "some"],
        ["explain", *PLAN, "--load-balance", "zagzig"],
        ["explain", *PLAN, "--global-batch-tokens", "-1"],
        ["explain", *PLAN, "--global-batch-tokens", "nan"],
        ["explain", *PLAN, "--global-batch-tokens", "4k", "--exact-batch", "2"],
        ["explain", *PLAN, "--exact-batch", "0"],
        ["explain", *PLAN, "--exact-batch", "-1"],
        ["explain", *PLAN, "--loss-chunk-tokens", "-1"],
        ["explain", *PLAN, "--loss-chunk-tokens", "inf"],
        ["explain", "--model", "tiny", "--seq-len", "99999999999999999999M", "--topology", "cpu:8"],
        ["explain", *PLAN, "--unknown-flag"],
        ["explain", "--model", "tiny", "--topology", "cpu:8"],
        ["explain", "--model", "tiny", "--seq-len", "4k"],
        ["nonsense-command"],
        [],
        ["sweep", "--model", "tiny", "--topology", "cpu:8", "--seq-lens", ","],
        ["sweep", "--model", "tiny", "--topology", "cpu:8", "--seq-lens", ""],
        ["sweep", "--model", "tiny", "--topology", "cpu:8", "--seq-lens", "1k,,x"],
        ["sweep", "--model", "tiny", "--topology", "cpu:8", "--seq-lens", "0"],
        ["max-seq-len", "--model", "tiny", "--topology", "cpu:7x"],
        ["export", *PLAN, "--format", "yaml"],
        ["calibrate", "--topology", "cpu:8", "--repeats", "0"],
        ["calibrate", "--topology", "cpu:8", "--dtype", "int8"],
        ["calibrate", "--topology", "cpu:8", "--repeats", "-2"],
        ["validate", "--model", "tiny", "--seq-lens", "1k", "--topology", "cpu:8", "--max-plans", "0"],
        ["validate", "--model", "tiny", "--seq-lens", "1k", "--topology", "cpu:8", "--steps", "1"],
        ["validate", "--model", "tiny", "--seq-lens", "1k", "--topology", "cpu:8", "--top", "-1"],
        ["validate", "--model", "tiny", "--seq-lens", "1k", "--topology", "cpu:8", "--seed", "-1"],
        ["validate", "--model", "tiny", "--seq-lens", "1k", "--topology", "cpu:8", "--sequences", "0"],
        ["validate", "--model", "tiny", "--seq-lens", ",", "--topology", "cpu:8"],
        ["validate", "--model", "tiny", "--topology", "cpu:8"],
        ["validate-memory", "--model", "tiny", "--seq-lens", "1k", "--topologies", "cpu:8"],
        ["validate-memory", "--model", "tiny", "--seq-lens", "1k", "--topologies", ","],
        ["validate-memory", "--model", "tiny", "--seq-lens", "1k", "--topologies", "v5p:2x2x2", "--layers", "0"],
        ["validate-memory", "--model", "tiny", "--seq-lens", "1k", "--topologies", "v5p:2x2x2", "--per-strategy", "0"],
        ["run", *PLAN[:-1], "v5p-8"],
        ["run", *PLAN, "--steps", "0"],
        ["run", *PLAN, "--data", "/nonexistent.txt"],
        ["run", *PLAN, "--data", "/"],
        ["validate", "--model", "tiny", "--seq-lens", "1k", "--topology", "cpu:8", "--data", "/nonexistent.txt"],
    ]
    + [
        ["explain", "--model", "tiny", "--seq-len", text, "--topology", "cpu:8"]
        for text in ("0", "-4k", "4x", "1.5", "nan", "inf", "1e400", "", "4 k k", "0.3k", "²", "4M4")
    ]
    + [
        ["explain", "--model", "tiny", "--seq-len", "4k", "--topology", text]
        for text in ("", "cpu:0", "cpu:-8", "v5p-7", "v5p:4x4", "tpu9-8", "v5p:0x2x2", "cpu:8x")
    ]
    + [
        ["explain", "--model", text, "--seq-len", "4k", "--topology", "cpu:8"]
        for text in ("", "lama3.1-8b", "/nonexistent/config.json", "x" * 300 + ".json")
    ]
    + [["run", *PLAN, *flags] for flags in RUN_FLAGS]
    + [["import", "--flags", text, *rest] for text, rest in IMPORT_FLAGS]
)


@pytest.mark.parametrize("argv", FLAG_CASES, ids=lambda a: " ".join(a)[:70])
def test_bad_flags_are_refused_in_one_line(argv, capsys):
    refused(argv, capsys)


# -- model configs ----------------------------------------------------------------------------
GOOD_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
}
BAD_NUMBERS = ["x", None, 0, -1, 1.5, True, [], {}]
CONFIG_CASES = [
    {**GOOD_CONFIG, key: bad}
    for key in (*sorted(GOOD_CONFIG.keys() - {"model_type"}), "head_dim")
    for bad in BAD_NUMBERS
] + [
    {**GOOD_CONFIG, "num_attention_heads": 3},  # 64 / 3 is no whole head size
    {**GOOD_CONFIG, "num_key_value_heads": 3},  # does not divide 4 heads
    {**GOOD_CONFIG, "num_key_value_heads": 8},
    {**GOOD_CONFIG, "model_type": "gpt2"},
    {**GOOD_CONFIG, "model_type": None},
    {**GOOD_CONFIG, "tie_word_embeddings": "yes"},
    {**GOOD_CONFIG, "attention_bias": 1},
    {**GOOD_CONFIG, "_name_or_path": 5},
    {k: v for k, v in GOOD_CONFIG.items() if k != "hidden_size"},
    [GOOD_CONFIG],
    None,
    "llama",
    7,
]
RAW_CONFIGS = [
    b"\xff\xfe\x00bad",
    b"{",
    b"",
    b"[" * 100000 + b"]" * 100000,
    json.dumps(GOOD_CONFIG).replace('"vocab_size": 256', '"vocab_size": 1e400').encode(),
    json.dumps(GOOD_CONFIG).replace('"vocab_size": 256', '"vocab_size": NaN').encode(),
]


@pytest.mark.parametrize("config", CONFIG_CASES + RAW_CONFIGS, ids=lambda c: repr(c)[:60])
def test_bad_model_configs_are_refused(config, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_bytes(config if isinstance(config, bytes) else json.dumps(config).encode())
    line = refused(["explain", "--model", str(path), "--seq-len", "1k", "--topology", "cpu:8"], capsys)
    assert "config" in line or str(path) in line


def test_the_good_config_is_read(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GOOD_CONFIG))
    assert main(["explain", "--model", str(path), "--seq-len", "1k", "--topology", "cpu:8"]) == 0


def test_model_names_from_files_are_printed_escaped(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GOOD_CONFIG, "_name_or_path": "evil\x1b[2J\x07name"}))
    assert main(["explain", "--model", str(path), "--seq-len", "1k", "--topology", "cpu:8"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "evil\\x1b[2J\\x07name" in out


# -- chip rows --------------------------------------------------------------------------------
CPU_ROW = json.loads((CHIP_DIR / "cpu.json").read_text())
NUMBER_FIELDS = [k for k, v in CPU_ROW.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
CHIP_CASES = [{**CPU_ROW, name: bad} for name in NUMBER_FIELDS for bad in ("5", None, -1, math.nan, math.inf)] + [
    {**CPU_ROW, "matmul_efficiency": 1.5},
    {**CPU_ROW, "matmul_efficiency": 0},
    {**CPU_ROW, "attention_efficiency": 0},
    {**CPU_ROW, "tensorcores_per_chip": 0},
    {**CPU_ROW, "devices_per_chip": 0},
    {**CPU_ROW, "torus_rank": 4},
    {**CPU_ROW, "devices_per_chip": 2.5},
    {**CPU_ROW, "core_link_bw_bytes_per_s": 0},
    {**CPU_ROW, "comm_overlaps_compute": "no"},
    {**CPU_ROW, "name": ""},
    {**CPU_ROW, "name": 3},
    {**CPU_ROW, "kind": "fpga"},
    {**CPU_ROW, "kind": ["cpu"]},
    {**CPU_ROW, "wraparound": "sometimes"},
    {**CPU_ROW, "host_collectives": [[1, 2]]},
    {**CPU_ROW, "host_collectives": {"all_gather": 5}},
    {**CPU_ROW, "host_collectives": {"all_gather": [1e9]}},
    {**CPU_ROW, "host_collectives": {"broadcast": [1e9, 1e-5]}},
    {**CPU_ROW, "host_collectives": {"all_gather": [-1e9, 1e-5]}},
    {**CPU_ROW, "host_collectives": {"all_gather": [1e9, math.nan]}},
    {**CPU_ROW, "sources": ["a"]},
    {**CPU_ROW, "extra_field": 1},
    {k: v for k, v in CPU_ROW.items() if k != "hbm_bw_bytes_per_s"},
    [CPU_ROW],
    None,
]


@pytest.mark.parametrize(
    "row",
    CHIP_CASES,
    ids=lambda r: repr({k: v for k, v in r.items() if CPU_ROW.get(k) != v} if isinstance(r, dict) else r)[:70],
)
def test_bad_chip_rows_are_refused(row, tmp_path, monkeypatch, capsys):
    (tmp_path / "cpu.json").write_text(json.dumps(row))  # NaN and Infinity as Python's json writes them
    monkeypatch.setenv(CHIP_DIR_ENV, str(tmp_path))
    line = refused(["explain", *PLAN], capsys)
    assert "cpu.json" in line


@pytest.mark.parametrize("where", ["missing", "file"])
def test_a_chip_dir_that_is_not_a_directory_is_refused(where, tmp_path, monkeypatch, capsys):
    path = tmp_path / "chips"
    if where == "file":
        path.write_text("{}")
    monkeypatch.setenv(CHIP_DIR_ENV, str(path))
    assert CHIP_DIR_ENV in refused(["explain", *PLAN], capsys)


# -- measured CSVs, MaxText logs and flags ----------------------------------------------------
HEADER = "model,topology,seq_len,global_batch,strategy,context,step_seconds"
CSV_CASES = [
    "",
    HEADER,
    "model,step_seconds\ntiny,1.0",
    HEADER + ",colour\ntiny,cpu:8,4k,1,ring,8,1.0,red",
    HEADER + "\ntiny,cpu:8,4k,1,ring,8",
    HEADER + "\ntiny,cpu:8,4k,1,ring,8,1.0,extra",
] + [
    HEADER + "\n" + row
    for row in (
        "tiny,cpu:8,4k,1,ring,8,-1",
        "tiny,cpu:8,4k,1,ring,8,0",
        "tiny,cpu:8,4k,1,ring,8,nan",
        "tiny,cpu:8,4k,1,ring,8,inf",
        "tiny,cpu:8,4k,1,ring,8,fast",
        "tiny,cpu:8,4k,1,ring,8,",
        "tiny,cpu:8,4x,1,ring,8,1.0",
        "tiny,cpu:8,0,1,ring,8,1.0",
        "tiny,cpu:8,4k,0,ring,8,1.0",
        "tiny,cpu:8,4k,1.5,ring,8,1.0",
        "tiny,cpu:8,4k,1,rign,8,1.0",
        "tiny,cpu:8,4k,1,ring,3,1.0",
        "tiny,cpu:8,4k,1,ring,-8,1.0",
        "nomodel,cpu:8,4k,1,ring,8,1.0",
        "tiny,v5p-7,4k,1,ring,8,1.0",
    )
]


@pytest.mark.parametrize("text", CSV_CASES, ids=lambda t: t.splitlines()[-1][:50] if t else "empty")
def test_bad_measured_csvs_are_refused(text, tmp_path, capsys):
    path = tmp_path / "measured.csv"
    path.write_text(text)
    refused(["validate", "--measured", str(path), "--out", str(tmp_path / "out"), "--no-plots"], capsys)


def test_a_measured_csv_takes_lengths_as_the_cli_does(tmp_path, capsys):
    path = tmp_path / "measured.csv"
    path.write_text(HEADER + "\ntiny,cpu:8,4k,1,ring,8,0.5\ntiny,cpu:8,4k,1,ulysses,8,-1\n")
    assert "measured.csv line 3" in refused(
        ["validate", "--measured", str(path), "--no-plots", "--out", str(tmp_path / "out")], capsys
    )


def test_a_measured_csv_without_mesh_columns_says_every_axis_was_taken_as_one(tmp_path, capsys):
    path = tmp_path / "measured.csv"
    path.write_text("model,topology,seq_len,global_batch,strategy,step_seconds\ntiny,cpu:8,4k,1,ring,0.5\n")
    says = refused(["validate", "--measured", str(path), "--no-plots", "--out", str(tmp_path / "out")], capsys)
    assert "has 1 devices but cpu:8 has 8 (the file gives no mesh columns, data, fsdp, context" in says


FLAGS = "model_name=tiny compile_topology=cpu:8 max_target_length=4096 per_device_batch_size=0.125"
LOG_CASES = [
    "",
    "completed step: 0, seconds: 1.0, TFLOP/s/device: 1.0",
    "completed step: 1, seconds: 1.2.3, TFLOP/s/device: 1.0",
    "completed step: 1, seconds: 0.0, TFLOP/s/device: 1.0",
    "completed step: 1, seconds: nan, TFLOP/s/device: 1.0",
    "completed step: 1, seconds: inf, TFLOP/s/device: 1.0",
]
GOOD_LOG = "completed step: 1, seconds: 1.0, TFLOP/s/device: 1.0"
FLAG_TEXT_CASES = [
    FLAGS + " model_name='tiny",
    FLAGS.replace("4096", "nan"),
    FLAGS.replace("4096", "1e400"),
    FLAGS.replace("0.125", "nan"),
    FLAGS.replace("0.125", "1e400"),
    FLAGS.replace("0.125", "-1"),
    FLAGS + " max_target_length=8192",
    FLAGS.replace("tiny", "nomodel"),
    FLAGS + " ici_context_parallelism=3",
    FLAGS + " sa_block_q=3",
    FLAGS + " context_parallel_strategy=rign",
    "x" * 5000,
    "/nonexistent/flags.txt",
]


@pytest.mark.parametrize(
    "log, flags", [(log, FLAGS) for log in LOG_CASES] + [(GOOD_LOG, f) for f in FLAG_TEXT_CASES], ids=lambda v: v[:50]
)
def test_bad_maxtext_logs_and_flags_are_refused(log, flags, tmp_path, capsys):
    path = tmp_path / "run.log"
    path.write_text(log)
    refused(
        ["validate", "--measured", str(path), "--maxtext-flags", flags, "--no-plots", "--out", str(tmp_path / "out")],
        capsys,
    )


def test_exported_flags_are_read_as_text_not_as_a_path(tmp_path, capsys):
    assert main(["export", "--model", "tiny", "--seq-len", "4k", "--topology", "v5p-8"]) == 0
    flags = capsys.readouterr().out.strip()
    log = tmp_path / "run.log"
    log.write_text(GOOD_LOG)
    assert (
        main(
            ["validate", "--measured", str(log), "--maxtext-flags", flags, "--no-plots", "--out", str(tmp_path / "out")]
        )
        == 0
    )
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["summary"]["plans_measured"] == 1


# -- Plan JSON and the API --------------------------------------------------------------------
def _good_plan() -> dict:
    from planner import api

    return api.plan("tiny", "4k", "cpu:8").to_dict()


PLAN_EDITS = [
    lambda p: p.pop("model"),
    lambda p: p.pop("mesh"),
    lambda p: p.update(colour="red"),
    lambda p: p.update(seq_len="4k"),
    lambda p: p.update(seq_len=-1),
    lambda p: p.update(seq_len=True),
    lambda p: p.update(global_batch=0),
    lambda p: p.update(block_q=3),
    lambda p: p.update(block_kv=100),
    lambda p: p.update(mesh=[1, 2]),
    lambda p: p.update(mesh={"kontext": 8}),
    lambda p: p.update(mesh={"context": "8"}),
    lambda p: p.update(mesh={"context": 3}),
    lambda p: p.update(cp_strategy="rign"),
    lambda p: p.update(remat=None),
    lambda p: p.update(axis_order="context"),
    lambda p: p.update(physical_order=[1]),
    lambda p: p.update(model=None),
    lambda p: p.update(model={"name": "x"}),
    lambda p: p["model"].update(hidden=-1),
    lambda p: p.update(topology=None),
    lambda p: p.update(compute_dtype="float7"),
    lambda p: p.update(loss_chunk_tokens=-1),
]


@pytest.mark.parametrize("edit", PLAN_EDITS)
def test_bad_plan_json_is_refused(edit):
    row = _good_plan()
    edit(row)
    with pytest.raises(CpplanError) as err:
        Plan.from_json(json.dumps(row))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["", "[", "null", "[]", "3", '"plan"', "[" * 100000])
def test_plan_json_that_is_not_an_object_is_refused(text):
    with pytest.raises(CpplanError):
        Plan.from_json(text)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(model=None),
        dict(topology=None),
        dict(seq_len=None),
        dict(mesh=[1]),
        dict(model=3),
        dict(seq_len=math.nan),
        dict(seq_len=-4096),
        dict(strategies=[]),
        dict(mesh={"context": 1.5}),
        dict(colour="red"),
    ],
)
def test_bad_api_arguments_are_refused(kwargs):
    from planner import api

    args = {"model": "tiny", "seq_len": "4k", "topology": "cpu:8", **kwargs}
    with pytest.raises(CpplanError):
        api.plan(args.pop("model"), args.pop("seq_len"), args.pop("topology"), **args)


@pytest.mark.parametrize(
    "flags",
    [
        {"model_name": "tiny", "compile_topology": "cpu:8", "max_target_length": math.nan},
        {"model_name": "tiny", "compile_topology": "cpu:8", "max_target_length": 1e400},
        {"model_name": "tiny", "compile_topology": "cpu:8", "per_device_batch_size": 1e400},
        {"base_emb_dim": 0, "compile_topology": "cpu:8"},
    ],
)
def test_bad_maxtext_dicts_are_refused(flags):
    with pytest.raises(CpplanError):
        plan_from_maxtext(flags)


# -- generated inputs -------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=12), st.integers(), st.floats(), st.none(), st.booleans()))
def test_any_sequence_length_is_tokens_or_a_cpplan_error(value):
    try:
        tokens = parse_seq_len(value)
    except CpplanError as err:
        assert "\n" not in str(err)
    else:
        assert isinstance(tokens, int) and tokens >= 1


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="context=,ulysestnr0123456789²- ", max_size=24))
def test_any_mesh_text_is_a_mesh_or_a_cpplan_error(text):
    from cli.args import mesh_sizes as _mesh

    try:
        mesh = _mesh(text)
    except CpplanError as err:
        assert "\n" not in str(err)
    else:
        assert all(isinstance(size, int) for size in mesh.values())


# -- the run's world, checked before any compile ----------------------------------------------
def test_a_run_directory_that_cannot_serve_the_run_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    assert "is a file" in refused(["run", *PLAN, "--run-dir", "afile"], capsys)
    (tmp_path / "run" / "checkpoints").parent.mkdir()
    (tmp_path / "run" / "checkpoints").write_text("x")
    assert "where the run keeps its checkpoints" in refused(["run", *PLAN, "--run-dir", "run"], capsys)
    (tmp_path / "old" / "checkpoints" / "4").mkdir(parents=True)
    assert "--no-resume" in refused(["run", *PLAN, "--run-dir", "old", "--no-resume"], capsys)


@pytest.mark.parametrize(
    "address, says",
    [
        ("nohost.invalid:1234", "does not resolve"),
        ("localhost:99999", "port from 1 to 65535"),
        (":1234", "HOST:PORT"),
        ("localhost:port", "HOST:PORT"),
        ("localhost:0", "port from 1 to 65535"),
    ],
)
def test_a_coordinator_that_cannot_be_reached_is_refused_before_anything_runs(address, says, capsys, tmp_path):
    argv = [
        "run",
        *PLAN,
        "--run-dir",
        str(tmp_path / "r"),
        "--coordinator",
        address,
        "--num-processes",
        "2",
        "--process-id",
        "1",
    ]
    assert says in refused(argv, capsys)


# -- MaxText flags: every word read or named, nothing guessed ---------------------------------
IMPORT_BASE = "compile_topology=v5p-8 model_name=llama3.1-8b "


@pytest.mark.parametrize(
    "flags, says",
    [
        (IMPORT_BASE + "ici_fsdp_parallelism 2", "written without '='"),
        (IMPORT_BASE + "max_target_length=9007199254740993", "beyond 2**53"),
        (IMPORT_BASE + "max_target_length=99999999999999999999999999", "beyond 2**53"),
        (IMPORT_BASE + "per_device_batch_size=1e300", "beyond 2**53"),
        (IMPORT_BASE + "--max_target_length=131072", "without dashes; write max_target_length=131072"),
        ("no-such-flags.txt", "is neither a file nor MaxText key=value flags"),
    ],
)
def test_maxtext_flags_are_never_guessed(flags, says, capsys):
    assert says in refused(["import", "--flags", flags], capsys)


def test_compile_refuses_a_host_topology_and_names_the_command_that_runs_it(capsys):
    says = refused(["compile", "--model", "tiny", "--seq-len", "4k", "--topology", "cpu:8"], capsys)
    assert "cpplan compile compiles for TPU slices" in says and "`cpplan run --topology cpu:8`" in says


def test_a_topology_given_beside_another_compile_topology_is_refused(capsys):
    says = refused(["import", "--flags", IMPORT_BASE, "--topology", "v5p-32"], capsys)
    assert "the topology given, v5p-32, is not the flags' compile_topology=v5p-8" in says
    assert main(["import", "--flags", IMPORT_BASE, "--topology", "v5p:2x2x1"]) == 0  # the same slice
    assert "not read (0)" in capsys.readouterr().out


def test_maxtext_words_that_are_not_flags_are_named_and_a_misfit_exits_1(capsys):
    assert main(["import", "--flags", "python -m train base.yml " + IMPORT_BASE + "per_device_batch_size=1"]) == 0
    out = capsys.readouterr().out
    assert "not read (4): python, -m, train, base.yml" in out
    assert main(["import", "--flags", IMPORT_BASE + "max_target_length=131072 per_device_batch_size=8"]) == 1
    assert "does not fit" in capsys.readouterr().out


def test_a_flags_file_that_is_not_text_is_refused(tmp_path, capsys):
    path = tmp_path / "flags.bin"
    path.write_bytes(bytes(range(256)))
    assert "not UTF-8 text" in refused(["import", "--flags", str(path)], capsys)


def test_a_measured_csv_with_a_byte_order_mark_is_read_and_one_with_a_column_twice_refused(tmp_path, capsys):
    from validation.measured import read_csv

    header = "model,topology,seq_len,global_batch,strategy,context,step_seconds"
    bom = tmp_path / "bom.csv"
    bom.write_bytes(("\ufeff" + header + "\ntiny,cpu:8,2k,1,ring,8,0.5\n").encode())
    assert [step.step_seconds for step in read_csv(bom)] == [0.5]
    twice = tmp_path / "twice.csv"
    twice.write_text(header + ",step_seconds\ntiny,cpu:8,2k,1,ring,8,0.5,0.7\n")
    assert "names step_seconds more than once" in refused(["validate", "--measured", str(twice)], capsys)


def test_a_config_with_a_huge_integer_is_refused_and_its_name_comes_from_the_config(tmp_path, capsys):
    path = tmp_path / "some-folder" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**GOOD_CONFIG, "hidden_size": 10**308}))
    assert "at most 2**31" in refused(
        ["explain", "--model", str(path), "--seq-len", "1k", "--topology", "cpu:8"], capsys
    )
    path.write_text(json.dumps({k: v for k, v in GOOD_CONFIG.items() if k != "_name_or_path"}))
    from cost_models.models import get_model

    assert get_model(str(path)).name != "some-folder"


def test_a_peer_whose_coordinator_never_answers_gives_up_after_its_join_timeout(tmp_path, capsys):
    import socket

    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    argv = ["run", *PLAN, "--run-dir", str(tmp_path / "r"), "--coordinator", f"localhost:{port}", "--num-processes"]
    line = refused([*argv, "2", "--process-id", "1", "--join-timeout", "1"], capsys)
    assert f"localhost:{port}" in line and "nothing answered there for 1 s" in line and "--join-timeout" in line


@pytest.mark.parametrize(
    "extra, says",
    [
        ({"sliding_window": 4096}, "attention: layers 2 sliding_window of 4096 tokens"),
        ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 512}, "1 sliding_window of 512"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding_window=None must be a positive integer"),
    ],
)
def test_a_windowed_attention_config_is_priced_by_its_window_or_refused(extra, says, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GOOD_CONFIG, **extra}))
    argv = ["explain", "--model", str(path), "--seq-len", "32k", "--topology", "v5p-16"]
    if "must be" in says:
        assert says in refused(argv, capsys)
    else:
        assert main(argv) == 0 and says in capsys.readouterr().out


def test_a_config_whose_window_is_off_or_null_is_priced_as_full_causal(tmp_path, capsys):
    from cost_models.models import get_model

    path = tmp_path / "config.json"
    for extra in ({"sliding_window": None}, {"sliding_window": 4096, "use_sliding_window": False}):
        path.write_text(json.dumps({**GOOD_CONFIG, **extra}))
        assert get_model(str(path)).causal and not get_model(str(path)).window
