"""The HTML reports in a real browser (headless Chromium): the six target reports open offline
with no console error and no network request, draw every figure, and show the chosen plan's label and
figures. Each page's screenshot is kept under the folder the test prints (CPPLAN_SCREENSHOTS, or
pytest's temporary directory). Skipped, with the reason, where Chromium cannot run."""

import json
import os
import sys
from pathlib import Path

import pytest

from cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from browser import chromium, driver, open_page  # noqa: E402

pytestmark = pytest.mark.pure

TESTDATA = Path(__file__).resolve().parents[1] / "testdata"
LLAMA = ["--model", "llama3.1-8b"]
REPORTS = {
    "explain-4M-v5p-256": ["explain", *LLAMA, "--seq-len", "4M", "--topology", "v5p-256"],
    "explain-1M-tpu7x-128": ["explain", *LLAMA, "--seq-len", "1M", "--topology", "tpu7x-128"],
    "explain-1M-2xv5p-128": ["explain", *LLAMA, "--seq-len", "1M", "--topology", "v5p-128", "--num-slices", "2"],
    "sweep-tpu7x-2x2x4": ["sweep", *LLAMA, "--topology", "tpu7x:2x2x4", "--seq-lens", "128k,512k,1M,4M"],
    "validate-tiny-cpu8": None,  # drawn from the saved report.json of a real `cpplan validate` run
    "book-1M-100B-30d": ["book", *LLAMA, "--seq-len", "1M", "--tokens", "100B", "--within", "30d"],
}


@pytest.fixture(scope="module")
def browser():
    binary, why = chromium()
    if binary is None:
        pytest.skip(f"no headless browser: {why}")
    session = driver(binary)
    yield session
    session.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = Path(os.environ.get("CPPLAN_SCREENSHOTS") or tmp_path_factory.mktemp("report-screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nreport screenshots: {folder}")
    return folder


def expected_text(name: str, argv, capsys) -> list[str]:
    """What the page must show: the chosen plan's label and figures, as the JSON has them."""
    if argv is None:
        d = json.loads((TESTDATA / "validate_tiny_cpu8_report.json").read_text())
        return [d["title"], f"step-time MAPE {d['mape']:.1%}", d["plans"][0]["label"]]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    if name.startswith("book"):
        return [d["verdict"], *(s["topology"] for s in d["slices"])]
    if name.startswith("sweep"):
        best = [r for r in d if r["fits"]][-1]
        return [best["plan"], f"{best['mfu']:.1%}"]
    return [f"Chosen plan: {d['best']['summary']}", f"MFU {d['best']['estimate']['mfu']:.1%}"]


@pytest.mark.parametrize("name", REPORTS)
def test_report_renders_offline_without_console_errors(name, browser, shots, tmp_path, capsys):
    argv, page = REPORTS[name], tmp_path / f"{name}.html"
    wanted = expected_text(name, argv, capsys)
    if argv is None:
        argv = ["report", str(TESTDATA / "validate_tiny_cpu8_report.json")]
    assert main([*argv, "--html", str(page)]) == 0
    capsys.readouterr()
    seen = open_page(browser, page, shots / f"{name}.png")
    assert seen.errors == []
    assert seen.requests == [page.resolve().as_uri()]  # nothing fetched beyond the file itself
    assert seen.figures >= {"sweep": 1, "report": 1, "book": 2}.get(argv[0], 3)
    text = " ".join(seen.text.split())
    for phrase in wanted:
        assert " ".join(phrase.split()) in text, phrase
    assert (shots / f"{name}.png").stat().st_size > 20_000
