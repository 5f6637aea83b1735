"""A user's slips are caught, and what they made is not replaced unasked: an empty item in a list
of lengths is refused in one line; `report` does not write over an HTML file it picked the name of."""

import json

import pytest

from cli import main

pytestmark = pytest.mark.pure


def _refused(argv, capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("lengths", ["128k,,1M", "2k,", ",2k", "2k, ,8k"])
def test_an_empty_item_in_seq_lens_is_refused(lengths, capsys):
    line = _refused(["sweep", "--model", "tiny", "--topology", "cpu:8", "--seq-lens", lengths], capsys)
    assert f"--seq-lens {lengths!r} has an empty item" in line
    assert capsys.readouterr().out == ""  # no table for the lengths that were there


def test_report_keeps_an_html_file_it_was_not_told_to_replace(tmp_path, capsys):
    saved, page = tmp_path / "explain.json", tmp_path / "explain.html"
    assert main(["explain", "--model", "tiny", "--seq-len", "2k", "--topology", "cpu:8", "--json"]) == 0
    saved.write_text(capsys.readouterr().out)
    page.write_text("the page explain --html drew")
    line = _refused(["report", str(saved)], capsys)
    assert str(page) in line and "exists already" in line and f"--html {page}" in line
    assert page.read_text() == "the page explain --html drew"
    assert main(["report", str(saved), "--html", str(page)]) == 0  # named: the user's to replace
    assert json.loads(saved.read_text())["best"]["summary"] in page.read_text()
