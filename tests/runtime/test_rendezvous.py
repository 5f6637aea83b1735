"""The processes of a run meet on the coordinator's port before jax joins them: process 0 lets them
on once every one has come, and a peer that never comes, a process count that differs or an id given
twice ends each process present with one line (jax's own wait would abort the process)."""

import socket
import threading

import pytest

from cost_models.errors import CpplanError
from runtime.rendezvous import gather, join

pytestmark = pytest.mark.pure


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _in_thread(call) -> tuple[threading.Thread, list]:
    """Runs `call()` in a thread; the list gets its result, or the error it raised."""
    out = []

    def run():
        try:
            out.append(call())
        except CpplanError as err:
            out.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_process_0_waits_for_every_peer_then_lets_them_on():
    port = _free_port()
    where = f"localhost:{port}"
    thread, process_0 = _in_thread(lambda: gather(where, port, 3, timeout_s=60))
    peers = [_in_thread(lambda i=i: join(where, "localhost", port, i, 3, timeout_s=60)) for i in (2, 1)]
    for t, _ in [(thread, None), *peers]:
        t.join(90)
    assert process_0 == [None] and [out for _, out in peers] == [[None], [None]]
    with socket.create_server(("", port)):  # the port is free again, for jax's service
        pass


def _knock(port: int) -> None:
    """Connects to the port once process 0 listens, and leaves saying nothing, as a peer's
    reachability check does: such a connection is no peer."""
    for _ in range(100):
        try:
            socket.create_connection(("localhost", port), timeout=1).close()
            return
        except OSError:
            threading.Event().wait(0.02)


def test_a_peer_that_never_comes_ends_process_0_with_one_line():
    port = _free_port()
    threading.Thread(target=_knock, args=(port,), daemon=True).start()
    with pytest.raises(CpplanError) as refused:
        gather(f"localhost:{port}", port, 2, timeout_s=1)
    line = str(refused.value)
    assert "\n" not in line
    assert f"--coordinator 'localhost:{port}': process(es) 1 of 2 never joined in 1 s (there: 0)" in line
    assert "--join-timeout" in line


def test_a_peer_with_another_process_count_stops_both_with_one_line_each():
    port = _free_port()
    where = f"localhost:{port}"
    thread, process_0 = _in_thread(lambda: gather(where, port, 2, timeout_s=60))
    with pytest.raises(CpplanError) as peer:
        join(where, "localhost", port, 1, 3, timeout_s=60)
    thread.join(90)
    said = "process 1 was started with --num-processes 3, process 0 with 2; give all the same"
    assert said in str(peer.value) and said in str(process_0[0])


def test_a_peer_whose_process_0_gathers_no_more_is_told_why():
    port = _free_port()
    where = f"localhost:{port}"
    thread, process_0 = _in_thread(lambda: gather(where, port, 3, timeout_s=2))
    with pytest.raises(CpplanError, match=r"process 0 waited 2 s and process\(es\) \[2\] never came"):
        join(where, "localhost", port, 1, 3, timeout_s=60)
    thread.join(90)
    assert "process(es) 2 of 3 never joined in 2 s (there: 0, 1)" in str(process_0[0])
