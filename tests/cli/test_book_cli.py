"""`cpplan book` at the command line: bad input is one line naming the value (exit 2), --json is strict JSON."""

import json

import pytest

from cli import main

pytestmark = pytest.mark.pure

BOOK = ["book", "--model", "llama3.1-8b", "--seq-len", "1M", "--chips", "v6e"]


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--tokens", "0"], "--tokens '0'"),
        (["--tokens", "100B", "--chips", "v5q"], "unknown chip 'v5q'"),
        (["--tokens", "100B", "--within=-3d"], "--within '-3d'"),
        (["--tokens", "100B", "--within", "2001-01-01"], "not after today"),
        (["--tokens", "100B", "--price", "v6e=0"], "positive number"),
        (["--tokens", "100B", "--price", "cpu=1"], "unknown chip 'cpu'"),
    ],
)
def test_bad_input_is_one_line(flags, named, capsys):
    assert main([*BOOK, *flags]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpplan: error: ") and named in lines[0], captured.err
    assert captured.out == ""


def test_json_names_the_price_used(capsys):
    assert main([*BOOK, "--tokens", "10B", "--price", "v6e=1.00", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["prices"]["v6e"]["kind"] == "given"
    assert all(s["price"]["per_chip_hour_usd"] == 1.0 for s in data["slices"])
