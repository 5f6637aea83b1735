"""Process 0 of a two-process run whose peer never starts ends with one line and exit status 2 after
--join-timeout, not with jax's abort (a C++ check failure, status 134)."""

import socket

import pytest
from cli_process import cpplan, finish

pytestmark = pytest.mark.cpu_mesh


def test_process_0_without_its_peer_gives_up_after_its_join_timeout_in_one_line(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    proc = cpplan(
        *("run", "--model", "tiny", "--seq-len", "1k", "--topology", "cpu:8", "--steps", "2"),
        *("--run-dir", str(tmp_path / "run"), "--coordinator", f"localhost:{port}"),
        *("--num-processes", "2", "--process-id", "0", "--join-timeout", "3"),
        cwd=tmp_path,
    )
    _, stderr = finish(proc, "process 0's exit")
    assert proc.returncode == 2, (proc.returncode, stderr[-3000:])
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("cpplan: note:")]
    assert len(lines) == 1 and "Check failure" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert lines[0] == (
        f"cpplan: error: --coordinator 'localhost:{port}': process(es) 1 of 2 never joined in 3 s (there: 0); "
        "start each with --process-id, the same --coordinator and --num-processes 2, or wait longer with "
        "--join-timeout."
    )
