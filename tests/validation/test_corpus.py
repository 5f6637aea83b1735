"""The public corpus of measured runs, its reader and report, the per-chip error bands and the
ties `explain` marks with them."""

import csv
import json
import sys
from pathlib import Path

import cli_process
import pytest

from cost_models.accuracy import ErrorBand, error_band
from cost_models.errors import CpplanError
from cost_models.remat import offloaded_names
from cost_models.vocabulary import CPStrategy, LoadBalance, RematPolicy
from planner.estimate import estimate
from validation.corpus import CITATION_COLUMNS, CORPUS_COLUMNS, choices, compare_corpus, read_corpus, synthetic_shape

pytestmark = pytest.mark.pure
ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "benchmarks" / "public_runs.csv"
CP_CORPUS = ROOT / "benchmarks" / "public_cp_runs.csv"


@pytest.fixture(scope="module")
def runs():
    return {r.run_id: r for r in read_corpus(CORPUS)}


def test_corpus_covers_the_required_sources_each_cited_and_derived(runs):
    paths = {r.row["path"] for r in runs.values()}
    for needed in (
        "README.md",
        "MaxText/configs/v5p/README.md",
        "docs/reference/models/tiering.md",
        "training/v5p/Llama3.1-405B-MaxText/README.md",
        "training/trillium/Llama2-70B-MaxText/README.md",
    ):
        assert needed in paths
    assert any("Llama3.1-8B-MaxText" in p for p in paths) and any("Llama3.1-70B-MaxText" in p for p in paths)
    assert len(runs) >= 50
    for r in runs.values():
        assert all(r.row[c].strip() for c in CITATION_COLUMNS), r.run_id
        assert len(r.row["commit"]) == 40 and r.step_seconds > 0
        # every plan builds and prices (read_corpus built it; estimate refuses a plan that cannot run)
        assert estimate(r.plan).step_time_s > 0
    chips = {r.plan.topology_spec.chip.name for r in runs.values()}
    assert chips == {"v5e", "v5p", "v6e"}  # TPU7x and context-parallel runs are left out on purpose
    assert all(r.plan.cp_degree == 1 for r in runs.values())


def test_step_time_from_mfu_with_that_versions_flop_count(runs):
    # v5e table, 16B at 1x v5e-256: MFU 61.10% of 197 TFLOP/s; MaxText of Oct 2023: scale 16 over
    # base.yml (2560, 8 heads × 256, MLP 8192 relu, 16 layers, vocab 32768 tied) → emb 5120, 32 heads,
    # MLP 32768, 32 layers; 6 sequences of 2048 per device; attention counted at 12·H·L·d·S²·B
    params = 32768 * 5120 + 32 * (2 * 5120 * 256 * (32 + 32) + 2 * 5120 * 32768)
    flops = 6 * params * 2048 * 6 + 12 * 32 * 32 * 256 * 2048**2 * 6
    assert params == 16_273_899_520
    assert runs["v5e-16b-1x"].step_seconds == pytest.approx(flops / (0.6110 * 197e12), rel=1e-9)
    assert runs["v5e-16b-1x"].step_seconds == pytest.approx(10.6259, abs=1e-4)
    # the v5p table (Dec 2023) counts causal attention at half: 6·H·L·d·S²·B
    shape = synthetic_shape(
        {
            "global_parameter_scale": "32",
            "base_emb_dim": "2560",
            "base_num_heads": "8",
            "base_mlp_dim": "8192",
            "base_num_decoder_layers": "16",
            "head_dim": "256",
            "vocab_size": "32768",
            "mlp_activations": "relu",
            "logits_via_embedding": "true",
        }
    )
    assert (shape.emb, shape.heads, shape.mlp, shape.layers) == (10240, 32, 32768, 32)
    v5p = 6 * shape.params * 2048 * 8 + 6 * 32 * 32 * 256 * 2048**2 * 8
    assert runs["v5p-32b-1x128"].step_seconds == pytest.approx(v5p / (0.7147 * 459e12), rel=1e-9)


