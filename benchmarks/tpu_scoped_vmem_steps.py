"""What the raised scoped VMEM limit does to a step whose splash blocks do not need it, on the chip this runs
on: the best plans `cpplan validate` chooses for MODEL at LENGTH (those the compiler's default suffices
for), each lowered once and compiled twice, at the default and with the limit raised to the chip row's most;
their steps then run alternately on the same state (default, raised, default, ...), so that a drift of the
host or the chip lands on both. Then the chip row's calibration kernels (the model's matmuls, the memory
pass) compiled and timed at both limits, and a profile of two steps at each limit.

    python benchmarks/tpu_scoped_vmem_steps.py MODEL LENGTH OUT [TOPOLOGY]   # on a TPU VM

Writes OUT/scoped_vmem_steps.jsonl as it goes (one JSON object per timing) and OUT/profile-<limit>-<plan>/.
"""

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's runtime, uninstalled

PLANS = 2
ROUNDS = 8  # steps of each program, alternating, after one of each to warm up
PROFILED_STEPS = 2


def main(model: str, length: str, out: Path, topology: str = "v5e:1x1") -> None:
    import jax
    import numpy as np

    from cost_models.topology import get_topology
    from planner.options import parse_seq_len
    from runtime import measure
    from runtime.compile import scoped_vmem_options
    from runtime.data import synthetic_batches
    from runtime.mesh import build_mesh
    from runtime.optimizer import AdamW
    from runtime.train import Trainer
    from validation.kernel_calibration import MEMORY_VALUES, model_matmuls
    from validation.report import plan_label
    from validation.steptime import choose_plans

    out.mkdir(parents=True, exist_ok=True)
    log = (out / "scoped_vmem_steps.jsonl").open("w")

    def write(**record):
        log.write(json.dumps(record) + "\n")
        log.flush()
        print(json.dumps(record), flush=True)

    topo = get_topology(topology)
    raised_kib = topo.chip.scoped_vmem_max_bytes // 1024
    limits = {"default": None, "raised": scoped_vmem_options(raised_kib)}
    seq_len = parse_seq_len(length)
    chosen = choose_plans(model, [seq_len], topology, max_plans=PLANS, top=PLANS, compute_dtype="bfloat16")
    for number, ranked in enumerate(chosen):
        plan = ranked.plan
        if plan.scoped_vmem_limit_kib is not None:
            write(plan=plan_label(plan), skipped=f"its blocks need {plan.scoped_vmem_limit_kib} KiB")
            continue
        trainer = Trainer(plan, build_mesh(plan), optimizer=AdamW(steps=ROUNDS + 2))
        lowered = trainer.train_step.lower(*trainer.abstract_state())
        compiled = {}
        for name, options in limits.items():
            begin = time.perf_counter()
            compiled[name] = lowered.compile(options)
            cost = compiled[name].cost_analysis() or {}
            cost = cost[0] if isinstance(cost, list) else cost
            write(
                plan=plan_label(plan),
                limit=name,
                compile_s=round(time.perf_counter() - begin, 2),
                bytes_accessed=cost.get("bytes accessed"),
                flops=cost.get("flops"),
                temp_bytes=compiled[name].memory_analysis().temp_size_in_bytes,
            )
        params, opt_state = trainer.init(0)
        rows = next(synthetic_batches(vocab=plan.model.vocab, batch=plan.global_batch, seq_len=plan.seq_len))
        inputs = trainer.prepare_batch(np.asarray(rows))
        times = {name: [] for name in limits}
        for round_ in range(ROUNDS + 1):
            for name in limits:
                begin = time.perf_counter()
                params, opt_state, loss = compiled[name](params, opt_state, *inputs)
                jax.block_until_ready(loss)
                if round_:  # the first of each is a warm-up
                    times[name].append(time.perf_counter() - begin)
        for name, seconds in times.items():
            write(
                plan=plan_label(plan),
                seq_len=plan.seq_len,
                limit=name,
                step_best_s=min(seconds),
                step_median_s=statistics.median(seconds),
                step_times_s=seconds,
                predicted_s=ranked.estimate.step_time_s,
            )
        for name in limits:
            trace = out / f"profile-{name}-{number}"
            jax.profiler.start_trace(str(trace))
            for _ in range(PROFILED_STEPS):
                params, opt_state, loss = compiled[name](params, opt_state, *inputs)
            jax.block_until_ready(loss)
            jax.profiler.stop_trace()
        del params, opt_state, compiled, lowered, trainer

    # the calibration's kernels, each compiled at both limits
    mesh = measure.device_mesh(topo)
    dims = chosen[0].plan.model
    shapes = model_matmuls(dims.hidden, dims.num_heads, dims.num_kv_heads, dims.head_dim, dims.intermediate)
    kernels = {f"matmul {m}x{k}x{n}": ((m, k), (1, k, n)) for m, k, n in shapes}
    for label, (a, b) in kernels.items():
        mapped, arrays = measure.per_device_call(mesh, lambda x, y: x @ y[0], (a, "bfloat16"), (b, "bfloat16"))
        for name, options in limits.items():
            program = mapped.lower(*arrays).compile(options)
            write(kernel=label, limit=name, best_s=measure.best_time(program, *arrays, repeats=10))
    mapped, arrays = measure.per_device_call(mesh, lambda x: x * 1.5 + 0.5, ((MEMORY_VALUES,), "bfloat16"))
    for name, options in limits.items():
        program = mapped.lower(*arrays).compile(options)
        write(
            kernel=f"memory pass of {MEMORY_VALUES} values",
            limit=name,
            best_s=measure.best_time(program, *arrays, repeats=10),
        )
    log.close()


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), *sys.argv[4:])
