"""`--html` on explain, sweep and validate, and `cpplan report FILE.json`: each writes one
self-contained page; a path that cannot be written, JSON of another kind and a report with nothing to
draw are refused in one line naming the value and the fix, before any work."""

import json
import shutil
from pathlib import Path

import pytest

from cli import main

pytestmark = pytest.mark.pure

VALIDATE_JSON = Path(__file__).resolve().parents[1] / "testdata" / "validate_tiny_cpu8_report.json"
EXPLAIN = ["explain", "--model", "llama3.1-8b", "--seq-len", "128k", "--topology", "v5p-16"]


def refused(argv, capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_explain_html_is_one_offline_file_with_the_chosen_plan(tmp_path, capsys):
    assert main([*EXPLAIN, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert main([*EXPLAIN, "--html", str(tmp_path / "e.html")]) == 0
    page = (tmp_path / "e.html").read_text()
    assert d["best"]["summary"] in page and "<script src=" not in page and "<link " not in page
    assert page.count("Plotly.newPlot") == 3 and "Where the mesh lies on v5p:2x2x2" in page


def test_report_draws_a_saved_json_beside_it(tmp_path, capsys):
    saved = tmp_path / "sweep.json"
    assert main(["sweep", "--model", "tiny", "--topology", "cpu:8", "--seq-lens", "2k,8k", "--json"]) == 0
    saved.write_text(capsys.readouterr().out)
    assert main(["report", str(saved)]) == 0
    assert "MFU of each strategy" in (tmp_path / "sweep.html").read_text()
    shutil.copy(VALIDATE_JSON, tmp_path / "report.json")
    assert main(["report", str(tmp_path / "report.json"), "--html", str(tmp_path / "v.html")]) == 0
    assert "Predicted against measured" in (tmp_path / "v.html").read_text()


def test_refusals(tmp_path, capsys):
    line = refused([*EXPLAIN, "--html", str(tmp_path / "missing" / "e.html")], capsys)
    assert "does not exist" in line and "missing" in line
    line = refused([*EXPLAIN, "--html", str(tmp_path)], capsys)
    assert "is a directory" in line
    other = tmp_path / "plan.json"
    assert main(["export", "--format", "json", *EXPLAIN[1:]]) == 0
    other.write_text(capsys.readouterr().out)
    line = refused(["report", str(other)], capsys)
    assert "not the JSON of `cpplan explain --json`" in line and "plan.json" in line
    (tmp_path / "bad.json").write_text("{")
    assert "is not JSON" in refused(["report", str(tmp_path / "bad.json")], capsys)
    nothing = ["explain", "--model", "llama3.1-70b", "--seq-len", "4M", "--topology", "v5p-16"]
    line = refused([*nothing, "--html", str(tmp_path / "n.html")], capsys)
    assert "no plan fits, so there is no plan to draw" in line and not (tmp_path / "n.html").exists()


def test_book_html_has_a_point_per_slice_and_the_deadline(tmp_path, capsys):
    from validation.html_report.book import days_figure, front_figure

    argv = ["book", "--model", "llama3.1-8b", "--seq-len", "1M", "--tokens", "100B", "--within", "30d"]
    argv += ["--chips", "v6e"]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert main([*argv, "--html", str(tmp_path / "b.html")]) == 0
    page = (tmp_path / "b.html").read_text()
    assert d["verdict"] in page and "<script src=" not in page and page.count("Plotly.newPlot") == 2
    days = days_figure(d)
    points = {(x, y) for trace in days["data"] for x, y in zip(trace["x"], trace["y"])}
    assert points == {(s["chips"], s["days"]) for s in d["slices"]}  # every slice, priced or not
    assert [(s["y0"], s["y1"]) for s in days["layout"]["shapes"]] == [(30.0, 30.0)]
    front = front_figure(d)
    assert [(s["x0"], s["x1"]) for s in front["layout"]["shapes"]] == [(30.0, 30.0)]
    assert sum(len(t["x"]) for t in front["data"][:-1]) == sum(s["cost_usd"] is not None for s in d["slices"])
    for s in d["slices"]:
        assert s["topology"] in page
