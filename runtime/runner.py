"""Running a plan: compile its step, time a few steps, and report what was measured.

Step time is the median over the steps after the first; MFU counts model FLOPs exactly as the
cost model does (`cost_models.flops.model_flops_per_step`) against the chip's peak — on the CPU
host, against a peak measured here with a large matmul in the plan's compute dtype, since all
virtual devices share the host's cores.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from functools import lru_cache

from cost_models.errors import CpplanError
from cost_models.flops import model_flops_per_step
from planner.plan import Plan


@dataclass(frozen=True)
class RunReport:
    """Measured figures of a run.

    Attributes:
        plan: the plan run.
        compile_s: lowering + compiling the step.
        step_times_s: wall time of every step (the first includes nothing of compilation).
        losses: loss of every step.
        model_flops: model FLOPs of one step (the cost model's count).
        peak_flops: the peak the MFU is measured against (all devices together).
        hbm_bytes_per_device: arguments + outputs − aliased + temporaries from `memory_analysis()`
            (None where the backend does not report it).
    """

    plan: Plan
    compile_s: float
    step_times_s: tuple[float, ...]
    losses: tuple[float, ...]
    model_flops: float
    peak_flops: float
    hbm_bytes_per_device: int | None = None

    @property
    def step_time_s(self) -> float:
        """Median step time over the steps after the first (the only step if there is one)."""
        times = self.step_times_s[1:] or self.step_times_s
        return statistics.median(times)

    @property
    def best_step_s(self) -> float:
        """The fastest step after the first: the host's own speed, as calibration measures it
        (work sharing the machine only ever adds time)."""
        return min(self.step_times_s[1:] or self.step_times_s)

    @property
    def tokens_per_s(self) -> float:
        return self.plan.global_batch * self.plan.seq_len / self.step_time_s

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.step_time_s * self.peak_flops)

    def __str__(self) -> str:
        losses = " ".join(f"{x:.3f}" for x in self.losses)
        mem = "" if self.hbm_bytes_per_device is None else f", {self.hbm_bytes_per_device / 2**20:.1f} MiB per device"
        return (f"compiled in {self.compile_s:.1f} s; step {self.step_time_s * 1e3:.1f} ms (median of "
                f"{max(len(self.step_times_s) - 1, 1)}), {self.tokens_per_s:,.0f} tokens/s, MFU {self.mfu:.1%} of "
                f"{self.peak_flops / 1e9:.1f} GFLOP/s{mem}; loss {losses}")


@lru_cache(maxsize=4)
def host_peak_flops(dtype: str = "float32", *, size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of a `size`³ matmul on one CPU device: the host's measured peak."""
    import jax
    import jax.numpy as jnp

    device = jax.devices("cpu")[0]
    a = jax.device_put(jnp.ones((size, size), dtype), device)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        mm(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best


def peak_flops(plan: Plan) -> float:
    """The peak a plan's MFU is measured against: chips' peak on TPU, the measured host on CPU."""
    topo = plan.topology_spec
    if topo.chip.kind == "cpu":
        return host_peak_flops(plan.compute_dtype)
    return topo.peak_flops_per_device * topo.num_devices


def run(plan: Plan, *, steps: int, data: "str | os.PathLike | None" = None, seed: int = 0,
        devices=None) -> RunReport:
    """Runs `steps` training steps of a plan on the devices present.

    Args:
        plan: the plan; its topology must be the devices present (`cpu:8` with 8 virtual devices).
        steps: number of steps (at least 1; the median skips the first).
        data: a text file read as byte tokens, or None for synthetic tokens.
        seed: parameter and data seed.
        devices: the devices to run on (default: all of jax's devices), e.g. one device for a
            `cpu:1` reference run on a host with 8 virtual devices.
    Returns:
        A `RunReport`.
    Raises:
        CpplanError: bad step count, devices that do not match the plan, or a plan that cannot run.
    """
    import jax

    from runtime.data import synthetic_batches, text_batches, text_tokens
    from runtime.mesh import build_mesh
    from runtime.train import Trainer

    if steps < 1:
        raise CpplanError(f"steps={steps}: run at least 1 step.")
    mesh = build_mesh(plan, devices)
    trainer = Trainer(plan, mesh)
    shape = dict(batch=plan.global_batch, seq_len=plan.seq_len, seed=seed)
    if data is None:
        batches = synthetic_batches(vocab=plan.model.vocab, **shape)
    else:
        batches = text_batches(text_tokens(data, vocab=plan.model.vocab), **shape)
    params, opt_state = trainer.init(seed)
    start = time.perf_counter()
    compiled = trainer.train_step.lower(*trainer.abstract_state()).compile()
    compile_s = time.perf_counter() - start
    hbm = None
    mem = compiled.memory_analysis()
    if mem is not None:
        hbm = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
               + mem.temp_size_in_bytes)
    times, losses = [], []
    for _ in range(steps):
        batch = trainer.prepare_batch(next(batches))
        jax.block_until_ready(batch)
        begin = time.perf_counter()
        params, opt_state, loss = compiled(params, opt_state, *batch)
        loss = float(loss)
        times.append(time.perf_counter() - begin)
        losses.append(loss)
    return RunReport(plan, compile_s, tuple(times), tuple(losses),
                     model_flops_per_step(plan.model, plan.seq_len, plan.global_batch), peak_flops(plan), hbm)