def test_step_time_from_tokens_per_second_and_logged_seconds(runs):
    # tiering.md: 692 tokens/s/device at 4 sequences of 4096 per device
    assert runs["v5p-llama2-70b-512chips"].step_seconds == pytest.approx(4 * 4096 / 692)
    # a logged step: its total_weights (tokens per step) must match the plan's sequences × length
    for run in runs.values():
        if run.row["metric"] == "seconds":
            logged = run.row["figure"]
            assert f"seconds: {run.row['value']}," in logged
            tokens = int(logged.split("total_weights: ")[1].split(",")[0])
            assert tokens == run.plan.global_batch * run.plan.seq_len, run.run_id
    llama2 = runs["v6e-llama2-70b-v6e-256"]
    assert llama2.step_seconds == 9.052 and llama2.plan.global_batch == 2 * 256


def test_runs_are_read_with_their_own_remat_and_what_cpplan_lacks_is_said(runs):
    # tpu-recipes' Llama 3.1 70B on v6e: remat_policy=custom, the layer input and q/k/v offloaded to the host
    offloading = runs["v6e-llama3.1-70b-v6e-32"].plan
    assert offloading.remat is RematPolicy.CUSTOM
    assert set(offloaded_names(offloading.remat, offloading.remat_custom)) >= {
        "decoder_layer_input",
        "query_proj",
        "key_proj",
        "value_proj",
    }
    assert runs["v5p-llama3.1-405b-v5p-1024"].plan.remat is not RematPolicy.FULL
    assert any("fsdp_transpose" in n for n in runs["v6e-llama2-70b-v6e-256"].notes)
    # its splash blocks of 2048 fit v6e's 32 MiB of scoped VMEM: priced at its own blocks, nothing to say
    v6e = runs["v6e-llama3.1-8b-v6e-256"]
    assert (v6e.plan.block_q, v6e.plan.block_kv) == (2048, 2048) and not any("VMEM" in n for n in v6e.notes)
    assert offloading.param_dtype == "bfloat16"


def _write(tmp_path, rows):
    path = tmp_path / "corpus.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, CORPUS_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _row(run_id, flags, seconds):
    return {
        "id": run_id,
        "maxtext_flags": flags,
        "maxtext_defaults": "",
        "metric": "seconds",
        "value": f"{seconds:.9g}",
        "peak_tflops": "",
        "flop_rule": "",
        "figure": f"seconds: {seconds}",
        "repository": "example/runs",
        "path": "log.txt",
        "commit": "0" * 40,
        "date": "2026-01-01",
        "derivation": "as logged",
        "notes": "",
    }


