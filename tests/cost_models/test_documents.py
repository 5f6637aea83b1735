"""Packed documents of varying length in the request: the forms `--doc-lengths` and the API take, their
errors, their JSON round trip, the renewal chances the price rests on, and the price itself: the expected
tiles where the kernel prunes by segment ids (cpplan's runtime, MaxText's ulysses), whole rows where it
does not (MaxText's other strategies)."""

import dataclasses
import json

import numpy as np
import pytest
from scipy import integrate, stats

from cli import main
from cost_models.documents import histogram, lognormal, read_histogram
from cost_models.errors import CpplanError
from cost_models.flops import model_flops_per_step
from cost_models.models import MODELS, ModelSpec
from planner import Plan, explain
from planner.options import parse_doc_lengths

pytestmark = pytest.mark.pure

LLAMA = MODELS["llama3.1-8b"]
ULYSSES_MAXTEXT = dict(strategies=["ulysses"], target="maxtext", mesh=dict(context_ulysses=2))


def test_the_forms_of_doc_lengths(tmp_path):
    assert parse_doc_lengths("8k") == 8192  # a fixed length stays an int: aligned documents, a static mask
    assert parse_doc_lengths("lognormal:8k:1.5") == lognormal(8192, 1.5)
    path = tmp_path / "lengths.csv"
    path.write_text("# length,count\n100,3\n\n250 2\n100\n")
    assert parse_doc_lengths(f"@{path}") == histogram([100, 250], [4, 2], source="lengths.csv")
    assert read_histogram(path).mean_tokens == pytest.approx((4 * 100 + 2 * 250) / 6)


@pytest.mark.parametrize(
    "text, match",
    [
        ("lognormal:8k", "lognormal:MEAN:SIGMA"),
        ("lognormal:8k:0", "sigma=0.0 .* above 0"),
        ("lognormal:8k:9", "at most 3.0"),
        ("lognormal:0:1", "must be at least 1 token"),
        ("gamma:8k:1", "not one of the forms"),
        ("@no-such-file.csv", "cannot read the histogram"),
    ],
)
def test_bad_doc_lengths_name_the_value_and_the_rule(text, match):
    with pytest.raises(CpplanError, match=match):
        parse_doc_lengths(text)


def test_a_bad_histogram_line_is_named(tmp_path):
    path = tmp_path / "h.txt"
    path.write_text("100,2\n3k,1\n")
    with pytest.raises(CpplanError, match="line 2: '3k,1' is not one document length"):
        read_histogram(path)
    with pytest.raises(CpplanError, match="count 0: each must be a positive whole number"):
        histogram([100], [0])


@pytest.mark.parametrize("documents", [8192, lognormal(8192, 1.0), histogram([100, 4000], [5, 1], source="h.csv")])
def test_models_and_plans_round_trip_through_json(documents):
    model = dataclasses.replace(LLAMA, documents=documents)
    assert ModelSpec.from_dict(json.loads(json.dumps(model.to_dict()))) == model
    plan = explain(model, "64k", "v5p-16", **ULYSSES_MAXTEXT).best
    assert Plan.from_json(plan.to_json()) == plan


def test_unbroken_is_the_renewal_chance():
    # documents of 10 or 30 tokens (one each): mean 20; after a token no start within 5 positions:
    # E[(X − 5)⁺] / E[X] = (5 + 25) / 2 / 20
    assert histogram([10, 30]).unbroken(5) == pytest.approx(0.75)
    assert histogram([10, 30]).unbroken(np.array([0, 30, 99])).tolist() == [1.0, 0.0, 0.0]
    docs = lognormal(700, 1.3)
    dist = stats.lognorm(s=1.3, scale=700 * np.exp(-(1.3**2) / 2))
    for gap in (1.0, 300.0, 5000.0):
        tail, _ = integrate.quad(dist.sf, gap, np.inf)
        assert docs.unbroken(gap) == pytest.approx(tail / 700, rel=1e-6)
    # documents of one length D at random offsets: a query sees on average (D + 1) / 2 keys, the row's edge aside
    assert histogram([64]).keys_seen(1 << 16) == pytest.approx(65 / 2, rel=1e-3)


def test_model_flops_count_keys_within_documents():
    flops = [model_flops_per_step(dataclasses.replace(LLAMA, documents=d), 1 << 17, 1) for d in (0, lognormal(8192, 1))]
    assert flops[1] < flops[0]


def attention_s(model, target="maxtext", strategy="ulysses"):
    e = explain(model, "64k", "v5p-16", strategies=[strategy], target=target, mesh=dict(context_ulysses=2))
    return e.estimate.compute_s["attention"], e


