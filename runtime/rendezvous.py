"""The processes of a run meet on the coordinator's port before jax joins them: jax's coordination
client aborts the process (a C++ check failure) when a peer never registers, so process 0 first waits
for every peer here, where a missing one is a one-line error, and only then starts jax's service.

Sockets only (no jax). Each peer sends `cpplan-join ID COUNT`; process 0 answers `go` once all have,
or `stop REASON`, then closes its listener so that jax's service can bind the same port.
"""

from __future__ import annotations

import socket
import time

from cost_models.errors import CpplanError

HELLO = "cpplan-join"
_LINE_BYTES = 256
_READ_S = 2.0  # a connection that says nothing in this long is a probe (or not cpplan): ignored
_POLL_S = 0.5


def _read_line(conn: socket.socket, timeout_s: float) -> str | None:
    """One line from `conn` within `timeout_s`, or None (closed, silent, or too long)."""
    conn.settimeout(max(timeout_s, 0.01))
    data = b""
    try:
        while b"\n" not in data and len(data) < _LINE_BYTES:
            chunk = conn.recv(_LINE_BYTES)
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    return data.split(b"\n", 1)[0].decode("utf-8", "replace").strip() if b"\n" in data else None


def _send(conn: socket.socket, text: str) -> None:
    try:
        conn.sendall(f"{text}\n".encode())
    except OSError:
        pass  # a peer that left hears nothing; it has its own deadline


def _listen(coordinator: str, port: int) -> socket.socket:
    try:
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, reuse_port=False)
        return socket.create_server(("", port))
    except OSError as err:
        raise CpplanError(
            f"--coordinator {coordinator!r}: process 0 cannot listen on port {port} ({err.strerror or err}); "
            f"give a free port to every process."
        ) from None


def gather(coordinator: str, port: int, num_processes: int, timeout_s: float) -> None:
    """Process 0: waits up to `timeout_s` for processes 1 .. `num_processes` - 1 to say they are there,
    then lets them go on.

    Raises:
        CpplanError: one line, when a peer never came, or came with another process count or an id taken.
    """
    listener = _listen(coordinator, port)
    peers: dict[int, socket.socket] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(peers) < num_processes - 1:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [i for i in range(1, num_processes) if i not in peers]
                for conn in peers.values():
                    _send(conn, f"stop process 0 waited {timeout_s:g} s and process(es) {missing} never came")
                raise CpplanError(
                    f"--coordinator {coordinator!r}: process(es) {', '.join(map(str, missing))} of {num_processes} "
                    f"never joined in {timeout_s:g} s (there: {', '.join(map(str, [0, *sorted(peers)]))}); start "
                    f"each with --process-id, the same --coordinator and --num-processes {num_processes}, or wait "
                    f"longer with --join-timeout."
                )
            listener.settimeout(min(remaining, _POLL_S * 4))
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            problem = _admit(conn, peers, num_processes, min(_READ_S, max(deadline - time.monotonic(), 0.01)))
            if problem:
                for other in peers.values():
                    _send(other, f"stop {problem}")
                raise CpplanError(f"--coordinator {coordinator!r}: {problem}.")
        for conn in peers.values():
            _send(conn, "go")
        for conn in peers.values():  # each peer closes first, so no closed connection holds the port
            _read_line(conn, _READ_S)
    finally:
        for conn in peers.values():
            conn.close()
        listener.close()


def _admit(conn: socket.socket, peers: dict[int, socket.socket], num_processes: int, timeout_s: float) -> str | None:
    """Reads a peer's hello into `peers`; a problem to stop the run with, or None (admitted, or a
    connection that is no peer's, closed)."""
    words = (_read_line(conn, timeout_s) or "").split()
    if len(words) != 3 or words[0] != HELLO or not (words[1].isdigit() and words[2].isdigit()):
        conn.close()  # a probe of the port, or not cpplan
        return None
    pid, count = int(words[1]), int(words[2])
    problem = None
    if count != num_processes:
        problem = (
            f"process {pid} was started with --num-processes {count}, process 0 with {num_processes}; give all the same"
        )
    elif pid in peers or not 1 <= pid < num_processes:
        problem = (
            f"two processes were started with --process-id {pid}; give each a distinct id from 0 to {num_processes - 1}"
        )
    if problem:
        _send(conn, f"stop {problem}")
        conn.close()
        return problem
    peers[pid] = conn
    return None


def reach(coordinator: str, host: str, port: int, timeout_s: float) -> socket.socket:
    """A connection to the coordinator's port, retried until something answers there, at most `timeout_s`.

    Raises:
        CpplanError: one line, when nothing answered.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socket.create_connection((host, port), timeout=min(5.0, timeout_s))
        except OSError as err:
            if time.monotonic() >= deadline:
                raise CpplanError(
                    f"--coordinator {coordinator!r}: nothing answered there for {timeout_s:g} s "
                    f"({err.strerror or err}); start process 0 (--process-id 0) with the same --coordinator, check "
                    f"that this host reaches its port, or wait longer with --join-timeout."
                ) from None
            time.sleep(_POLL_S)


def join(coordinator: str, host: str, port: int, process_id: int, num_processes: int, timeout_s: float) -> None:
    """A process other than 0: says it is there to process 0 and waits, up to `timeout_s`, for every
    process to be.

    Raises:
        CpplanError: one line, when process 0 never answered, stopped the run, or not every process came.
    """
    deadline = time.monotonic() + timeout_s
    conn = reach(coordinator, host, port, timeout_s)
    with conn:
        _send(conn, f"{HELLO} {process_id} {num_processes}")
        answer = _read_line(conn, deadline - time.monotonic())
    if answer == "go":
        return
    if answer and answer.startswith("stop "):
        raise CpplanError(f"--coordinator {coordinator!r}: {answer.removeprefix('stop ')}.")
    raise CpplanError(
        f"--coordinator {coordinator!r}: process 0 did not let this process go on within {timeout_s:g} s (not every "
        f"process came, or what answers there is not cpplan's process 0); start every process with the same "
        f"--coordinator and --num-processes {num_processes}, or wait longer with --join-timeout."
    )
