"""`cpplan run` and `cpplan compile`: plan, then run on this host or compile deviceless for TPU.

`planner/cli.py` calls `add_subcommands(subparsers)`; jax is imported only inside the handlers,
so `cpplan explain` never loads it. For a `cpu:N` topology the handler asks for N virtual CPU
devices before jax starts.
"""
from __future__ import annotations

import argparse
import os

from cost_models.errors import CpplanError
from cost_models.topology import get_topology

GIB = 1024 ** 3


def add_subcommands(subparsers) -> None:
    """Registers `run` and `compile` on an argparse subparsers object (the planner's CLI)."""
    from planner.cli import add_search_options

    p = subparsers.add_parser("run", help="plan, then run a few training steps on this host (cpu:N)")
    add_search_options(p)
    p.add_argument("--steps", type=int, default=5, help="training steps (the median skips the first)")
    p.add_argument("--data", help="a text file to train on (byte tokens); default synthetic tokens")
    p.set_defaults(func=cmd_run)
    p = subparsers.add_parser("compile", help="plan, then compile the step deviceless for a TPU slice")
    add_search_options(p)
    p.set_defaults(func=cmd_compile)


def _plan(args):
    from planner import api
    from planner.cli import search_options

    return api.plan(args.model, args.seq_len, args.topology, **search_options(args))


def _use_virtual_cpus(topology: str) -> None:
    """Asks XLA for the topology's virtual CPU devices; must run before jax is imported."""
    topo = get_topology(topology)
    if topo.chip.kind != "cpu":
        raise CpplanError(f"`cpplan run` runs on this host's CPU devices; {topo.name} is a TPU slice. "
                          f"Use `cpplan compile` to compile for it deviceless, or plan for cpu:8.")
    flag = f"--xla_force_host_platform_device_count={topo.num_devices}"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _estimate(plan):
    from cost_models.estimate import estimate

    return estimate(plan)


def cmd_run(args: argparse.Namespace) -> int:
    """Plans, runs, and prints measured figures next to the predicted ones."""
    _use_virtual_cpus(args.topology)
    plan = _plan(args)
    from runtime.runner import run

    report = run(plan, steps=args.steps, data=args.data)
    predicted = _estimate(plan)
    print(plan.to_json())
    print(f"measured:  {report}")
    hbm = "n/a" if report.hbm_bytes_per_device is None else f"{report.hbm_bytes_per_device / 2**20:.1f} MiB"
    print(f"{'':10}{'predicted':>14}{'measured':>14}")
    print(f"{'step':10}{predicted.step_time_s * 1e3:>12.1f}ms{report.step_time_s * 1e3:>12.1f}ms")
    print(f"{'MFU':10}{predicted.mfu:>14.1%}{report.mfu:>14.1%}")
    print(f"{'HBM/dev':10}{predicted.hbm_bytes_per_device / 2**20:>11.1f}MiB{hbm:>14}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    """Plans, compiles deviceless, and prints memory against the prediction."""
    plan = _plan(args)
    from runtime.compile import compile_for

    report = compile_for(plan)
    predicted = _estimate(plan)
    print(plan.to_json())
    print(f"compiled:  {report}")
    print(f"predicted: {predicted.hbm_bytes_per_device / GIB:.2f} GiB per device "
          f"({'fits' if predicted.fits else 'does not fit'}); compiler: {report.required_gib:.2f} GiB "
          f"({'fits' if report.fits else 'does not fit'})")
    return 0 if report.fits else 1