def test_report_on_a_tiny_corpus(tmp_path):
    flags = [
        "model_name=llama3.1-8b per_device_batch_size=1 max_target_length=8192 compile_topology=v5p-16",
        "model_name=llama3.1-8b per_device_batch_size=1 max_target_length=8192 compile_topology=v5p-16 "
        "ici_fsdp_parallelism=4 ici_tensor_parallelism=2",
        "model_name=llama3.1-8b per_device_batch_size=2 max_target_length=4096 compile_topology=v5p-16",
    ]
    path = _write(tmp_path, [_row(f"r{i}", f, 1.0) for i, f in enumerate(flags)])
    predicted = [r.predicted.step_time_s for r in compare_corpus(read_corpus(path)).results]
    # measured 10% slower, 20% faster and exact: MAPE (0.1/1.1 + 0.2/0.8 + 0) / 3
    factors = (1.1, 0.8, 1.0)
    path = _write(tmp_path, [_row(f"r{i}", f, p * k) for i, (f, p, k) in enumerate(zip(flags, predicted, factors))])
    report = compare_corpus(read_corpus(path))
    s = report.summary()
    assert s["mape"] == pytest.approx((0.1 / 1.1 + 0.2 / 0.8) / 3, rel=1e-6)
    assert s["max_abs_error"] == pytest.approx(0.25, rel=1e-6)
    assert s["within_15pct"] == 2 and s["worst"][0]["run"] == "r1"
    order = sorted(range(3), key=lambda i: report.results[i].predicted.mfu)
    # measured MFU in the same order as predicted → 1; in the reverse order → −1
    times = {i: 1.0 + 0.1 * rank for rank, i in enumerate(reversed(order))}
    path = _write(
        tmp_path,
        [_row(f"r{i}", f, times[i] * report.results[i].predicted.model_flops / 1e15) for i, f in enumerate(flags)],
    )
    assert compare_corpus(read_corpus(path)).summary()["spearman_mfu"] == pytest.approx(1.0)
    times = {i: 1.0 + 0.1 * rank for rank, i in enumerate(order)}
    path = _write(
        tmp_path,
        [_row(f"r{i}", f, times[i] * report.results[i].predicted.model_flops / 1e15) for i, f in enumerate(flags)],
    )
    assert compare_corpus(read_corpus(path)).summary()["spearman_mfu"] == pytest.approx(-1.0)
    assert "| r1 |" in report.markdown(plots=False)


def test_a_row_without_its_citation_is_refused(tmp_path):
    row = _row(
        "r0", "model_name=llama3.1-8b per_device_batch_size=1 max_target_length=8192 compile_topology=v5p-16", 1.0
    )
    row["commit"] = ""
    with pytest.raises(CpplanError, match="line 2 .*commit"):
        read_corpus(_write(tmp_path, [row]))


def test_error_bands_per_chip_and_regime():
    v5p, tpu7x = error_band("v5p", context_parallel=False), error_band("tpu7x", context_parallel=False)
    assert v5p.basis == "corpus" and v5p.runs >= 10 and 0 < v5p.relative < 1
    assert "without context parallelism" in v5p.describe()
    assert tpu7x.basis == "kernels" and tpu7x.runs > 0 and "kernel" in tpu7x.describe()
    assert error_band("cpu", context_parallel=False) is None
    # context-parallel plans: v5p's band is its CP test set's, one run per row of the CSV
    cp = error_band("v5p", context_parallel=True)
    cp_rows = [r for r in read_corpus(CP_CORPUS) if r.plan.topology_spec.chip.name == "v5p"]
    assert cp.basis == "cp_corpus" and cp.runs == len(cp_rows) >= 30 and cp.regime == "context-parallel"
    assert "context-parallel v5p runs" in cp.describe()
    # a chip without published CP runs falls back to its other band and says the CP terms are unchecked
    tpu7x_cp = error_band("tpu7x", context_parallel=True)
    assert tpu7x_cp.basis == "kernels" and "context-parallel terms are unchecked" in tpu7x_cp.describe()


def test_the_cp_test_set_reads_every_run_as_a_context_parallel_plan_of_its_flags():
    runs = read_corpus(CP_CORPUS)
    assert len(runs) == 30  # two PRs' tables: 5 plans at 3 lengths each, with and without load balancing
    by_id = {r.run_id: r for r in runs}
    unbalanced = by_id["v5p-64-llama3-8b-256k-ring-no-lb"]
    assert unbalanced.plan.load_balance is LoadBalance.NONE and unbalanced.step_seconds == 15.35
    usp = by_id["v5p-64-llama3-8b-64k-usp16x4"].plan
    assert (usp.cp_strategy, usp.mesh_dict["context"], usp.mesh_dict["context_ulysses"]) == (CPStrategy.USP, 16, 4)
    ring = by_id["v5p-64-llama3-8b-256k-ring"].plan
    assert (ring.cp_strategy, ring.mesh_dict["context"], ring.seq_len, ring.global_batch) == (
        CPStrategy.RING,
        64,
        262144,
        1,
    )
    assert ring.topology_spec.num_devices == 64 and ring.load_balance is LoadBalance.ZIGZAG
    assert by_id["v5p-64-llama3-8b-128k-all_gather"].step_seconds == 2.98
    assert all(r.plan.cp_strategy is not CPStrategy.NONE for r in runs)


