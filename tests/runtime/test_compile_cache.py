"""The persistent compilation cache's bound: what `prune` removes and what it keeps, and the bound's setting."""

import os

import pytest

from cost_models.errors import CpplanError
from runtime.compile_cache import DEFAULT_MAX_SIZE_BYTES, MAX_SIZE_ENV, max_size_bytes, prune

pytestmark = pytest.mark.pure


def _program(where, key, size, read_at, *, read_record=False):
    """A cache entry of `size` bytes last read at `read_at` (seconds), as jax names it."""
    path = where / f"{key}-cache"
    path.write_bytes(b"x" * size)
    os.utime(path, (read_at, read_at))
    if read_record:  # written where jax bounds the cache itself
        (where / f"{key}-atime").write_bytes(b"\0" * 8)
    return path


def test_prune_removes_the_programs_read_least_recently_until_the_rest_fit(tmp_path):
    _program(tmp_path, "old", 400, 1_000, read_record=True)
    _program(tmp_path, "older", 300, 500)
    _program(tmp_path, "new", 500, 3_000)
    _program(tmp_path, "mid", 200, 2_000)
    (tmp_path / ".lockfile").write_bytes(b"")
    # 1400 bytes held; to fit 800 the two read least recently go (older 300, then old 400): 700 left
    assert prune(tmp_path, 800) == (2, 700)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lockfile", "mid-cache", "new-cache"]
    # within the bound nothing more goes, and a bound of 0 empties it
    assert prune(tmp_path, 700) == (0, 0)
    assert prune(tmp_path, 0) == (2, 700)
    assert [p.name for p in tmp_path.iterdir()] == [".lockfile"]


def test_a_program_read_after_it_was_written_counts_as_read_then(tmp_path):
    first = _program(tmp_path, "first", 100, 1_000)
    _program(tmp_path, "second", 100, 2_000)
    os.utime(first, (3_000, 1_000))  # read at 3000, written at 1000
    assert prune(tmp_path, 100) == (1, 100)
    assert [p.name for p in tmp_path.iterdir()] == ["first-cache"]


def test_no_bound_and_no_directory_remove_nothing(tmp_path):
    _program(tmp_path, "a", 100, 1_000)
    assert prune(tmp_path, -1) == (0, 0)
    assert prune(tmp_path / "none", 0) == (0, 0)
    assert [p.name for p in tmp_path.iterdir()] == ["a-cache"]


def test_the_bound_is_the_variables_where_set(monkeypatch):
    monkeypatch.delenv(MAX_SIZE_ENV, raising=False)
    assert max_size_bytes() == DEFAULT_MAX_SIZE_BYTES == 10 * 2**30
    monkeypatch.setenv(MAX_SIZE_ENV, "-1")
    assert max_size_bytes() == -1
    monkeypatch.setenv(MAX_SIZE_ENV, "5000")
    assert max_size_bytes() == 5000
    for bad in ("10G", "-2"):
        monkeypatch.setenv(MAX_SIZE_ENV, bad)
        with pytest.raises(CpplanError, match=rf"\${MAX_SIZE_ENV}='{bad}' is not a size.*-1 for no bound"):
            max_size_bytes()
