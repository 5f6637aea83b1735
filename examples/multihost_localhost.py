"""Run one plan on several processes of this host, as the hosts of a TPU pod run it.

Starts `cpplan run` once per process with the same --coordinator, each with its own
--process-id and its share of the virtual CPU devices; jax.distributed joins them (gloo
collectives) into one mesh of all the devices. Process 0 prints and writes the run directory.

    python examples/multihost_localhost.py --processes 2 --devices 8 --steps 4
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=8, help="devices in all (each process gets its share)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", default="1k")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--run-dir", help="default: a new temporary directory")
    args = parser.parse_args(argv)
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="cpplan-multihost-")
    coordinator = f"localhost:{free_port()}"
    # each process asks for its own share of the devices: no XLA_FLAGS from here
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    command = [
        sys.executable,
        "-m",
        "cli",
        "run",
        "--model",
        args.model,
        "--seq-len",
        args.seq_len,
        "--topology",
        f"cpu:{args.devices}",
        "--steps",
        str(args.steps),
        "--run-dir",
        run_dir,
        "--coordinator",
        coordinator,
        "--num-processes",
        str(args.processes),
    ]
    print(" ".join(command[1:]) + " --process-id I", flush=True)
    others = [
        subprocess.Popen(
            [*command, "--process-id", str(i)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for i in range(1, args.processes)
    ]
    leader = subprocess.run([*command, "--process-id", "0"], env=env)
    status = leader.returncode
    for proc in others:
        _, stderr = proc.communicate()
        if proc.returncode:
            print(f"process {others.index(proc) + 1} failed:\n{stderr[-2000:]}", file=sys.stderr)
            status = status or proc.returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