def test_choices_compare_the_first_ranked_plan_with_the_fastest_measured(tmp_path):
    # two plans of one case: the one cpplan ranks first is published 30% slower than the other,
    # so its choice measured 30% over the fastest and the ranks disagree; a lone run makes no case
    flags = (
        "model_name=llama3.1-8b per_device_batch_size=1 max_target_length=131072 compile_topology=v5p-16 "
        "ici_fsdp_parallelism=1 context_parallel_load_balance=True"
    )
    plans = {
        "ag": flags + " ici_context_parallelism=8 context_parallel_strategy=all_gather",
        "ring": flags + " ici_context_parallelism=8 context_parallel_strategy=ring use_tokamax_splash=True",
    }
    priced = {
        k: estimate(read_corpus(_write(tmp_path, [_row(k, plans[k], 1.0)]))[0].plan, target="maxtext").step_time_s
        for k in plans
    }
    first = min(plans, key=priced.get)
    other = next(k for k in plans if k != first)
    slow = max(priced.values())  # measured times a chip can reach
    rows = [
        _row(first, plans[first], 1.3 * slow),
        _row(other, plans[other], 1.0 * slow),
        _row("alone", flags.replace("131072", "65536") + " ici_context_parallelism=8", slow),
    ]
    [choice] = choices(compare_corpus(read_corpus(_write(tmp_path, rows))))
    assert (choice.chosen, choice.fastest, choice.runs) == (first, other, 2)
    assert choice.regret == pytest.approx(0.3) and choice.spearman == pytest.approx(-1.0)


def test_alternatives_within_the_band_are_ties_and_the_rest_are_not(monkeypatch):
    import planner.explanation as explanation
    from planner import explain

    result = explain("llama3.1-8b", 131072, "v5p-16", global_batch_tokens=131072)
    best = result.estimate.step_time_s
    alts = result.alternatives
    gaps = [a.estimate.step_time_s / best - 1 for a in alts]
    assert gaps[0] < gaps[-1]
    band = (gaps[0] + gaps[1]) / 2  # the first alternative lies within it, the last does not
    monkeypatch.setattr(
        explanation,
        "plan_error_band",
        lambda plan, target: ErrorBand(plan.topology_spec.chip.name, band, "corpus", 3, "test", True),
    )
    data = result.to_dict()
    assert data["alternatives"][0]["tie"] and not data["alternatives"][-1]["tie"]
    assert data["ties"] == sum(r.estimate.step_time_s <= best * (1 + band) for r in result.result.ranked[1:])
    assert data["error_band"]["relative"] == band
    text = str(result).split("Alternatives", 1)[1].split("Best of each", 1)[0].strip().splitlines()[1:]
    assert f"tie within ±{band:.1%}" in text[0] and "tie within" not in text[-1]
    breakers = data["alternatives"][0]["tie_breakers"]
    assert {"headroom_bytes", "exposed_s", "maxtext_runs"} <= set(breakers)
    assert result.best == result.result.ranked[0].plan  # the choice stays as the search ranks it


def test_cli_validates_the_corpus(tmp_path):
    out = tmp_path / "report"
    done = cli_process.run(
        [sys.executable, "-m", "cli", "validate", "--measured", str(CORPUS), "--out", str(out), "--no-plots"],
        "the end of validate",
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    with open(CORPUS, newline="") as f:
        assert report["summary"]["runs"] == len(list(csv.DictReader(f)))
    assert report["mape"] > 0 and set(report["summary"]["per_chip"]) == {"v5e", "v5p", "v6e"}
    assert "Spearman" in (out / "report.md").read_text()