def test_maxtext_ulysses_prices_the_tiles_left_and_says_so():
    whole, _ = attention_s(LLAMA)
    packed, e = attention_s(dataclasses.replace(LLAMA, documents=lognormal(4096, 1.0)))
    assert packed < 0.6 * whole
    docs = e.documents
    assert docs["prunes"] and 0 < docs["computed_fraction"] < 0.5
    line = next(line for line in str(e).splitlines() if line.startswith("attention: rows packed"))
    assert "lognormal document lengths (mean 4K tokens, sigma 1)" in line
    assert "skips the tiles whose documents do not meet" in line
    assert f"saving {1 - docs['computed_fraction']:.1%}" in line
    assert json.loads(e.to_json())["documents"]["computed_fraction"] == pytest.approx(docs["computed_fraction"])


@pytest.mark.parametrize("strategy,mesh", [("ulysses", dict(context_ulysses=2)), ("ring", dict(context=2))])
def test_cpplans_runtime_prices_the_tiles_left_under_every_strategy(strategy, mesh):
    packed = dataclasses.replace(LLAMA, documents=lognormal(4096, 1.0))
    e, unpacked = (explain(m, "64k", "v5p-16", strategies=[strategy], mesh=mesh) for m in (packed, LLAMA))
    assert e.estimate.compute_s["attention"] < 0.6 * unpacked.estimate.compute_s["attention"]
    assert e.documents["prunes"]
    assert f"{strategy}'s kernel (cpplan's runtime) skips the tiles whose documents do not meet" in str(e)


def test_maxtexts_ring_computes_whole_rows_and_says_so():
    e = explain(
        dataclasses.replace(LLAMA, documents=lognormal(4096, 1.0)),
        "64k",
        "v5p-16",
        strategies=["ring"],
        target="maxtext",
        mesh=dict(context=2),
    )
    unpacked = explain(LLAMA, "64k", "v5p-16", strategies=["ring"], target="maxtext", mesh=dict(context=2))
    assert e.estimate.compute_s["attention"] == unpacked.estimate.compute_s["attention"]
    assert not e.documents["prunes"]
    assert "under ring its kernel skips blocks by the static mask only" in str(e)


def test_the_cli_takes_each_form(tmp_path, capsys):
    path = tmp_path / "lengths.csv"
    path.write_text("1000,3\n9000,1\n")
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.array(([7] * 300 + [0]) * 40, dtype=np.uint16))  # 40 documents of 301 tokens
    flags = ["--model", "small", "--seq-len", "4k", "--topology", "v5p:2x2x1", "--json"]
    for form, extra in (("lognormal:1k:1", []), (f"@{path}", []), ("data", ["--data", str(tokens), "--eos-id", "0"])):
        assert main(["explain", *flags, "--doc-lengths", form, *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        assert 0 < out["documents"]["computed_fraction"] <= 1 and out["documents"]["prunes"] is True
    measured = {"kind": "histogram", "lengths": [301], "counts": [40], "source": "tokens.npy (measured)"}
    assert out["documents"]["lengths"] == measured
    assert main(["explain", *flags, "--doc-lengths", "data"]) == 2
    assert "--doc-lengths data measures the documents of --data" in capsys.readouterr().err
    assert main(["explain", *flags, "--doc-lengths", "data", "--data", str(tokens), "--eos-id", "99999"]) == 2
    assert "eos_id 99999 does not occur in the first 12040 tokens" in capsys.readouterr().err


@pytest.mark.parametrize(
    "strategy, mesh, balance",
    [
        ("all_gather", {"context": 8}, "none"),
        ("all_gather", {"context": 8}, "zigzag"),
        ("ring", {"context": 8}, "none"),
        ("ring", {"context": 8}, "zigzag"),
        ("ulysses", {"context_ulysses": 8}, "none"),
        ("usp", {"context": 2, "context_ulysses": 4}, "none"),
    ],
)
def test_documents_no_row_cuts_cost_what_the_unpacked_row_costs(strategy, mesh, balance):
    """Every strategy prices a rank's own queries against the keys before them: with documents far longer
    than the row (almost never cut), each costs its unpacked price, the busiest rank's in natural order."""
    from planner import evaluate

    def attention_s(model):
        e = evaluate(model, 131072, "v5p-16", strategy=strategy, mesh=mesh, global_batch=1, load_balance=balance)
        return e.compute_s["attention"]

    endless = dataclasses.replace(LLAMA, documents=histogram([1 << 30], [1]))
    assert attention_s(endless) == pytest.approx(attention_s(LLAMA), rel=0.01)
    cut = dataclasses.replace(LLAMA, documents=histogram([8192], [1]))
    assert attention_s(cut) < attention_s(LLAMA) / 4
