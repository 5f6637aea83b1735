"""What the raised scoped VMEM limit costs a compile that does not need it: the plans `cpplan validate`
runs first for MODEL at LENGTH on TOPOLOGY (splash blocks that fit the compiler's default), each step
compiled deviceless by libtpu at the default and at the chip's most, per compile
(`Lowered.compile(compiler_options=...)`, as `runtime.compile.plan_compiler_options` asks), with the
compile's wall time and the step's temporaries.

    python benchmarks/bench_vmem_compile_time.py [MODEL] [LENGTH] [TOPOLOGY]
    # default: benchmarks/tpu_v5e/llama-16l-0.5b.json 8k v5e:1x1; a line per compile
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PLANS = 2


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/tpu_v5e/llama-16l-0.5b.json"
    length = sys.argv[2] if len(sys.argv) > 2 else "8k"
    topology = sys.argv[3] if len(sys.argv) > 3 else "v5e:1x1"

    from cli.args import seq_lens
    from cost_models.models import get_model
    from cost_models.topology import get_topology
    from cost_models.units import GiB
    from validation.steptime import choose_plans

    plans = choose_plans(
        get_model(model), seq_lens(length), topology, max_plans=PLANS, top=PLANS, compute_dtype="bfloat16"
    )
    from runtime.compile import lowered_step, scoped_vmem_options

    most = get_topology(topology).chip.scoped_vmem_max_bytes // 1024
    print(f"{model} at {length} on {topology}; the chip's most scoped VMEM: {most} KiB")
    for ranked in plans:
        plan = ranked.plan
        name = f"{plan.strategy_label} {plan.remat.value}, blocks {plan.block_q}"
        if plan.scoped_vmem_limit_kib is not None:
            print(f"  {name}: its blocks need the raised limit; left out")
            continue
        lowered = lowered_step(plan)  # one lowering, compiled at each limit
        for limit in (None, most):
            options = None if limit is None else scoped_vmem_options(limit)
            begin = time.perf_counter()
            compiled = lowered.compile(compiler_options=options)
            seconds = time.perf_counter() - begin
            temp = compiled.memory_analysis().temp_size_in_bytes / GiB
            where = "default" if limit is None else f"{limit} KiB"
            print(f"  {name}, scoped VMEM {where}: compile {seconds:.1f} s, temporaries {temp:.3f} GiB", flush=True)


if __name__ == "__main__":
    main()
